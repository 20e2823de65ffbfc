package kernels

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The pure-Go row kernels of the "go" path (path.go): each computes
// out[r] = Dot(row r of w, x) for r < len(out), where w holds len(out) rows
// of len(x) elements.

func matVecF32Go(out, w, x []float32) {
	cols := len(x)
	for r := range out {
		out[r] = dotF32Go(w[r*cols:(r+1)*cols], x)
	}
}

func matVecBF16Go(out []float32, w []uint16, x []float32) {
	cols := len(x)
	for r := range out {
		out[r] = dotBF16Go(w[r*cols:(r+1)*cols], x)
	}
}

func matVecF16Go(out []float32, w []uint16, x []float32) {
	tab := f16Table()
	cols := len(x)
	for r := range out {
		out[r] = dotF16Go(w[r*cols:(r+1)*cols], x, tab)
	}
}

// f16Table maps every F16 bit pattern to its exact float32 value (256 KiB,
// built on first use): one load per weight in the F16 row kernel.
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	t := new([1 << 16]float32)
	for h := range t {
		t[h] = F16ToF32(uint16(h))
	}
	return t
})

// minParallelElems is the matrix size (weights times vectors) below which
// MatVec and MatMul stay on the calling goroutine: starting goroutines
// costs more than the work saves.
const minParallelElems = 64 << 10

// matMulBlockBytes bounds the weight bytes MatMul applies to all n vectors
// before moving on, so that the block stays in L2 while it is reused.
const matMulBlockBytes = 128 << 10

var threads atomic.Int32 // 0: runtime.GOMAXPROCS(0)

// Threads returns the number of goroutines MatVec and MatMul split their
// rows over: the value set by SetThreads, by default runtime.GOMAXPROCS(0).
func Threads() int {
	if n := threads.Load(); n > 0 {
		return int(n)
	}
	return runtime.GOMAXPROCS(0)
}

// SetThreads sets the number of goroutines MatVec and MatMul use; n < 1
// restores the default, runtime.GOMAXPROCS(0). It returns the previous
// Threads() value. Results never depend on it: only speed does.
func SetThreads(n int) (prev int) {
	if n < 1 {
		n = 0
	}
	old := threads.Swap(int32(min(n, 1<<20)))
	if old > 0 {
		return int(old)
	}
	return runtime.GOMAXPROCS(0)
}

// MatVec computes out[r] = Dot(w[r,:], x) for every row r, with weights
// widened (Q8, NF4: dequantized) exactly to float32. len(out) must be w.Rows and len(x) w.Cols;
// it panics otherwise, or if w is invalid. Large matrices are split into
// row ranges that Threads() goroutines compute concurrently; the result is
// bit-identical whatever the split.
func MatVec(out []float32, w Matrix, x []float32) {
	checkShapes("MatVec", out, w, x, 1)
	p := cur()
	elems := w.Rows * w.Cols
	if parts := partsNow(w.Rows, elems); parts > 1 {
		parallelRows(parts, w.Rows, func(_, r0, r1 int) {
			matVecRows(&p.rowKernels, out[r0:r1], w, x, r0, r1)
		})
	} else {
		matVecRows(&p.rowKernels, out, w, x, 0, w.Rows)
	}
	productEnded(elems)
}

// MatMul applies w to n vectors: x holds n vectors of w.Cols elements one
// after the other, and out[i*w.Rows+r] receives Dot(w[r,:], x[i*w.Cols:]).
// Every element is bit-identical to MatVec on that vector, whatever n,
// Threads() or the blocking. It panics on mismatched lengths.
func MatMul(out []float32, w Matrix, x []float32, n int) {
	checkShapes("MatMul", out, w, x, n)
	if n == 0 {
		return
	}
	if n == 1 {
		// One vector (a decode step) reuses nothing: stream w as MatVec
		// does, in one pass rather than in cache-sized blocks.
		MatVec(out, w, x)
		return
	}
	p := cur()
	elems := w.Rows * w.Cols * n
	if parts := partsNow(w.Rows, elems); parts > 1 {
		parallelRows(parts, w.Rows, func(_, r0, r1 int) {
			p.matMulRows(out, w, x, n, r0, r1)
		})
	} else {
		p.matMulRows(out, w, x, n, 0, w.Rows)
	}
	productEnded(elems)
}

// Product is one matrix of MatMulEach and where its results go.
type Product struct {
	Out []float32
	W   Matrix
}

// MatMulEach computes MatMul(p.Out, p.W, x, n) for every p of ps, all
// applied to the same n vectors x (q, k and v of a layer; an expert's gate
// and up). For one vector (a decode step) their rows are split together
// over one parallel region instead of one region each. Every element is
// bit-identical to the separate products'. It panics on mismatched lengths.
func MatMulEach(x []float32, n int, ps []Product) {
	if n != 1 {
		for _, p := range ps {
			MatMul(p.Out, p.W, x, n)
		}
		return
	}
	rows, elems := 0, 0
	for _, p := range ps {
		checkShapes("MatMulEach", p.Out, p.W, x, 1)
		rows += p.W.Rows
		elems += p.W.Rows * p.W.Cols
	}
	k := cur()
	if parts := partsNow(rows, elems); parts > 1 {
		parallelRows(parts, rows, func(_, r0, r1 int) { eachRows(&k.rowKernels, ps, x, r0, r1) })
	} else {
		eachRows(&k.rowKernels, ps, x, 0, rows)
	}
	productEnded(elems)
}

// eachRows computes rows [r0, r1) of ps's matrices stacked in order.
func eachRows(k *rowKernels, ps []Product, x []float32, r0, r1 int) {
	base := 0
	for _, p := range ps {
		if lo, hi := max(r0, base), min(r1, base+p.W.Rows); lo < hi {
			matVecRows(k, p.Out[lo-base:hi-base], p.W, x, lo-base, hi-base)
		}
		base += p.W.Rows
		if base >= r1 {
			return
		}
	}
}

func checkShapes(op string, out []float32, w Matrix, x []float32, n int) {
	if err := w.Validate(); err != nil {
		panic(fmt.Sprintf("kernels.%s: %v", op, err))
	}
	if n < 0 || len(x) != n*w.Cols || len(out) != n*w.Rows {
		panic(fmt.Sprintf("kernels.%s: %dx%d matrix, %d vectors: len(x) = %d (want %d), len(out) = %d (want %d)",
			op, w.Rows, w.Cols, n, len(x), n*w.Cols, len(out), n*w.Rows))
	}
}

// minWakeElems is the job size (multiply-adds) below which a product
// that finds the team's members parked runs on the caller alone, unless
// products are coming densely (the previous one of at least
// minParallelElems ended less than denseGap ago), where the members,
// once woken, spin on to the next ones. Waking a member costs a futex
// and, in a VM, the other vCPU's wake-up: on the 2-vCPU VM of
// docs/BENCHMARKS.md a BF16 product of up to 1M elements after the
// members parked took longer on 2 threads than on 1 (go test -bench
// MatVecWake: 64K elements 15.9 against 9.1 us, 1M 151 against 124 us),
// while one whose members spin gains from 64K up. Members park where
// products come far apart: a worker between layers (its activation a
// network hop away), the main node between tokens.
const minWakeElems = 1 << 20

// denseGap: see minWakeElems.
const denseGap = 100 * time.Microsecond

// lastEnd is when the last product of minParallelElems or more ended, in
// nanoseconds since clockStart.
var (
	lastEnd    atomic.Int64
	clockStart = time.Now()
)

// productEnded records the end of a product of elems multiply-adds.
func productEnded(elems int) {
	if elems >= minParallelElems {
		lastEnd.Store(int64(time.Since(clockStart)))
	}
}

// partsFor returns how many goroutines a job of elems multiply-adds over
// rows could split over: by size alone, the same at every call.
func partsFor(rows, elems int) int {
	if elems < minParallelElems {
		return 1
	}
	return min(Threads(), rows)
}

// partsNow is partsFor for a product about to run: 1, the caller alone,
// where the job is under minWakeElems, the team's members are parked and
// the previous product ended more than denseGap ago. The caller reports
// the product's end (productEnded).
func partsNow(rows, elems int) int {
	parts := partsFor(rows, elems)
	if parts == 1 || elems >= minWakeElems {
		return parts
	}
	if int64(time.Since(clockStart))-lastEnd.Load() > int64(denseGap) && teamAsleep() {
		if tracing.Load() {
			teamTrace.alone.Add(1)
		}
		return 1
	}
	return parts
}

// chunksPerPart is how many row chunks parallelRows makes per goroutine.
const chunksPerPart = 4

func chunksFor(parts, rows int) int { return max(1, min(rows, parts*chunksPerPart)) }

// ParallelChunks is how many chunks ParallelFor splits items into for
// work multiply-adds in all (1: it runs them on the caller alone).
func ParallelChunks(items, work int) int {
	if parts := partsFor(items, work); parts > 1 {
		return chunksFor(parts, items)
	}
	return 1
}

// ParallelFor runs fn over chunks contiguous ranges [i0, i1) covering
// [0, items) (chunks from ParallelChunks) on the thread team, as MatVec
// splits its rows, and returns when all are done; c < chunks numbers the
// range, for scratch memory of its own. One chunk runs on the caller. The
// split must not change results: each item must be computed the same way
// wherever it runs.
func ParallelFor(chunks, items int, fn func(c, i0, i1 int)) {
	chunks = min(chunks, items)
	if chunks <= 1 {
		if items > 0 {
			fn(0, 0, items)
		}
		return
	}
	parallelChunks(min(Threads(), chunks), items, chunks, fn)
}

// parallelRows runs fn over contiguous row ranges covering [0, rows) on
// the caller and the persistent team (team.go), and returns when all are
// done; c numbers the range. The ranges are chunksPerPart times more than
// parts and each goroutine takes the next one free: when another process
// holds a core (a shared node), the goroutines that run take over the
// chunks of the one that does not, instead of waiting for its fixed share.
func parallelRows(parts, rows int, fn func(c, r0, r1 int)) {
	parallelChunks(parts, rows, chunksFor(parts, rows), fn)
}

// parallelChunks is parallelRows over a given number of chunks (c <
// chunks: a chunk's own scratch memory, for ParallelFor).
func parallelChunks(parts, rows, chunks int, fn func(c, r0, r1 int)) {
	if teamFor(Threads()).run(rows, chunks, fn) {
		return
	}
	// the team is running another goroutine's product: start goroutines
	if tracing.Load() {
		teamTrace.spawned.Add(1)
	}
	var next atomic.Int64
	work := func() {
		for c := int(next.Add(1) - 1); c < chunks; c = int(next.Add(1) - 1) {
			fn(c, rows*c/chunks, rows*(c+1)/chunks)
		}
	}
	var wg sync.WaitGroup
	for range parts - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
}

// matVecRows computes rows [r0, r1) of w times x into out[:r1-r0] with
// p's row kernels.
func matVecRows(p *rowKernels, out []float32, w Matrix, x []float32, r0, r1 int) {
	rowBytes := w.DType.RowBytes(w.Cols)
	b := w.Data[r0*rowBytes : r1*rowBytes]
	switch w.DType {
	case F32:
		p.matVecF32(out, f32View(b), x)
	case BF16:
		p.matVecBF16(out, u16View(b), x)
	case F16:
		p.matVecF16(out, u16View(b), x)
	case Q8:
		p.matVecQ8(out, b, x)
	case NF4:
		p.matVecNF4(out, b, x)
	case MXFP4:
		sb := MXFP4.ScaleBytes(w.Cols)
		p.matVecMXFP4(out, b, w.Scales[r0*sb:r1*sb], x)
	case F8E4M3:
		p.matVecF8(out, b, w.Scales, x, r0)
	case BF16P:
		p.matVecBF16P(out, b, packedTable(w.Scales), x)
		fixExceptionRows(p, out, w, x, r0)
	}
}

// matMulRowsGo computes rows [r0, r1) for all n vectors, a block of rows
// at a time so that each block is read from memory once for all vectors.
func matMulRowsGo(out []float32, w Matrix, x []float32, n, r0, r1 int) {
	matMulRowsByVector(&goRows, out, w, x, n, r0, r1)
}

// matMulRowsByVector is MatMul as blocks of MatVecs with p's row kernels.
func matMulRowsByVector(p *rowKernels, out []float32, w Matrix, x []float32, n, r0, r1 int) {
	rows, cols := w.Rows, w.Cols
	block := max(1, matMulBlockBytes/max(1, w.DType.RowBytes(cols)))
	for b0 := r0; b0 < r1; b0 += block {
		b1 := min(b0+block, r1)
		for i := range n {
			matVecRows(p, out[i*rows+b0:i*rows+b1], w, x[i*cols:(i+1)*cols], b0, b1)
		}
	}
}
