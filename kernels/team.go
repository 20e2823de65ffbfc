package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// A team is the persistent goroutines that parallel regions (parallelRows)
// run on: Threads()-1 members beside the calling goroutine. Starting
// goroutines for every matrix product costs a thread wake-up each time
// (tens of microseconds in a VM, ~90 times a token); a member instead
// spins briefly on the team's generation after a region, where the next
// region of a token usually finds it, and parks only when none comes.
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
	quit    chan struct{}
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
	wake   chan struct{} // capacity 1: a wake-up never blocks the caller
}

// spinLoads is how many times a member looks at the team's generation
// before it parks: 5.7-7.0 us on the 2-vCPU VM of docs/BENCHMARKS.md (go
// test -bench of the loop), about the serial work between two products
// of a layer (norms, RoPE), well under a token.
const spinLoads = 1 << 14

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
		close(old.quit)
	}
	t := &team{quit: make(chan struct{})}
	for range parts - 1 {
		m := &member{wake: make(chan struct{}, 1)}
		t.members = append(t.members, m)
		go t.serve(m)
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
	for range spinLoads {
		if g := t.gen.Load(); g != seen {
			return g, true
		}
	}
	m.parked.Store(true)
	if g := t.gen.Load(); g != seen {
		if m.parked.CompareAndSwap(true, false) {
			return g, true
		}
		// the caller saw us parked and sends a wake-up: take it
	}
	select {
	case <-m.wake:
		return t.gen.Load(), true
	case <-t.quit:
		return 0, false
	}
}

// work claims and runs chunks until none is left.
func (r *region) work() {
	for c := r.next.Add(1) - 1; c < r.chunks; c = r.next.Add(1) - 1 {
		r.fn(int(c), int(int64(r.rows)*c/r.chunks), int(int64(r.rows)*(c+1)/r.chunks))
		r.done.Add(1)
	}
}

// run runs fn over chunks row ranges covering [0, rows) on the team and
// the calling goroutine, and returns when every chunk is done. It reports
// false, having run nothing, when another goroutine holds the team.
func (t *team) run(rows, chunks int, fn func(c, r0, r1 int)) bool {
	if !t.busy.TryLock() {
		return false
	}
	defer t.busy.Unlock()
	r := &region{fn: fn, rows: rows, chunks: int64(chunks)}
	t.cur.Store(r)
	t.gen.Add(1)
	for _, m := range t.members {
		if m.parked.CompareAndSwap(true, false) {
			m.wake <- struct{}{}
		}
	}
	r.work()
	// every chunk is claimed: wait for the members still computing one
	for i := 0; r.done.Load() < r.chunks; i++ {
		if i%64 == 63 {
			runtime.Gosched()
		}
	}
	return true
}
