package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// storeHealth is whether the worker's store can be read as a whole. A
// load that fails makes the worker check the whole store (store.Check):
// an expert whose bytes fail their checksum is the engine's to quarantine,
// but a chunk file cut short, overwritten or gone under the worker makes
// every later load fail, so the worker goes out of service: it closes its
// peers' connections saying why and refuses new ones with that reason
// (the main node and the shadow count it lost and plan without it, and
// keep dialing it), and checks again every recheck until the store reads
// again (a good copy put back), when it accepts them again.
type storeHealth struct {
	check func() error // the store's Check
	// back, if set, is called when the store reads again (the engine
	// forgets the experts it quarantined: they are read again, and
	// quarantined again if their bytes still fail)
	back    func()
	log     zerolog.Logger
	recheck time.Duration
	ill     chan struct{} // a signal to run: the store failed its check

	mu     sync.Mutex
	reason error // nil while the store reads
	peers  map[*wire.Peer]struct{}
}

func newStoreHealth(check func() error, log zerolog.Logger) *storeHealth {
	return &storeHealth{check: check, log: log, recheck: time.Second, ill: make(chan struct{}, 1), peers: map[*wire.Peer]struct{}{}}
}

// loadFailed checks the whole store after a load failed with err; a store
// that fails its check takes the worker out of service.
func (h *storeHealth) loadFailed(err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOverBudget) {
		return
	}
	h.mu.Lock()
	if h.reason != nil {
		h.mu.Unlock()
		return
	}
	cerr := h.check()
	if cerr == nil {
		h.mu.Unlock()
		return // one expert's fault: the engine quarantines it
	}
	h.reason = fmt.Errorf("this worker is out of service until its store reads again: %w", cerr)
	peers := make([]*wire.Peer, 0, len(h.peers))
	for p := range h.peers {
		peers = append(peers, p)
	}
	h.mu.Unlock()
	h.log.Error().Err(cerr).Msg("store unreadable: this worker closes its connections and refuses new ones until the store reads again")
	for _, p := range peers {
		p.CloseFor(h.reason.Error()) // its ServePeer ends and forgets it
	}
	select {
	case h.ill <- struct{}{}:
	default:
	}
}

// refusal is why a peer is refused now, nil while the store reads.
func (h *storeHealth) refusal() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

// serving registers p for as long as it is served; false (p is refused,
// closed saying why) while the worker is out of service.
func (h *storeHealth) serving(p *wire.Peer) bool {
	h.mu.Lock()
	reason := h.reason
	if reason == nil {
		h.peers[p] = struct{}{}
	}
	h.mu.Unlock()
	if reason != nil {
		p.CloseFor(reason.Error())
	}
	return reason == nil
}

func (h *storeHealth) done(p *wire.Peer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.peers, p)
}

// run checks the store every recheck while it is out of service, until
// ctx ends.
func (h *storeHealth) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.ill:
		}
		t := time.NewTicker(h.recheck)
		for {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			h.mu.Lock() // checked and cleared together: a failure meanwhile is not lost
			ok := h.check() == nil
			if ok {
				if h.back != nil {
					h.back() // before any peer is accepted again
				}
				h.reason = nil
			}
			h.mu.Unlock()
			if ok {
				h.log.Info().Msg("store reads again: this worker accepts the main node and the shadow again")
				break
			}
		}
		t.Stop()
	}
}
