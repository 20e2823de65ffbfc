package worker

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Deps are what a worker runs on, already opened. The Node uses them and
// closes none: whoever opened them closes them after Node.Close.
type Deps struct {
	Store *store.Store
	// Chunks is the store's compressed host tier (-host-compressed), nil
	// for none; Host the decompressed one (-host-cache), nil for none.
	Chunks *store.ChunkCache
	Host   *HostCache
	// Device holds and runs the experts within its budget.
	Device Device
	// Wire is the worker's identity (its certificates) and transport
	// settings; New adds what a worker tells its peers.
	Wire *wire.Config
	Log  zerolog.Logger
	// Held, if set, says which experts the store's directory holds now (a
	// worker filling its store: fetch.Backfill.HoldsExpert): the host
	// cache is preloaded with those alone, none fetched for it.
	Held func(layer, expert int) bool
	// Fetched, if set, says the bytes of the store fetched from other
	// nodes so far (fetch.Backfill.Fetched), for the worker's counters;
	// Serves, if set, is what the worker serves nodes fetching their
	// share (fetch.Backfill.Local: what it holds, never fetched for
	// them); nil: its Store.
	Fetched func() int64
	Serves  fetch.Holder
	// Place, if set, is told the worker's place in the main node's layout
	// (wire.Place: with every worker's address and the nodes relaying
	// the store, or none) each time the main node connects, and returns
	// a channel closed once the worker holds its share (nil: it does
	// now), which the worker then tells the main node (wire.ShareIn).
	// Without Place a worker holds its share.
	Place func(wire.Place) <-chan struct{}
}

// Options say how a worker uses its deps.
type Options struct {
	// LoadBytesSec is the device's load bandwidth (-load-bw; 0:
	// unpaced), told to the main node's placer with the device's budget.
	LoadBytesSec float64
	// HostPreload fills the host cache before the worker listens.
	HostPreload bool
	// ResidentIndex/ResidentOf, when ResidentOf > 0, make this worker
	// ResidentIndex of ResidentOf in a resident swarm: it pins the
	// experts it owns before it listens and holds them for good.
	ResidentIndex, ResidentOf int
	// Quiet draws no progress bars (a worker in a test's or a
	// benchmark's process: their output is the caller's).
	Quiet bool
}

// Node is a worker, built the one way both a process (`odmoe run -role
// worker`, Run) and an in-process swarm (internal/inproc) build it: an
// Engine over its deps, introduced to its peers by its model's identity,
// its device budget and its load bandwidth, and refusing a main node or
// shadow of another model.
type Node struct {
	eng    *Engine
	wire   wire.Config
	health *storeHealth
	log    zerolog.Logger
	// store is what the worker serves a node fetching its share from
	// (fetch.Serve); fetched says what it fetched itself (Deps.Fetched)
	store   fetch.Holder
	streams *wire.StreamListener // where it serves the store (Listen)
	fetched func() int64
	place   func(wire.Place) <-chan struct{}
}

// New checks that d's device can run every expert of d's store, builds
// the engine over them, fills the host cache and pins the resident
// experts as o says (progress bars on the console), and returns the
// worker, not yet listening.
func New(ctx context.Context, d Deps, o Options) (*Node, error) {
	st := d.Store
	if len(st.Layers()) == 0 || st.Experts() == 0 {
		return nil, fmt.Errorf("worker: the store holds no experts")
	}
	hidden, _, err := st.ExpertShape(st.Layers()[0], 0)
	if err != nil {
		return nil, err
	}
	budget, _, _ := d.Device.Memory()
	if need, err := smallestBudget(st, d.Device); err != nil {
		return nil, err
	} else if budget < need {
		return nil, fmt.Errorf("worker: -device-mem %s cannot hold the store's largest expert and its compute buffers (%s): give at least %s",
			progress.Bytes(budget), progress.Bytes(need), progress.Bytes(need))
	}
	if o.HostPreload && d.Host == nil {
		return nil, fmt.Errorf("worker: preloading the host cache needs a host cache")
	}
	eng := NewEngine(st, hidden, d.Device, d.Log)
	eng.Host, eng.Chunks = d.Host, d.Chunks
	if d.Host != nil && d.Chunks != nil {
		eng.chooseTiers(st, o.LoadBytesSec) // both host tiers: each expert earns its decompressed copy
	}
	if o.HostPreload {
		err = preloadHost(ctx, eng, st, d.Held, d.Host.Budget(), o.Quiet, d.Log)
	}
	if err == nil && o.ResidentOf > 0 {
		err = pinResident(ctx, eng, st, o.ResidentIndex, o.ResidentOf, o.Quiet, d.Log)
		eng.PinnedOnly = true
	}
	if err != nil {
		eng.Close()
		return nil, err
	}
	n := &Node{eng: eng, wire: *d.Wire, health: newStoreHealth(st.Check, d.Log), log: d.Log, store: d.Serves, fetched: d.Fetched, place: d.Place}
	if n.store == nil {
		n.store = st
	}
	eng.OnLoadFailed = n.health.loadFailed
	n.health.back = eng.forgetQuarantine
	// (a worker fetching its share of the store comes over a stream:
	// Listen, fetch.Serve)
	n.wire.PeerRoles = []wire.Role{wire.RoleMain, wire.RoleShadow}
	n.wire.Hello.DeviceMemBytes, n.wire.Hello.LoadBytesSec = budget, o.LoadBytesSec
	n.wire.Hello.Device = d.Device.String()
	// a main node or shadow of another model is refused here too (they
	// refuse this worker from their side as well)
	n.wire.Hello.Model = st.Identity().String()
	sameModel := wire.SameModel(false)
	n.wire.CheckHello = func(self, peer *wire.Hello) error {
		if err := n.health.refusal(); err != nil { // a store gone unreadable
			return err
		}
		return sameModel(self, peer)
	}
	return n, nil
}

// Listen listens on addr for the main node and the shadow (UDP, QUIC),
// as this worker, and on the same port over TCP for workers fetching
// their share of the store from it (wire.ListenStream); port 0 picks one
// free for both. Serve serves both; the stream listener closes when
// Serve returns (or ctx ends).
func (n *Node) Listen(ctx context.Context, addr string) (*wire.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("worker: -listen %q: %w", addr, err)
	}
	fetching := n.wire
	fetching.PeerRoles = []wire.Role{wire.RoleWorker}
	for attempt := 0; ; attempt++ {
		ln, err := wire.Listen(ctx, addr, &n.wire)
		if err != nil {
			return nil, err
		}
		_, got, _ := net.SplitHostPort(ln.Addr().String())
		sl, err := wire.ListenStream(ctx, net.JoinHostPort(host, got), &fetching)
		if err == nil {
			n.streams = sl
			return ln, nil
		}
		ln.Close()
		if port != "0" || attempt == 8 { // a port picked for UDP may be taken over TCP: pick again
			return nil, fmt.Errorf("worker: TCP port %s, where workers fetch from this one: %w", got, err)
		}
	}
}

// Serve serves the main node and the shadow on ln until ctx ends, out of
// service while its store cannot be read (storeHealth), and the workers
// fetching from it on Listen's stream listener.
func (n *Node) Serve(ctx context.Context, ln *wire.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	var checks sync.WaitGroup
	checks.Go(func() { n.health.run(ctx) })
	defer checks.Wait()
	defer cancel()
	s := NewServer(n.eng, n.log)
	s.health, s.store, s.fetched, s.place = n.health, n.store, n.fetched, n.place
	if n.streams != nil {
		defer n.streams.Close()
		checks.Go(func() { s.ServeFetching(ctx, n.streams) })
	}
	return s.Serve(ctx, ln)
}

// Engine is the worker's engine.
func (n *Node) Engine() *Engine { return n.eng }

// Close waits for the loads in flight and frees every expert; nothing
// runs on the device or from the host cache after it.
func (n *Node) Close() { n.eng.Close() }
