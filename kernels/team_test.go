package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestTeamProductsMatchOneThreadUnderConcurrentCallers: goroutines that
// multiply at once (one on the team, the others on goroutines of their
// own) and a team resized in between all get the one-thread result, bit
// for bit, for every dtype and for sizes that split into uneven chunks.
func TestTeamProductsMatchOneThreadUnderConcurrentCallers(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	type job struct {
		m    Matrix
		x    []float32
		want []float32
		n    int
	}
	var jobs []job
	for _, dt := range []DType{F32, BF16, F16, Q8, NF4} {
		for _, s := range []struct{ rows, cols, n int }{{517, 256, 1}, {96, 1024, 1}, {300, 512, 3}} {
			m := teamMatrix(t, rng, dt, s.rows, s.cols)
			x := randVec(rng, s.cols*s.n)
			jobs = append(jobs, job{m: m, x: x, n: s.n, want: make([]float32, s.rows*s.n)})
		}
	}
	prev := SetThreads(1)
	defer SetThreads(prev)
	for _, j := range jobs {
		MatMul(j.want, j.m, j.x, j.n)
	}
	for _, threads := range []int{2, 3, 2} { // 3 then 2: the team is replaced
		SetThreads(threads)
		var wg sync.WaitGroup
		errs := make(chan string, 64)
		for g := range 4 {
			wg.Go(func() {
				out := make([]float32, 0)
				for rep := range 5 {
					for i, j := range jobs {
						if (i+g+rep)%2 == 0 {
							continue
						}
						out = slices.Grow(out[:0], len(j.want))[:len(j.want)]
						MatMul(out, j.m, j.x, j.n)
						if !slices.Equal(out, j.want) {
							errs <- j.m.DType.String()
							return
						}
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for dt := range errs {
			t.Errorf("threads %d: a %s product on the team differs from the one-thread product", threads, dt)
		}
	}
}

// TestTeamMembersParkAndWake: without work every member parks; then a
// product still completes (the members are woken, or the caller does
// every chunk), and a replaced team's members stop.
func TestTeamMembersParkAndWake(t *testing.T) {
	prev := SetThreads(3)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(7, 8))
	m, _ := randMatrix(rng, BF16, 2048, 512) // minWakeElems: big enough to wake them
	x := randVec(rng, 512)
	want, got := make([]float32, 2048), make([]float32, 2048)
	MatVec(want, m, x)
	tm := teamFor(3)
	parked := func() (n int) {
		for _, mb := range tm.members {
			if mb.parked.Load() {
				n++
			}
		}
		return n
	}
	for range 3 {
		// far past spinFor (100 us), the members park; a loaded machine
		// may keep one from running to its park for a while
		for deadline := time.Now().Add(2 * time.Second); parked() != len(tm.members) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if n := parked(); n != len(tm.members) {
			t.Errorf("%d of %d members parked after up to 2 s without work", n, len(tm.members))
		}
		clear(got)
		MatVec(got, m, x)
		if !slices.Equal(got, want) {
			t.Fatal("a product after the members parked differs")
		}
	}
	SetThreads(2)
	MatVec(got, m, x)
	if !tm.stopped.Load() {
		t.Error("the 3-thread team was not stopped when the thread count changed")
	}
	left := make(chan struct{})
	go func() { tm.serving.Wait(); close(left) }()
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Error("the stopped 3-thread team's members had not returned 5 s after it stopped")
	}
}

// TestSmallProductsLeaveAParkedTeamAsleep: a product under minWakeElems
// that finds the members parked, long after the previous product, runs on
// the caller alone (the team's generation does not move, no member
// wakes); products that follow it closely wake the team; the results are
// the same either way.
func TestSmallProductsLeaveAParkedTeamAsleep(t *testing.T) {
	prev := SetThreads(2)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(9, 10))
	m, _ := randMatrix(rng, BF16, 512, 512) // 256K elements: parallel, but under minWakeElems
	x := randVec(rng, 512)
	want, got := make([]float32, 512), make([]float32, 512)
	SetThreads(1)
	MatVec(want, m, x)
	SetThreads(2)
	MatVec(got, m, x) // starts the 2-thread team
	tm := teamFor(2)
	mb := tm.members[0]
	awaitPark(t, mb)
	time.Sleep(2 * denseGap)
	gen := tm.gen.Load()
	clear(got)
	MatVec(got, m, x)
	if g := tm.gen.Load(); g != gen {
		t.Errorf("a small product after a pause ran on the parked team (generation %d -> %d)", gen, g)
	}
	if !mb.parked.Load() {
		t.Error("a small product after a pause woke the parked member")
	}
	if !slices.Equal(got, want) {
		t.Fatal("the product on the caller alone differs from the one-thread product")
	}
	// products back to back: the team runs them (a loaded machine may
	// pause the test between two past denseGap; a few tries allow for it)
	woke := false
	for range 20 {
		gen = tm.gen.Load()
		MatVec(got, m, x)
		if !slices.Equal(got, want) {
			t.Fatal("a product on the team differs from the one-thread product")
		}
		if tm.gen.Load() != gen {
			woke = true
			break
		}
	}
	if !woke {
		t.Error("20 small products back to back never ran on the team")
	}
}

// TestTeamTraceCountsWhatTheTeamDid: with TraceTeam on, a product on
// the team counts one region of its chunks, woken members and parks
// included, and its barrier wait within its wall time; a small product
// after a pause counts as run alone; off, nothing is counted.
func TestTeamTraceCountsWhatTheTeamDid(t *testing.T) {
	prev := SetThreads(2)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(11, 12))
	big, _ := randMatrix(rng, BF16, 2048, 512) // minWakeElems: wakes the team
	small, _ := randMatrix(rng, BF16, 512, 512)
	x := randVec(rng, 512)
	out := make([]float32, 2048)
	MatVec(out, big, x) // starts the 2-thread team
	tm := teamFor(2)
	awaitPark(t, tm.members[0])
	TraceTeam(true)
	defer TraceTeam(false)
	before, t0 := ReadTeamStats(), time.Now()
	MatVec(out, big, x)
	d := ReadTeamStats().Sub(before)
	if d.Regions != 1 || d.Chunks != int64(chunksFor(2, 2048)) || d.Wakes != 1 {
		t.Errorf("one product on a parked team of 2 counted %d regions of %d chunks waking %d members, want 1 of %d waking 1", d.Regions, d.Chunks, d.Wakes, chunksFor(2, 2048))
	}
	if d.MemberChunks < 0 || d.MemberChunks > d.Chunks || d.RegionTime <= 0 || d.BarrierTime < 0 || d.BarrierTime > d.RegionTime {
		t.Errorf("member chunks %d of %d, region %v, barrier %v: want 0..chunks, a positive region holding the barrier", d.MemberChunks, d.Chunks, d.RegionTime, d.BarrierTime)
	}
	awaitPark(t, tm.members[0])
	after := ReadTeamStats().Sub(before)
	if after.Parks < 1 {
		t.Errorf("the member parked after the product, counted %d parks", after.Parks)
	}
	// the member counts its wake when it runs, which may be after the
	// product: by its next park it has
	if after.WakeTime <= 0 || after.WakeTime > time.Since(t0) {
		t.Errorf("one wake took %v from the caller's wake-up to the member running, want more than 0 and at most the %v since the product began", after.WakeTime, time.Since(t0))
	}
	time.Sleep(2 * denseGap)
	before = ReadTeamStats()
	MatVec(out[:512], small, x)
	if d := ReadTeamStats().Sub(before); d.Alone != 1 || d.Regions != 0 {
		t.Errorf("a small product after a pause counted %d alone and %d regions, want 1 and 0", d.Alone, d.Regions)
	}
	TraceTeam(false)
	before = ReadTeamStats()
	MatVec(out, big, x)
	if d := ReadTeamStats().Sub(before); d != (TeamStats{}) {
		t.Errorf("with the trace off a product counted %+v", d)
	}
}

// teamMatrix is a random matrix of dt, quantized from F32 for Q8 and NF4.
func teamMatrix(t *testing.T, rng *rand.Rand, dt DType, rows, cols int) Matrix {
	if dt != Q8 && dt != NF4 {
		m, _ := randMatrix(rng, dt, rows, cols)
		return m
	}
	f, _ := randMatrix(rng, F32, rows, cols)
	m, err := Quantize(dt, f)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMatMulEachMatchesSeparateProducts: products sharing their input,
// split together over one region, give each product's MatMul bit for
// bit, at every thread count, for one vector and for several, on every
// path; mismatched shapes panic naming the operation.
func TestMatMulEachMatchesSeparateProducts(t *testing.T) {
	forEachPath(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, dt := range []DType{BF16, F32, Q8} {
			const cols = 512
			ws := []Matrix{teamMatrix(t, rng, dt, 1024, cols), teamMatrix(t, rng, dt, 256, cols), teamMatrix(t, rng, dt, 250, cols)}
			for _, n := range []int{1, 3} {
				x := randVec(rng, n*cols)
				for _, threads := range []int{1, 2, 3} {
					prev := SetThreads(threads)
					ps := make([]Product, len(ws))
					for i, w := range ws {
						ps[i] = Product{Out: make([]float32, n*w.Rows), W: w}
					}
					MatMulEach(x, n, ps)
					for i, w := range ws {
						want := make([]float32, n*w.Rows)
						MatMul(want, w, x, n)
						if !slices.Equal(ps[i].Out, want) {
							t.Errorf("%v, %d vectors, %d threads: product %d differs from its own MatMul", dt, n, threads, i)
						}
					}
					SetThreads(prev)
				}
			}
		}
	})
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "MatMulEach") {
			t.Errorf("a product with the wrong output length: panic %v, want one naming MatMulEach", r)
		}
	}()
	w := Matrix{DType: F32, Rows: 2, Cols: 3, Data: make([]byte, 24)}
	MatMulEach(make([]float32, 3), 1, []Product{{Out: make([]float32, 2), W: w}, {Out: make([]float32, 3), W: w}})
}

// BenchmarkTeamWake: a two-thread product on a team whose member has
// parked (each product after the member's spin ran out, as a token after
// a pause), reporting the time from the caller's wake-up to the member
// running ("us/wake", TeamStats.WakeTime) and the product's own time;
// the waits for the park are outside the timer.
func BenchmarkTeamWake(b *testing.B) {
	prev := SetThreads(2)
	defer SetThreads(prev)
	rng := rand.New(rand.NewPCG(13, 14))
	m, _ := randMatrix(rng, BF16, 2048, 512) // minWakeElems: wakes the member
	x := randVec(rng, 512)
	out := make([]float32, 2048)
	MatVec(out, m, x) // starts the team
	mb := teamFor(2).members[0]
	TraceTeam(true)
	defer TraceTeam(false)
	before := ReadTeamStats()
	for b.Loop() {
		b.StopTimer()
		awaitPark(b, mb)
		b.StartTimer()
		MatVec(out, m, x)
	}
	b.StopTimer()
	awaitPark(b, mb) // the last wake counted
	d := ReadTeamStats().Sub(before)
	if d.Wakes > 0 {
		b.ReportMetric(d.WakeTime.Seconds()*1e6/float64(d.Wakes), "us/wake")
		b.ReportMetric(float64(d.Wakes)/float64(b.N), "wakes/op")
	}
}

// awaitPark waits (up to 2 s: a loaded machine may keep a member from
// running to its park a while) for member m to park, and fails tb if it
// does not.
func awaitPark(tb testing.TB, m *member) {
	for deadline := time.Now().Add(2 * time.Second); !m.parked.Load(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the member did not park within 2 s without work")
		}
	}
}
