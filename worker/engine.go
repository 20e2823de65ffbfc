package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
)

// ExpertSource is what a worker needs from an expert store
// (*store.Store satisfies it; a remote store will too).
type ExpertSource interface {
	ExpertBytes(layer, expert int) (int, error)
	ReadExpert(ctx context.Context, layer, expert int, dst []byte) (model.Expert, error)
}

// Stats are a worker's counters since it started.
type Stats struct {
	Loads        atomic.Int64 // experts loaded (hinted or not)
	Hits         atomic.Int64 // requests whose expert was hinted (loaded or loading)
	Misses       atomic.Int64 // requests whose expert was not hinted: loaded on demand
	Wasted       atomic.Int64 // hinted loads evicted without being used
	Refused      atomic.Int64 // loads or requests refused for lack of device memory
	LoadNanos    atomic.Int64 // time spent loading (read, decompress, link)
	ComputeNanos atomic.Int64 // time spent computing experts
	StallNanos   atomic.Int64 // time requests waited for their expert to be loaded
	// Resident are requests served by an expert an earlier request left
	// resident (After Cache): no load at all.
	Resident atomic.Int64
	// Evicted are resident experts dropped to make room for another.
	Evicted atomic.Int64
	// Withdrawn are predicted loads the shadow took back (it had run
	// ahead on a token the main node did not sample) and that nobody else
	// held: dropped unused, their bytes in WithdrawnBytes (a load still
	// under way counts its whole expert).
	Withdrawn      atomic.Int64
	WithdrawnBytes atomic.Int64
	// Quarantined are experts whose bytes in the store failed their
	// checksum (or could not be read whole): refused at once from then
	// on, so that the main node sends them to another worker.
	Quarantined atomic.Int64
}

// Engine loads, computes and evicts experts within a device-memory budget.
// Safe for concurrent use; Close waits for the loads it started, which end
// with the context of the Prefetch that started them.
type Engine struct {
	src    ExpertSource
	dev    Device
	hidden int
	log    zerolog.Logger
	Stats  Stats

	// Host, if set before the first load, keeps decompressed experts in
	// host memory (HostCache); nil reads every load from the store.
	Host *HostCache
	// Chunks, if set, is the store's cache of compressed chunks in host
	// memory (the compressed tier), for the worker's figures.
	Chunks *store.ChunkCache
	// tiers, with both host tiers, chooses which an expert stays in
	// (set before the first load); nil: every load fills Host.
	tiers *hostTiers

	// PinnedOnly, set before the first prediction, makes a prediction of
	// an expert the engine does not hold a no-op instead of a load: a
	// resident worker's (-resident), whose pinned experts are all it is
	// ever asked to run, beside a shadow hinting as in shadow mode.
	PinnedOnly bool
	// OnLoad, if set before the first load, is told of every load that
	// succeeded: which expert and when it ran (for traces).
	OnLoad func(layer, expert int, start, end time.Time)
	// OnLoadFailed, if set before the first load, is told of every load
	// that failed, after its slot is cleared and before its waiters wake
	// (the Node checks its whole store then).
	OnLoadFailed func(err error)

	wg sync.WaitGroup // background loads

	mu    sync.Mutex
	slots map[slotKey]*slot
	bad   map[slotKey]error // quarantined: their store bytes are damaged
	order uint64
	clock uint64 // requests run: the residency policy's clock
	// at is, per sequence, the latest pass and layer a request has
	// run: a prediction for a later pass is for the future (a shadow
	// running ahead), and waits its turn behind the current pass's;
	// one for an earlier layer has passed (a wrong prediction)
	at map[uint64]position
}

// position is where a sequence's requests have got to.
type position struct {
	it    int64
	layer int
}

type slotKey struct{ layer, expert int }

// holder is a sequence that holds an expert for one of its passes.
type holder struct {
	seq uint64
	it  int64
}

// slot is one expert being loaded or resident. One slot serves every
// sequence that wants the expert: it stays while any of them holds it.
type slot struct {
	done     chan struct{} // closed when the load ends
	expert   model.Expert
	block    Block
	host     *hostEntry // the host copy it computes from, held until freed; nil if none
	err      error
	loadDur  time.Duration
	hinted   bool
	hintedAt time.Time // when the first prediction of it arrived
	// prefetched: a prediction started its load (Prefetch), which never
	// waits for memory: a waiting request may wait for it instead
	prefetched bool
	pinned     bool // resident for good (Pin): never evicted but by Close
	cached     bool // a request left it resident (After Cache): it stays when nobody holds it
	// keepers are the sequences whose last request held it for their
	// prompt's next mini-batch (After Hold), until they let go
	keepers []uint64
	heat    heat   // its uses, decayed: the coldest cached expert goes first
	loaded  bool   // the load has ended (err says how); guarded by Engine.mu
	users   int    // requests computing with it now
	used    bool   // some request has used it
	order   uint64 // order of creation, for eviction of the oldest
	// holders are the passes of sequences that hinted it or are
	// running it, until they let go
	holders []holder
	held    [2]holder // holders' first backing array: most experts serve one or two
}

// hold adds pass it of seq to the slot's holders (once).
func (s *slot) hold(seq uint64, it int64) {
	if !slices.Contains(s.holders, holder{seq, it}) {
		s.holders = append(s.holders, holder{seq, it})
	}
}

// release drops seq's holds for passes from..to from the slot's
// holders and reports whether the slot can go: nobody holds it, nobody
// computes with it, and it is not pinned.
func (s *slot) release(seq uint64, from, to int64) bool {
	s.holders = slices.DeleteFunc(s.holders, func(h holder) bool { return h.seq == seq && h.it >= from && h.it <= to })
	return len(s.holders) == 0 && s.users == 0 && !s.pinned
}

// firstPass is the earliest pass that holds s (MinInt64 if
// none).
func (s *slot) firstPass() int64 {
	if len(s.holders) == 0 {
		return math.MinInt64
	}
	first := int64(math.MaxInt64)
	for _, h := range s.holders {
		first = min(first, h.it)
	}
	return first
}

// future reports whether every holder of s holds it for a pass
// after the one its sequence runs now (at), and the earliest of them:
// a prediction from a shadow running ahead, not needed this pass.
func (s *slot) future(at map[uint64]position) (bool, int64) {
	first := int64(math.MaxInt64)
	for _, h := range s.holders {
		if h.it <= at[h.seq].it {
			return false, 0
		}
		first = min(first, h.it)
	}
	return len(s.holders) > 0, first
}

// passed reports whether every holder of s, an expert of layer, holds it
// for a layer its sequence's requests have gone past: a wrong prediction.
func (s *slot) passed(layer int, at map[uint64]position) bool {
	for _, h := range s.holders {
		if a, ok := at[h.seq]; !ok || h.it > a.it || h.it == a.it && layer >= a.layer {
			return false
		}
	}
	return true
}

// NewEngine returns an engine over src whose experts take hidden-size
// inputs, on device dev.
func NewEngine(src ExpertSource, hidden int, dev Device, log zerolog.Logger) *Engine {
	return &Engine{src: src, dev: dev, hidden: hidden, log: log, slots: map[slotKey]*slot{}, at: map[uint64]position{}}
}

// Device is where the engine keeps and runs experts.
func (e *Engine) Device() Device { return e.dev }

// Prefetch starts loading the experts of layer that forward pass step
// will need and that are not resident or loading already (a hint: from
// the shadow's prediction or the main node), and holds them for that
// pass of the sequence until it runs them or lets go of the layer
// (Evict). It returns at once; a load that does not fit the budget is
// refused, counted and logged, and the request that needs it later loads
// it as a miss. A load for a later pass than the sequence runs now
// never takes the room of one for the current pass.
func (e *Engine) Prefetch(ctx context.Context, step model.Step, layer int, experts []int) {
	for _, ex := range experts {
		e.mu.Lock()
		k := slotKey{layer, ex}
		if e.bad[k] != nil {
			e.mu.Unlock()
			continue // quarantined: nothing to load
		}
		if s, ok := e.slots[k]; ok {
			if !s.hinted {
				s.hinted, s.hintedAt = true, time.Now()
			}
			s.hold(step.Seq, step.Pass)
			e.mu.Unlock()
			continue
		}
		if e.PinnedOnly {
			e.mu.Unlock()
			continue // a resident worker's: nobody will ask it for an expert it does not hold
		}
		s := e.newSlotLocked(k, true)
		s.hold(step.Seq, step.Pass)
		e.mu.Unlock()
		e.wg.Go(func() { e.load(ctx, k, s) })
	}
}

func (e *Engine) newSlotLocked(k slotKey, hinted bool) *slot {
	e.order++
	s := &slot{done: make(chan struct{}), hinted: hinted, prefetched: hinted, order: e.order}
	if hinted {
		s.hintedAt = time.Now()
	}
	s.holders = s.held[:0]
	e.slots[k] = s
	return s
}

// load fills s. The outcome is published under the lock together with
// s.loaded, so Evict and load always agree on who frees the memory: a slot
// evicted while loading is freed here.
func (e *Engine) load(ctx context.Context, k slotKey, s *slot) {
	defer close(s.done)
	t0 := time.Now()
	err := e.loadInto(ctx, k, s)
	e.mu.Lock()
	s.err, s.loadDur, s.loaded = err, time.Since(t0), true
	quarantine := damaged(err) && e.bad[k] == nil
	if quarantine {
		if e.bad == nil {
			e.bad = map[slotKey]error{}
		}
		e.bad[k] = err
	}
	current := e.slots[k] == s
	if err != nil && current {
		delete(e.slots, k)
	}
	if err == nil && !current { // evicted while loading: nobody will use it
		if s.hinted {
			e.Stats.Wasted.Add(1)
		}
		e.freeLocked(s)
	}
	e.mu.Unlock()
	if err != nil {
		if errors.Is(err, ErrOverBudget) {
			e.Stats.Refused.Add(1)
		}
		if e.OnLoadFailed != nil {
			e.OnLoadFailed(err)
		}
		if quarantine {
			e.Stats.Quarantined.Add(1)
			e.log.Error().Int("layer", k.layer).Int("expert", k.expert).Err(err).
				Msg("expert quarantined: its bytes in the store are damaged; requests for it are refused, the main node sends them to another worker")
		} else if !errors.Is(err, context.Canceled) {
			e.log.Warn().Int("layer", k.layer).Int("expert", k.expert).Err(err).Msg("expert load failed")
		}
		return
	}
	e.Stats.Loads.Add(1)
	e.Stats.LoadNanos.Add(int64(s.loadDur))
	if e.OnLoad != nil {
		e.OnLoad(k.layer, k.expert, t0, t0.Add(s.loadDur))
	}
}

// Pin loads the given experts of layer and keeps them resident until
// Close, whatever the requests say (a resident swarm: the fully cached
// reference). It waits for the loads and returns the first error.
func (e *Engine) Pin(ctx context.Context, layer int, experts []int) error {
	var pending []*slot
	for _, ex := range experts {
		k := slotKey{layer, ex}
		e.mu.Lock()
		s, ok := e.slots[k]
		if !ok {
			s = e.newSlotLocked(k, false)
		}
		s.pinned, s.used = true, true
		e.mu.Unlock()
		if !ok {
			e.load(ctx, k, s)
		}
		pending = append(pending, s)
	}
	for _, s := range pending {
		select {
		case <-s.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if s.err != nil {
			return s.err
		}
	}
	return nil
}

func (e *Engine) loadInto(ctx context.Context, k slotKey, s *slot) error {
	n, err := e.src.ExpertBytes(k.layer, k.expert)
	if err != nil {
		return err
	}
	b, err := e.alloc(ctx, int64(n), k.layer, s)
	if err != nil {
		return fmt.Errorf("worker: loading layer %d expert %d: %w", k.layer, k.expert, err)
	}
	ex, host, err := e.fromHost(ctx, k, n, b)
	if err == nil {
		ex, err = e.dev.Upload(ctx, b, ex, int64(n))
	}
	if err == nil {
		if cerr := ex.Check(e.hidden); cerr != nil {
			err = fmt.Errorf("worker: layer %d expert %d: %w", k.layer, k.expert, cerr)
		}
	}
	if err != nil {
		if host != nil {
			e.Host.release(host)
		}
		e.dev.Free(b)
		return err
	}
	s.expert, s.block, s.host = ex, b, host
	return nil
}

// fromHost reads expert k (n bytes) into host memory bound for device
// block b: into the host cache if there is one (a hit reads nothing),
// holding the copy there, which the device may compute from until the
// hold is released; else, or when the cache has no room, into b's
// staging memory.
func (e *Engine) fromHost(ctx context.Context, k slotKey, n int, b Block) (model.Expert, *hostEntry, error) {
	if e.Host != nil {
		if host, ok := e.Host.get(k); ok {
			return host.expert, host, nil
		}
		if e.tiers == nil || e.tiers.admit(k, n) {
			t0 := time.Now()
			host, err := e.Host.fill(ctx, e.src, k, n)
			if err == nil {
				e.tiers.decompressed(n, time.Since(t0))
				e.tiers.admitted(k)
				return host.expert, host, nil
			}
			if !errors.Is(err, errHostFull) {
				return model.Expert{}, nil, err
			}
		}
	}
	t0 := time.Now()
	ex, err := e.src.ReadExpert(ctx, k.layer, k.expert, e.dev.Staging(b))
	if err == nil {
		e.tiers.decompressed(n, time.Since(t0))
	}
	return ex, nil, err
}

// alloc takes n bytes of device memory for s's load; when the budget is
// full it makes room until they fit (roomFor).
func (e *Engine) alloc(ctx context.Context, n int64, layer int, s *slot) (Block, error) {
	for {
		b, err := e.dev.Alloc(n)
		if err == nil || !errors.Is(err, ErrOverBudget) {
			return b, err
		}
		if ok, werr := e.roomFor(ctx, layer, s); werr != nil {
			return Block{}, werr
		} else if !ok {
			return Block{}, err
		}
	}
}

// roomFor frees one expert (makeRoom) for slot s of layer (nil: a
// request's compute buffers) or, for a waiting request (not a prediction)
// whose room predictions still loading hold, waits for one of them to
// land (it can go then); it reports false when neither can help. A
// prediction never waits: it is refused.
func (e *Engine) roomFor(ctx context.Context, layer int, s *slot) (bool, error) {
	demand := s == nil || !s.prefetched
	if e.makeRoom(layer, s) {
		return true, nil
	}
	landing := e.prefetchInFlight()
	if !demand || landing == nil {
		return false, nil
	}
	select {
	case <-landing:
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// prefetchInFlight returns the done channel of a prediction's load still
// under way, nil if there is none.
func (e *Engine) prefetchInFlight() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.slots {
		if s.prefetched && !s.loaded {
			return s.done
		}
	}
	return nil
}

// dropLocked removes a resident slot and frees its memory.
func (e *Engine) dropLocked(k slotKey, s *slot) {
	delete(e.slots, k)
	if !s.used && s.hinted {
		e.Stats.Wasted.Add(1)
	}
	if s.block.Bytes != nil {
		e.freeLocked(s)
	}
}

// freeLocked frees a loaded slot's device memory and its hold on a host
// copy.
func (e *Engine) freeLocked(s *slot) {
	e.dev.Free(s.block)
	s.block = Block{}
	if s.host != nil {
		e.Host.release(s.host)
		s.host = nil
	}
}

// Result describes how a request was served.
type Result struct {
	Miss bool // the expert was not hinted: loaded on demand
	// Resident: an earlier request left the expert resident (After Cache).
	Resident bool
	// Lead, for an expert loaded for this request on a prediction, is how
	// long before the request the prediction arrived (0 otherwise): the
	// load hides when the lead covers it.
	Lead    time.Duration
	Loaded  bool          // the expert was loaded for this request: its first user, and not pinned
	Stall   time.Duration // time waiting for the load
	Load    time.Duration // the load's own duration
	Compute time.Duration
	// Arrived is when Run was called (the stall starts), Started when the
	// compute started.
	Arrived, Started time.Time
}

// Run computes expert (layer, expert) for sequence seq on n input vectors
// x (n*hidden) into out (n*hidden), loading it first if it is not resident
// (a miss if no sequence hinted it either). after says what becomes of it
// then: Evict lets go of it, and it is freed unless another sequence still
// holds it (decode: JIT load, compute once, evict); Hold keeps holding it
// for further mini-batches (prefill) until Evict; Cache lets go of it but
// leaves it resident for later requests (-residency on).
func (e *Engine) Run(ctx context.Context, step model.Step, layer, expert int, x []float32, n int, out []float32, after After) (Result, error) {
	seq := step.Seq
	var res Result
	if n <= 0 || len(x) != n*e.hidden || len(out) != n*e.hidden {
		return res, fmt.Errorf("worker: layer %d expert %d: %d inputs and %d outputs for %d tokens of hidden size %d", layer, expert, len(x), len(out), n, e.hidden)
	}
	k := slotKey{layer, expert}
	t0 := time.Now()
	var s *slot
	e.mu.Lock()
	if a := e.at[seq]; step.Pass > a.it || step.Pass == a.it && layer > a.layer {
		e.at[seq] = position{step.Pass, layer}
	}
	if err := e.bad[k]; err != nil {
		e.mu.Unlock()
		return res, err
	}
	e.mu.Unlock()
	for {
		e.mu.Lock()
		s = e.slots[k]
		if s == nil {
			res.Miss = true
			s = e.newSlotLocked(k, false)
			e.mu.Unlock()
			e.load(ctx, k, s)
		} else {
			e.mu.Unlock()
		}
		select {
		case <-s.done:
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if s.err != nil {
			if res.Miss {
				return res, s.err
			}
			continue // the hinted load failed (and was counted): load it as a miss
		}
		e.mu.Lock()
		if e.slots[k] != s { // evicted between the load and now
			e.mu.Unlock()
			continue
		}
		res.Loaded = !s.used && !s.pinned
		res.Resident = s.cached && s.used && !s.pinned
		if res.Loaded && s.hinted && s.hintedAt.Before(t0) {
			res.Lead = t0.Sub(s.hintedAt)
		}
		s.users++
		s.used = true
		s.hold(seq, step.Pass)
		e.clock++
		s.heat.use(e.clock)
		e.mu.Unlock()
		break
	}
	if res.Miss {
		e.Stats.Misses.Add(1)
	} else {
		e.Stats.Hits.Add(1)
	}
	if res.Resident {
		e.Stats.Resident.Add(1)
	}
	res.Stall, res.Arrived = time.Since(t0), t0
	if res.Loaded {
		res.Load = s.loadDur
	}
	e.Stats.StallNanos.Add(int64(res.Stall))

	err := e.compute(ctx, layer, s.expert, x, n, out, &res)

	e.mu.Lock()
	s.users--
	if after == Hold {
		if !slices.Contains(s.keepers, seq) {
			s.keepers = append(s.keepers, seq)
		}
	} else {
		s.keepers = slices.DeleteFunc(s.keepers, func(q uint64) bool { return q == seq })
	}
	if after == Cache {
		s.cached = true
	}
	if after != Hold && s.release(seq, math.MinInt64, step.Pass) && !s.cached && e.slots[k] == s {
		e.dropLocked(k, s)
	}
	e.mu.Unlock()
	return res, err
}

// compute runs the expert on the device, its working memory taken from
// the budget too: the budget covers the expert and the compute buffers,
// for which others make room (makeRoom).
func (e *Engine) compute(ctx context.Context, layer int, ex model.Expert, x []float32, n int, out []float32, res *Result) error {
	res.Started = time.Now()
	for {
		err := e.dev.Run(ex, x, n, out)
		if err == nil {
			break
		}
		if errors.Is(err, ErrOverBudget) {
			// resident experts and predictions give way to the work at hand
			if ok, werr := e.roomFor(ctx, layer, nil); werr != nil {
				return werr
			} else if ok {
				continue
			}
			e.Stats.Refused.Add(1)
		}
		return err
	}
	res.Compute = time.Since(res.Started)
	e.Stats.ComputeNanos.Add(int64(res.Compute))
	return nil
}

// Evict lets forward pass step go of every expert of layer (the end of
// a prefill layer, or predictions for a layer that has run), its
// sequence's earlier passes too, and frees those that no other
// sequence or later pass holds and nobody computes with; one still
// loading is freed as soon as its load ends.
func (e *Engine) Evict(step model.Step, layer int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, s := range e.slots {
		if k.layer == layer {
			e.releaseLocked(step.Seq, math.MinInt64, step.Pass, k, s)
		}
	}
}

// Withdraw lets sequence step.Seq go of every expert it holds for
// pass step.Pass or later (the shadow's predictions on a path the
// main node did not take) and frees those nobody else holds: a withdrawn
// load, counted with its bytes unless a request used it.
func (e *Engine) Withdraw(step model.Step) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, s := range e.slots {
		if !slices.ContainsFunc(s.holders, func(h holder) bool { return h.seq == step.Seq && h.it >= step.Pass }) {
			continue
		}
		if e.releaseLocked(step.Seq, step.Pass, math.MaxInt64, k, s) && !s.used {
			e.Stats.Withdrawn.Add(1)
			if n, err := e.src.ExpertBytes(k.layer, k.expert); err == nil {
				e.Stats.WithdrawnBytes.Add(int64(n))
			}
		}
	}
}

// WithdrawExperts lets sequence step.Seq go of experts of layer it holds
// for pass step.Pass only (predictions that the rest of a pass run
// ahead no longer needs) and frees those nobody else holds, counted as
// Withdraw counts them.
func (e *Engine) WithdrawExperts(step model.Step, layer int, experts []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ex := range experts {
		k := slotKey{layer, ex}
		s, ok := e.slots[k]
		if !ok || !slices.Contains(s.holders, holder{step.Seq, step.Pass}) {
			continue
		}
		if e.releaseLocked(step.Seq, step.Pass, step.Pass, k, s) && !s.used {
			e.Stats.Withdrawn.Add(1)
			if n, err := e.src.ExpertBytes(k.layer, k.expert); err == nil {
				e.Stats.WithdrawnBytes.Add(int64(n))
			}
		}
	}
}

// EndSequence lets sequence seq go of every expert it still holds (hints
// for passes that never came) and frees those nobody else holds.
func (e *Engine) EndSequence(seq uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, s := range e.slots {
		e.releaseLocked(seq, math.MinInt64, math.MaxInt64, k, s)
	}
	delete(e.at, seq)
}

// releaseLocked drops seq's holds on s for passes from..to and frees
// s if it can go; it reports whether it went.
func (e *Engine) releaseLocked(seq uint64, from, to int64, k slotKey, s *slot) bool {
	if from == math.MinInt64 { // a prompt's keeping ends with its layer, a withdrawal leaves it
		s.keepers = slices.DeleteFunc(s.keepers, func(q uint64) bool { return q == seq })
	}
	if !s.release(seq, from, to) || s.cached {
		return false
	}
	if s.loaded {
		e.dropLocked(k, s)
	} else {
		delete(e.slots, k) // load() frees it when it ends
	}
	return true
}

// Resident is the number of experts loaded or loading.
func (e *Engine) Resident() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.slots)
}

// Cached is the number of experts requests have left resident (After
// Cache) and the device bytes they take.
func (e *Engine) Cached() (experts int, bytes int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.slots {
		if s.cached && s.loaded && s.err == nil {
			experts++
			bytes += int64(len(s.block.Bytes))
		}
	}
	return experts, bytes
}

// Close waits for the loads in flight (end their Prefetch's context to
// cut them short) and frees every expert.
func (e *Engine) Close() {
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, s := range e.slots {
		e.dropLocked(k, s)
	}
}

// PinOwned pins every expert worker idx of n owns in a resident swarm
// (sched.Layout.Owner) of a model whose layers (ascending) have experts
// experts each,
// reporting the bytes pinned so far to progress (may be nil).
func (e *Engine) PinOwned(ctx context.Context, layers []int, experts, idx, n int, progress func(done int64)) error {
	layout := sched.Layout{Workers: n, Group: 1}
	var done int64
	for _, l := range layers {
		owned := layout.Owned(idx, l, experts)
		if err := e.Pin(ctx, l, owned); err != nil {
			return err
		}
		for _, ex := range owned {
			b, _ := e.src.ExpertBytes(l, ex)
			done += int64(b)
		}
		if progress != nil {
			progress(done)
		}
	}
	return nil
}

// forgetQuarantine forgets every quarantined expert: the store was put
// back (storeHealth), so each is read again, and quarantined again if its
// bytes still fail.
func (e *Engine) forgetQuarantine() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.bad = nil
}

// damaged reports whether err says an expert's bytes in the store are
// damaged (a chunk failing its checksum, corrupt or cut short), as
// opposed to a passing fault (memory, a cancelled request).
func damaged(err error) bool {
	return errors.Is(err, store.ErrChecksum) || errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrTruncated)
}
