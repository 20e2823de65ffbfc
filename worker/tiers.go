package worker

import (
	"container/list"
	"sync"
	"time"

	"github.com/odmoe/odmoe/store"
)

// hostTiers chooses, per expert, which host tier a load leaves it in when
// a worker has both: decompressed in the host cache (a later load is only
// the transfer) or only compressed (the store's chunks, kept by
// -host-compressed: a later load decompresses again, but the same RAM
// holds half as many experts again). ZipMoE's trade: an expert earns a
// decompressed copy by its reuse, and only where decompressing is a
// sizeable part of a load.
//
// Reuse: an expert is admitted on its second load within the last
// ghostLen loads that were not admitted (a ghost list, as 2Q and ARC
// keep), so one-off loads (a prompt's experts, a wrong prediction) never
// push hot experts out of the decompressed tier. Cost: decompression is
// measured on every load that decompressed; when it takes less than
// cheapDecompress of the transfer of the same bytes, a decompressed copy
// saves too little to be worth 1.5x the memory, and nothing is admitted.
type hostTiers struct {
	linkBytesSec float64 // the transfer rate; 0: unpaced (transfers cost nothing)
	// forget, if set, drops an expert's compressed copy once it has a
	// decompressed one: each expert lives in one host tier
	forget func(layer, expert int)

	mu            sync.Mutex
	ghost         *list.List // of slotKey, most recent at the front
	inGhost       map[slotKey]*list.Element
	decompressSec float64 // measured seconds per byte, running mean; 0 until measured
}

const (
	// ghostLen bounds the ghost list: loads remembered for admission.
	ghostLen = 256
	// cheapDecompress: below this fraction of a transfer's time,
	// decompressing again is cheap enough to keep only compressed copies.
	cheapDecompress = 0.25
)

// chooseTiers makes e choose per expert between its host cache and st's
// compressed tier (both set), an expert admitted to the first leaving the
// second.
func (e *Engine) chooseTiers(st *store.Store, linkBytesSec float64) {
	e.tiers = newHostTiers(linkBytesSec)
	e.tiers.forget = func(layer, expert int) { e.Chunks.DropExpert(st, layer, expert) }
}

func newHostTiers(linkBytesSec float64) *hostTiers {
	return &hostTiers{linkBytesSec: linkBytesSec, ghost: list.New(), inGhost: map[slotKey]*list.Element{}}
}

// admit reports whether a load of k (n bytes) should leave a decompressed
// copy in the host cache, and remembers the load.
func (t *hostTiers) admit(k slotKey, n int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.decompressSec > 0 && t.linkBytesSec > 0 && t.decompressSec*float64(n) < cheapDecompress*float64(n)/t.linkBytesSec {
		return false
	}
	if el, ok := t.inGhost[k]; ok {
		t.ghost.Remove(el)
		delete(t.inGhost, k)
		return true
	}
	t.inGhost[k] = t.ghost.PushFront(k)
	if t.ghost.Len() > ghostLen {
		old := t.ghost.Back()
		t.ghost.Remove(old)
		delete(t.inGhost, old.Value.(slotKey))
	}
	return false
}

// admitted says k now has a decompressed host copy (a nil t: nothing).
func (t *hostTiers) admitted(k slotKey) {
	if t != nil && t.forget != nil {
		t.forget(k.layer, k.expert)
	}
}

// decompressed records that n bytes took d to read and decompress (a nil
// t records nothing).
func (t *hostTiers) decompressed(n int, d time.Duration) {
	if t == nil || n <= 0 || d <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decompressSec = runningMean(t.decompressSec, d.Seconds()/float64(n))
}

// runningMean folds x into a running mean (the first x is the mean).
func runningMean(mean, x float64) float64 {
	if mean == 0 {
		return x
	}
	return mean + 0.1*(x-mean)
}
