package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A team is the persistent goroutines that parallel regions (parallelRows)
// run on: Threads()-1 members beside the calling goroutine. Starting
// goroutines for every matrix product costs a thread wake-up each time
// (tens of microseconds in a VM, 56 times a token on small); a member instead
// spins on the team's generation after a region (spinFor), where the
// next region of a token finds it, and parks only when none comes.
//
// One region runs on the team at a time; a caller that finds the team
// busy (another goroutine's product: a worker serving two requests, the
// shadow beside the main node in one process) starts goroutines as
// before. Results never depend on who runs a chunk: each chunk is a fixed
// row range, computed the same way by whoever claims it.
type team struct {
	busy    sync.Mutex // held by the goroutine running a region
	gen     atomic.Uint64
	cur     atomic.Pointer[region]
	members []*member
	stopped atomic.Bool    // set, and every member woken, when the team is replaced
	serving sync.WaitGroup // the members, until they return after stopped
}

// region is one parallel product: chunks fixed row ranges of fn, claimed
// in order by the caller and the members. A region is never reused, so a
// member that comes late to one finds nothing left to claim.
type region struct {
	fn     func(c, r0, r1 int) // chunk c: rows [r0, r1)
	rows   int
	chunks int64
	next   atomic.Int64 // the next chunk to claim
	done   atomic.Int64 // chunks finished
}

type member struct {
	parked atomic.Bool
	sleep  parker // where a parked member sleeps until a region's caller wakes it
	// wokeAt is when a region's caller woke the member (since
	// clockStart), while TraceTeam is on; 0 when no wake is pending.
	wokeAt atomic.Int64
}

// spinFor is how long a member looks at the team's generation before it
// parks: longer than the gaps between a token's products (the serial
// work between them: norms, RoPE, routing), shorter than a token or a
// network hop. Local decode on small at two threads (Zen 4 VM,
// 2026-11-29, bench kernels' trace) ran 56 regions a token; a spin of
// ~6 us (2^14 loads, before) found 23 of them parked, so the caller
// began each of those alone and its member, woken, ran 40-41% of the
// chunks; 100 us finds one parked (the next token's first), the members
// run 49%, and decode ran 60.7 -> 72.5 tok/s (medians of eight
// interleaved runs). Time, not a count of loads, so that it means the
// same on every CPU.
const spinFor = 100 * time.Microsecond

// spinCheck is how many loads of the generation a member makes between
// two looks at the clock while it spins.
const spinCheck = 1 << 10

var (
	theTeam atomic.Pointer[team] // of Threads() goroutines
	teamMu  sync.Mutex           // held while a team is replaced
)

// teamFor returns the team of parts goroutines (the caller and parts-1
// members), starting it (and stopping another size's) when needed. Every
// parallel product asks: the usual answer is one atomic load.
func teamFor(parts int) *team {
	if t := theTeam.Load(); t != nil && len(t.members) == parts-1 {
		return t
	}
	teamMu.Lock()
	defer teamMu.Unlock()
	old := theTeam.Load()
	if old != nil && len(old.members) == parts-1 {
		return old // another caller replaced it first
	}
	if old != nil {
		old.stopped.Store(true)
		for _, m := range old.members {
			m.sleep.wake()
		}
	}
	t := &team{}
	for range parts - 1 {
		m := &member{}
		m.sleep.init()
		t.members = append(t.members, m)
		t.serving.Go(func() { t.serve(m) })
	}
	theTeam.Store(t)
	return t
}

// teamAsleep reports whether a member of the current team is parked, so
// that a region would have to wake it.
func teamAsleep() bool {
	t := theTeam.Load()
	if t == nil {
		return false
	}
	for _, m := range t.members {
		if m.parked.Load() {
			return true
		}
	}
	return false
}

// serve is a member's life: wait for a new region, work on it, again.
func (t *team) serve(m *member) {
	var seen uint64
	for {
		g, ok := t.await(m, seen)
		if !ok {
			return
		}
		seen = g
		t.cur.Load().work()
	}
}

// await returns the team's generation once it differs from seen: spinning
// first, then parked until the caller of a region wakes it. ok is false
// when the team stopped.
func (t *team) await(m *member, seen uint64) (gen uint64, ok bool) {
	deadline := time.Now().Add(spinFor)
	for i := 1; ; i++ {
		if g := t.gen.Load(); g != seen {
			return g, true
		}
		if i%spinCheck == 0 && time.Now().After(deadline) {
			break
		}
	}
	if tracing.Load() {
		teamTrace.parks.Add(1) // before parked says so, for a reader that waits on it
	}
	m.parked.Store(true)
	if g := t.gen.Load(); g != seen {
		if m.parked.CompareAndSwap(true, false) {
			return g, true
		}
		// the caller saw us parked and sends a wake-up: take it
	}
	m.sleep.sleep()
	if w := m.wokeAt.Swap(0); w != 0 {
		teamTrace.wakeNs.Add(int64(time.Since(clockStart)) - w)
	}
	if t.stopped.Load() {
		return 0, false
	}
	return t.gen.Load(), true
}

// work claims and runs chunks until none is left, and returns how many
// it ran.
func (r *region) work() (ran int64) {
	for c := r.next.Add(1) - 1; c < r.chunks; c = r.next.Add(1) - 1 {
		r.fn(int(c), int(int64(r.rows)*c/r.chunks), int(int64(r.rows)*(c+1)/r.chunks))
		r.done.Add(1)
		ran++
	}
	return ran
}

// run runs fn over chunks row ranges covering [0, rows) on the team and
// the calling goroutine, and returns when every chunk is done. It reports
// false, having run nothing, when another goroutine holds the team.
func (t *team) run(rows, chunks int, fn func(c, r0, r1 int)) bool {
	if !t.busy.TryLock() {
		return false
	}
	defer t.busy.Unlock()
	traced := tracing.Load()
	var t0 time.Time
	if traced {
		t0 = time.Now()
	}
	r := &region{fn: fn, rows: rows, chunks: int64(chunks)}
	t.cur.Store(r)
	t.gen.Add(1)
	woke := int64(0)
	for _, m := range t.members {
		if m.parked.CompareAndSwap(true, false) {
			if traced {
				m.wokeAt.Store(int64(time.Since(clockStart)))
			}
			m.sleep.wake()
			woke++
		}
	}
	mine := r.work()
	var t1 time.Time
	if traced {
		t1 = time.Now()
	}
	// every chunk is claimed: wait for the members still computing one
	for i := 0; r.done.Load() < r.chunks; i++ {
		if i%64 == 63 {
			runtime.Gosched()
		}
	}
	if traced {
		t2 := time.Now()
		teamTrace.regions.Add(1)
		teamTrace.chunks.Add(r.chunks)
		teamTrace.memberChunks.Add(r.chunks - mine)
		teamTrace.wakes.Add(woke)
		teamTrace.regionNs.Add(int64(t2.Sub(t0)))
		teamTrace.barrierNs.Add(int64(t2.Sub(t1)))
	}
	return true
}

// TeamStats count what the thread team did while TraceTeam was on: where
// a parallel region's time goes between its work, the wait for the last
// chunk, and members asleep.
type TeamStats struct {
	// Regions are the parallel regions run on the team (products,
	// attention's heads, a split activation), RegionTime
	// their wall time as their callers saw it, and BarrierTime the part
	// of it a caller, its own chunks done, waited for members still
	// computing theirs.
	Regions     int64
	RegionTime  time.Duration
	BarrierTime time.Duration
	// Chunks are the regions' row ranges, MemberChunks those the
	// members (not the callers) ran.
	Chunks, MemberChunks int64
	// Wakes are members a region found parked and woke; Parks the times
	// a member, no region coming while it spun, parked. WakeTime is the
	// time from the wakes to the members running, summed; a member
	// counts it when it runs, so a wake just before a reading (or before
	// TraceTeam(false)) is counted in the next.
	Wakes, Parks int64
	WakeTime     time.Duration
	// Alone are products that ran on their caller alone because the
	// members were parked and the product was small (minWakeElems);
	// Spawned those that ran on new goroutines because another
	// goroutine held the team.
	Alone, Spawned int64
}

var (
	tracing   atomic.Bool
	teamTrace struct {
		regions, regionNs, barrierNs, chunks, memberChunks, wakes, wakeNs, parks, alone, spawned atomic.Int64
	}
)

// TraceTeam turns the team's counts (ReadTeamStats) on or off. Off, the
// default, they cost an atomic load where they would count (a region, a
// park, a product run alone or on new goroutines).
func TraceTeam(on bool) { tracing.Store(on) }

// ReadTeamStats returns the counts since the process started, of the
// time TraceTeam was on.
func ReadTeamStats() TeamStats {
	tr := &teamTrace
	return TeamStats{
		Regions: tr.regions.Load(), RegionTime: time.Duration(tr.regionNs.Load()), BarrierTime: time.Duration(tr.barrierNs.Load()),
		Chunks: tr.chunks.Load(), MemberChunks: tr.memberChunks.Load(), Wakes: tr.wakes.Load(), Parks: tr.parks.Load(), WakeTime: time.Duration(tr.wakeNs.Load()),
		Alone: tr.alone.Load(), Spawned: tr.spawned.Load(),
	}
}

// Sub returns the counts of s since earlier.
func (s TeamStats) Sub(earlier TeamStats) TeamStats {
	return TeamStats{
		Regions: s.Regions - earlier.Regions, RegionTime: s.RegionTime - earlier.RegionTime, BarrierTime: s.BarrierTime - earlier.BarrierTime,
		Chunks: s.Chunks - earlier.Chunks, MemberChunks: s.MemberChunks - earlier.MemberChunks, Wakes: s.Wakes - earlier.Wakes, Parks: s.Parks - earlier.Parks, WakeTime: s.WakeTime - earlier.WakeTime,
		Alone: s.Alone - earlier.Alone, Spawned: s.Spawned - earlier.Spawned,
	}
}
