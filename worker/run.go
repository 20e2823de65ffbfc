package worker

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Config is what a worker runs on (`odmoe run -role worker`).
type Config struct {
	Listen         string // UDP address
	Store          string // compressed expert store directory
	DeviceMemBytes int64  // the device memory budget
	Device         string // "cpu" (or ""), or "cuda:N" in a build with the cuda tag: OpenDevice
	LoadBytesSec   float64
	HostCacheBytes int64 // decompressed experts kept in host memory; 0: none
	HostPreload    bool  // fill the host cache at start
	// HostCompressedBytes keeps the store's chunks (compressed experts)
	// in host memory, up to this many bytes: the compressed tier; 0: none.
	HostCompressedBytes int64
	// ResidentIndex/ResidentOf, when ResidentOf > 0, make this worker
	// ResidentIndex of ResidentOf in a resident swarm: it pins the experts
	// it owns at start and holds them for good.
	ResidentIndex, ResidentOf int
	// FetchFrom, if set, are nodes holding the store (workers, or the
	// main node serving it): a chunk the Store directory lacks (a share
	// made by odmoe fetch, or an empty directory) comes from them when
	// first needed, checked, and is kept there (fetch.Backfill); and once
	// the main node has told the worker its place, the rest of its share
	// comes in the background, at FetchRate bytes a second (0: no cap).
	FetchFrom []string
	FetchRate float64
	Wire      *wire.Config // this node's identity and transport settings
	Log       zerolog.Logger
}

// Run opens the store, the device and the host caches as configured,
// builds the worker on them (New: the budget check, the host cache
// filled, resident experts pinned) and serves the main node and the
// shadow until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	st, chunks, backfill, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStore()
	dev, err := OpenDevice(cfg.Device, cfg.DeviceMemBytes, NewLink(cfg.LoadBytesSec))
	if err != nil {
		return err
	}
	defer dev.Close()
	if dev.String() != "cpu" {
		for _, d := range st.Report().DTypes {
			if d != kernels.F32 && d != kernels.F16 && d != kernels.BF16 && d != kernels.MXFP4 {
				return fmt.Errorf("worker: the store's experts are %v, which the %s device does not compute (F32, F16, BF16, MXFP4); run this worker with -device cpu", d, dev)
			}
		}
	}
	var host *HostCache
	if cfg.HostCacheBytes > 0 {
		if host, err = NewHostCache(cfg.HostCacheBytes); err != nil {
			return err
		}
		defer host.Close()
	}
	deps := Deps{Store: st, Chunks: chunks, Host: host, Device: dev, Wire: cfg.Wire, Log: log}
	if backfill != nil {
		deps.Fetched, deps.Serves, deps.Held = backfill.Fetched, backfill.Local(), backfill.HoldsExpert
		var once sync.Once // the share of the first place told: a layout does not change under a running swarm
		in := make(chan struct{})
		deps.Place = func(p wire.Place) <-chan struct{} {
			once.Do(func() {
				go func() {
					defer close(in) // (a fill that failed too: what is missing comes as it is read)
					fillShare(ctx, backfill, p, cfg, log)
				}()
			})
			return in
		}
	}
	n, err := New(ctx, deps,
		Options{LoadBytesSec: cfg.LoadBytesSec, HostPreload: cfg.HostPreload, ResidentIndex: cfg.ResidentIndex, ResidentOf: cfg.ResidentOf})
	if err != nil {
		return fmt.Errorf("%w (store %s)", err, cfg.Store)
	}
	defer n.Close() // first: nothing runs on the device or from the host cache when they close
	ln, err := n.Listen(ctx, cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Str("store", cfg.Store).Str("device", dev.String()).Str("device_mem", progress.Bytes(cfg.DeviceMemBytes)).
		Str("load_bw", progress.Bytes(int64(cfg.LoadBytesSec))+"/s").Str("host_cache", progress.Bytes(cfg.HostCacheBytes)).
		Str("host_compressed", progress.Bytes(cfg.HostCompressedBytes)).Msg("worker ready")
	return n.Serve(ctx, ln)
}

// openStore opens cfg's store with, when cfg.HostCompressedBytes > 0, a
// compressed tier of that many bytes in an arena off the Go heap
// (-host-compressed), and, with cfg.FetchFrom, what the directory lacks
// fetched from those nodes as it is first read; close closes them all.
func openStore(ctx context.Context, cfg Config, log zerolog.Logger) (st *store.Store, chunks *store.ChunkCache, b *fetch.Backfill, close func(), err error) {
	var mem *ArenaChunks
	if cfg.HostCompressedBytes > 0 {
		if mem, err = NewArenaChunks(cfg.HostCompressedBytes); err != nil {
			return nil, nil, nil, nil, err
		}
		chunks = store.NewChunkCache(cfg.HostCompressedBytes, mem)
	}
	closeMore := func() {}
	if len(cfg.FetchFrom) > 0 {
		dial := *cfg.Wire
		dial.PeerRoles = []wire.Role{wire.RoleWorker, wire.RoleMain} // a source is a worker holding the store, or the main node serving it
		var sources []fetch.Source
		var dialed []*fetch.Dialed
		for _, addr := range cfg.FetchFrom {
			d := fetch.Dial(addr, &dial)
			sources, dialed = append(sources, d), append(dialed, d)
		}
		st, b, err = fetch.OpenBackfill(ctx, cfg.Store, sources, store.Options{Chunks: chunks}, log)
		if err != nil {
			for _, d := range dialed {
				d.Close()
			}
		} else {
			closeMore = func() {
				log.Info().Str("fetched", progress.Bytes(b.Fetched())).Msg("worker: chunks fetched from -fetch-from while running")
				b.Close()
				for _, d := range dialed {
					d.Close()
				}
			}
		}
	} else {
		st, err = store.Open(cfg.Store, store.Options{Chunks: chunks})
	}
	if err != nil {
		if mem != nil {
			mem.Close()
		}
		return nil, nil, nil, nil, err
	}
	return st, chunks, b, func() {
		st.Close()
		closeMore()
		if mem != nil {
			mem.Close() // last: nothing reads the chunks any more
		}
	}, nil
}

// fillShare fetches into b's directory, in the background, the rest of
// the share of worker p.Worker of p.Workers in groups of p.Group (what
// the layout has it run: sched.Layout.Holds), at cfg.FetchRate bytes a
// second, and says what it did. Each chunk has one owner among the
// workers (fillOwner), which fetches it from the nodes relaying the store
// as they fill theirs (p.Holders: the shadow), then from -fetch-from; the
// others holding it ask the owner first (p.Peers: every worker's
// address, or none), each waiting for what the other's fill will bring.
// Every worker walks its share in the store's order, as the shadow fills
// it, so a chunk leaves the main node about once for the whole swarm,
// and the shadow about once too.
func fillShare(ctx context.Context, b *fetch.Backfill, p wire.Place, cfg Config, log zerolog.Logger) {
	w, workers, group := p.Worker, p.Workers, p.Group
	l, err := sched.NewLayout(workers, group)
	if err != nil {
		log.Warn().Err(err).Msg("worker: a place outside any layout: its share is not filled")
		return
	}
	opt := fetch.Options{Rate: cfg.FetchRate, Spread: true, Parallel: 2, Log: log}
	dial := *cfg.Wire
	// a node that does not answer soon is passed over (redialled a while
	// later), and one that stalls costs a chunk's timeout: the main node
	// has every chunk
	dial.DialAttempts, dial.DialTimeout = 1, peerDialTimeout
	var holders []fetch.Source
	if len(p.Holders) > 0 {
		hd := dial
		hd.PeerRoles = []wire.Role{wire.RoleShadow}
		for _, a := range p.Holders {
			d := fetch.Dial(a, &hd)
			defer d.Close()
			holders = append(holders, fetch.Timed(d, peerChunkTimeout))
		}
	}
	var peers []fetch.Source // by position in the layout; nil: this one, or none
	if len(p.Peers) == workers && workers > 1 {
		pd := dial
		pd.PeerRoles = []wire.Role{wire.RoleWorker}
		peers = make([]fetch.Source, workers)
		for q := range workers {
			if q != w {
				d := fetch.Dial(p.Peers[q], &pd) // (dialled when first asked)
				defer d.Close()
				peers[q] = fetch.Timed(d, peerChunkTimeout)
			}
		}
	}
	if peers != nil || len(holders) > 0 {
		opt.AheadBytes = fetch.HeldAheadBytes // requests are held until the owner or holder has them
		opt.SourcesFor = func(layer, expert, k int) []fetch.Source {
			if o := fillOwner(l, layer, expert, k); o != w && peers != nil {
				return append([]fetch.Source{peers[o]}, holders...)
			}
			return holders
		}
	}
	t0 := time.Now()
	log.Info().Int("worker", w).Int("workers", workers).Int("group", group).Bool("from peers", peers != nil).Strs("holders", p.Holders).
		Msg("worker: filling its share of the store in the background")
	opt.Progress = fillProgress(t0, fillLogEvery, log)
	res, err := b.Fill(ctx, func(layer, expert int) bool { return l.Holds(w, layer, expert) }, opt)
	ev := log.Info()
	if err != nil {
		ev = log.Warn().Err(err)
	}
	ev.Str("share", progress.Bytes(res.Share)).Str("kept", progress.Bytes(res.Kept)).Str("fetched", progress.Bytes(res.Fetched)).Dur("took", time.Since(t0).Round(time.Millisecond)).
		Int64("share_bytes", res.Share).Int64("kept_bytes", res.Kept).Int64("fetched_bytes", b.Fetched()). // (all this process fetched: as it ran, then the rest)
		Msg("worker: its share of the store filled")
}

// fillOwner is the worker that fetches the k-th chunk of expert of layer
// for the others holding it: a worker of the group that runs the layer in
// decode (which holds all its experts), the members in turn, so that
// each fetches about as much from outside and serves as much to the
// others, its group's members and the workers running the expert in
// prefill alike.
func fillOwner(l sched.Layout, layer, expert, k int) int {
	return l.DecodeWorker(layer, expert+k) // (the decode rule: the group's members in turn)
}

// peerDialTimeout and peerChunkTimeout bound what a group's member that
// does not answer, or stalls, costs a worker filling its share.
const (
	peerDialTimeout  = 5 * time.Second
	peerChunkTimeout = 30 * time.Second
)

// fillLogEvery is how often a worker filling its share says how far it is.
const fillLogEvery = 5 * time.Second

// fillProgress is a fetch.Options.Progress that logs, at most every
// every (safe for concurrent calls), the share's bytes done of its total,
// the rate since start and the time left at it.
func fillProgress(start time.Time, every time.Duration, log zerolog.Logger) func(done, total int64) {
	var mu sync.Mutex
	last := start
	return func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if now.Sub(last) < every || done >= total {
			return // (the end has a line of its own)
		}
		last = now
		rate := float64(done) / max(now.Sub(start).Seconds(), 1e-9)
		left := time.Duration(float64(total-done) / max(rate, 1) * float64(time.Second))
		log.Info().Str("done", progress.Bytes(done)).Str("share", progress.Bytes(total)).Str("rate", progress.Bytes(int64(rate))+"/s").
			Dur("left", left.Round(time.Second)).Msg("worker: filling its share of the store")
	}
}

// smallestBudget is the least device memory that can run every expert of
// st on dev: the largest expert, aligned, and the compute buffers of one
// token.
func smallestBudget(st *store.Store, dev Device) (int64, error) {
	var need int64
	for _, l := range st.Layers() {
		for e := range st.Experts() {
			n, err := st.ExpertBytes(l, e)
			if err != nil {
				return 0, err
			}
			hidden, inter, err := st.ExpertShape(l, e)
			if err != nil {
				return 0, err
			}
			need = max(need, align(int64(n))+align(dev.ComputeBytes(1, hidden, inter, st.Form() == store.FormClampedSwiGLU)))
		}
	}
	return need, nil
}

func align(n int64) int64 { return (n + arenaAlign - 1) / arenaAlign * arenaAlign }

func preloadHost(ctx context.Context, eng *Engine, st *store.Store, held func(layer, expert int) bool, limit int64, quiet bool, log zerolog.Logger) error {
	t0 := time.Now()
	var total int64 // every expert's decompressed size
	for _, l := range st.Layers() {
		for e := range st.Experts() {
			if b, err := st.ExpertBytes(l, e); err == nil {
				total += int64(b)
			}
		}
	}
	bar := newBar(quiet, "host cache", min(limit, total))
	n, err := eng.Host.Preload(ctx, st, st.Layers(), st.Experts(), held, bar.Set)
	bar.Finish()
	if err != nil {
		return err
	}
	_, _, used := eng.Host.Stats()
	log.Info().Int("experts", n).Str("bytes", progress.Bytes(used)).Dur("took", time.Since(t0)).Msg("host cache preloaded")
	return nil
}

// newBar is a progress bar on stderr, or one drawn nowhere when quiet.
func newBar(quiet bool, label string, total int64) *progress.Bar {
	if quiet {
		return progress.NewWriter(io.Discard, false, label, total)
	}
	return progress.New(label, total)
}

func inUse(d Device) int64 {
	_, n, _ := d.Memory()
	return n
}

// pinResident pins the experts worker idx of n owns, with a progress bar.
func pinResident(ctx context.Context, eng *Engine, st *store.Store, idx, n int, quiet bool, log zerolog.Logger) error {
	var total int64 // what this worker owns
	layout := sched.Layout{Workers: n, Group: 1}
	for _, l := range st.Layers() {
		for _, e := range layout.Owned(idx, l, st.Experts()) {
			b, _ := st.ExpertBytes(l, e)
			total += int64(b)
		}
	}
	t0 := time.Now()
	bar := newBar(quiet, "pin resident experts", total)
	err := eng.PinOwned(ctx, st.Layers(), st.Experts(), idx, n, bar.Set)
	bar.Finish()
	if err != nil {
		return fmt.Errorf("worker: resident %d/%d: %w", idx, n, err)
	}
	log.Info().Str("resident", fmt.Sprintf("%d/%d", idx, n)).Int("experts", eng.Resident()).Str("device_in_use", progress.Bytes(inUse(eng.Device()))).
		Dur("took", time.Since(t0)).Msg("resident experts pinned")
	return nil
}
