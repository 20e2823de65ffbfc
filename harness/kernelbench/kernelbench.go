// Package kernelbench is `odmoe bench kernels`: DRAM bandwidth, matvec
// GB/s against it, prefill matmul GFLOP/s, and local decode on the small
// preset, pure Go against the SIMD path, with the roofline fractions and
// thread scaling they give.
package kernelbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/testbed"
	"github.com/rs/zerolog"
)

// Report is what Run measured: the JSON that `odmoe bench kernels -json` writes.
type Report struct {
	Date     string             `json:"date"`
	Machine  Machine            `json:"machine"`
	Path     string             `json:"path"`  // the SIMD path measured
	Paths    []string           `json:"paths"` // available on this CPU
	Rounds   int                `json:"rounds"`
	DRAMGBps map[string]float64 `json:"dram_gbps"` // threads -> roofline GB/s
	DRAM     []dramResult       `json:"dram"`
	MatVec   []matVecResult     `json:"matvec"`
	MatMul   []matMulResult     `json:"matmul"`
	Decode   *decodeResult      `json:"decode,omitempty"`
}

type Machine struct {
	CPU        string   `json:"cpu"`
	Features   []string `json:"features"` // the CPU's SIMD features (kernels.Features)
	CPUs       int      `json:"cpus"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	GOARCH     string   `json:"goarch"`
	Go         string   `json:"go"`
	LoadBefore string   `json:"loadavg_before"` // /proc/loadavg: 1, 5, 15 min
	LoadAfter  string   `json:"loadavg_after"`
}

// rate summarises the runs of one measurement. A run is clean when this
// process had the CPU for at least 75% of threads x wall time (no other
// process took a core meanwhile); the best clean run is reported, or the
// best run at all when none was clean.
type rate struct {
	Best              float64 `json:"best"`
	Worst             float64 `json:"worst"`
	Runs              int     `json:"runs"`
	Clean             int     `json:"clean_runs"`
	bestAll, worstAll float64
}

func (r *rate) add(v float64, clean bool) {
	if r.Runs == 0 {
		r.worstAll, r.Worst = math.Inf(1), math.Inf(1)
	}
	r.Runs++
	r.bestAll, r.worstAll = max(r.bestAll, v), min(r.worstAll, v)
	if clean {
		r.Clean++
		r.Best, r.Worst = max(r.Best, v), min(r.Worst, v)
	}
	if r.Clean == 0 {
		r.Best, r.Worst = r.bestAll, r.worstAll
	}
}

func (r rate) String() string {
	return fmt.Sprintf("%.1f (%.1f..%.1f, %d/%d clean)", r.Best, r.Worst, r.Best, r.Clean, r.Runs)
}

// dramResult holds the two DRAM read probes at one thread count; GBps,
// the better of the two, is the roofline the matvec figures are divided
// by.
type dramResult struct {
	Threads int     `json:"threads"`
	GBps    float64 `json:"gbps"`
	Sum     rate    `json:"sum_gbps"`     // kernels.Sum: one stream per thread
	Streams rate    `json:"streams_gbps"` // F32 MatVec, 4096 columns: four streams per thread
}

// matVecResult is one dtype and thread count over both Mixtral shapes:
// gbps is their bytes over their time (best clean run of each shape).
type matVecResult struct {
	DType            string        `json:"dtype"`
	Threads          int           `json:"threads"`
	GBps             float64       `json:"gbps"`
	RooflineFraction float64       `json:"roofline_fraction"`
	Shapes           []shapeResult `json:"shapes"`
}

type shapeResult struct {
	Shape            string  `json:"shape"`
	GBps             rate    `json:"gbps"`
	RooflineFraction float64 `json:"roofline_fraction"`
}

type matMulResult struct {
	Path    string `json:"path"`
	Route   string `json:"route"` // kernels.MatMulRoute: which of the path's ways the product took
	DType   string `json:"dtype"`
	Shape   string `json:"shape"`
	Tokens  int    `json:"tokens"`
	Threads int    `json:"threads"`
	GFLOPs  rate   `json:"gflops"`
}

type decodeResult struct {
	Preset       string  `json:"preset"`
	Model        string  `json:"model"`
	Tokens       int     `json:"tokens"`
	Threads      int     `json:"threads"`
	GoTokPerS    float64 `json:"go_tokens_per_s"`
	SIMDPath     string  `json:"simd_path"`
	SIMDTokPerS  float64 `json:"simd_tokens_per_s"`
	Speedup      float64 `json:"speedup"`
	BitIdentical bool    `json:"bit_identical"` // logits of every step, both paths
	// The SIMD path at each thread count ("1", "2", ...): tokens/s, the
	// fraction of that count's DRAM roofline it reaches (BytesPerToken x
	// tokens/s over the roofline measured in the same run), and the CPUs
	// the process kept busy (CPU time over wall time).
	BytesPerToken    int64              `json:"bytes_per_token"`
	TokPerSByThreads map[string]float64 `json:"simd_tokens_per_s_by_threads"`
	RooflineFraction map[string]float64 `json:"roofline_fraction"`
	CPUBusy          map[string]float64 `json:"cpu_busy"`
	// Scaling is each count's tokens/s over one thread's; ScalingCeiling
	// the most it could be in this run: the fastest weight stream
	// measured at that count (the DRAM roofline or the BF16 matvec,
	// whichever streamed more) over the GB/s one thread's decode already
	// reads. Where one thread decodes near the bandwidth of two, two
	// cannot gain more.
	Scaling        map[string]float64 `json:"scaling"`
	ScalingCeiling map[string]float64 `json:"scaling_ceiling"`
	// ThreadsBitIdentical: every thread count gave the same logits.
	ThreadsBitIdentical bool `json:"threads_bit_identical"`
	// Trace is, at each thread count, where its faster run's time went.
	Trace map[string]decodeTrace `json:"trace"`
	// SideBySide is a run at each thread count held to DRAM probes made
	// between its blocks of steps, with llama.cpp's steps between them
	// where it was given (sideBySideRun).
	SideBySide []sideBySide `json:"side_by_side"`
}

// decodeTrace is one decode run's passes (a token each) and the thread
// team's counts (kernels.TeamStats), a token's each.
type decodeTrace struct {
	// Passes is the spread of the passes' times.
	Passes model.PassSpread `json:"decode_pass_ms"`
	// Regions are the parallel regions run on the team; RegionMs their
	// time, BarrierMs the part of it the caller waited for the members'
	// last chunks, SerialMs the step's time outside them (on one thread:
	// all of it).
	Regions   float64 `json:"regions"`
	RegionMs  float64 `json:"region_ms"`
	BarrierMs float64 `json:"barrier_ms"`
	SerialMs  float64 `json:"serial_ms"`
	// MemberShare is the share of the regions' chunks the members ran;
	// Wakes the members woken from parking, WakeUs the mean time from a
	// wake-up to the member running, Parks their parkings, Alone the
	// products run on the caller alone as the members slept.
	MemberShare float64 `json:"member_share"`
	Wakes       float64 `json:"wakes"`
	WakeUs      float64 `json:"wake_us"`
	Parks       float64 `json:"parks"`
	Alone       float64 `json:"alone"`
	// MinorFaults and MajorFaults are the process's page faults, GCs
	// the garbage collections during the whole run (not a token's).
	MinorFaults float64 `json:"minor_faults"`
	MajorFaults float64 `json:"major_faults"`
	GCs         uint32  `json:"gcs"`
}

// newDecodeTrace makes the trace of a run of decode passes (each one's
// time) over which the team counted team, the process faulted minor and
// major pages and collected garbage gcs times.
func newDecodeTrace(passes []time.Duration, team kernels.TeamStats, minor, major int64, gcs uint32) decodeTrace {
	n := float64(len(passes))
	var wall time.Duration
	for _, d := range passes {
		wall += d
	}
	tr := decodeTrace{
		Regions: float64(team.Regions) / n, RegionMs: team.RegionTime.Seconds() * 1e3 / n, BarrierMs: team.BarrierTime.Seconds() * 1e3 / n,
		SerialMs: (wall - team.RegionTime).Seconds() * 1e3 / n,
		Wakes:    float64(team.Wakes) / n, Parks: float64(team.Parks) / n, Alone: float64(team.Alone) / n,
		MinorFaults: float64(minor) / n, MajorFaults: float64(major) / n, GCs: gcs,
	}
	if spread := model.SpreadOf(passes); spread != nil {
		tr.Passes = *spread
	}
	if team.Wakes > 0 {
		tr.WakeUs = team.WakeTime.Seconds() * 1e6 / float64(team.Wakes)
	}
	if team.Chunks > 0 {
		tr.MemberShare = float64(team.MemberChunks) / float64(team.Chunks)
	}
	return tr
}

// Mixtral-8x7B expert shapes: w1/w3 are 14336x4096, w2 4096x14336.
var mixtralShapes = [][2]int{{4096, 14336}, {14336, 4096}}

// Options say what Run measures.
type Options struct {
	SetMiB, DRAMMiB int // MiB of weights a matvec rotates through per dtype; MiB read for DRAM bandwidth
	Rounds          int // rounds of the bandwidth and matvec measurements, interleaved
	Threads         []int
	DTypes          []kernels.DType // matvec weight dtypes
	PrefillTokens   []int           // tokens per prefill matmul
	DecodeTokens    int             // decode steps timed per path on the model in ModelDir; 0 skips decode
	ModelDir        string          // the small preset (generated there if absent)
	// Llama, where set, runs llama.cpp's steps between the side-by-side
	// run's blocks (a GGUF of the model in ModelDir).
	Llama LlamaOptions
}

// Run measures DRAM bandwidth, matvec GB/s against it, prefill GFLOP/s
// and local decode, pure Go against the kernels' current path, as o
// says, logging its progress to log.
func Run(ctx context.Context, o Options, log zerolog.Logger) (*Report, error) {
	simd := kernels.Path()
	defer kernels.SetThreads(kernels.SetThreads(0))

	rep := &Report{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  machineInfo(),
		Path:     simd,
		Paths:    kernels.Paths(),
		Rounds:   o.Rounds,
		DRAMGBps: map[string]float64{},
	}
	log.Info().Str("path", simd).Strs("paths", rep.Paths).Str("loadavg", rep.Machine.LoadBefore).Msg("bench kernels")

	log.Info().Int("dram_mib", o.DRAMMiB).Int("set_mib", o.SetMiB).Msg("filling buffers")
	dram := newDRAMProbe(o.DRAMMiB)
	arenas := map[kernels.DType][]kernels.Matrix{}
	for _, dt := range append(o.DTypes, kernels.BF16) { // BF16 for prefill too
		if arenas[dt] == nil && dt != kernels.BF16P {
			arenas[dt] = benchMatrices(dt, o.SetMiB)
		}
	}
	// BF16P's layout depends on the columns: the BF16 set packed once
	// for each shape
	var packed [][]kernels.Matrix
	if slices.Contains(o.DTypes, kernels.BF16P) {
		for _, s := range mixtralShapes {
			var ms []kernels.Matrix
			for _, m := range arenas[kernels.BF16] {
				m.Rows, m.Cols = s[0], s[1]
				p, ok, err := kernels.PackBF16(m, nil)
				if err != nil || !ok {
					return nil, fmt.Errorf("kernelbench: packing a %dx%d BF16 matrix: %v", s[0], s[1], err)
				}
				ms = append(ms, p)
			}
			packed = append(packed, ms)
		}
	}
	log.Info().Int("rounds", o.Rounds).Msg("DRAM read bandwidth and matvec, interleaved")
	if err := benchBandwidth(ctx, rep, dram, arenas, packed, o.DTypes, o.Threads, o.Rounds); err != nil {
		return nil, err
	}
	dram = nil

	log.Info().Msg("prefill matmul")
	ms := arenas[kernels.BF16]
	for _, s := range mixtralShapes {
		for _, n := range o.PrefillTokens {
			for _, th := range o.Threads {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				rep.MatMul = append(rep.MatMul, benchMatMul(ms, s[0], s[1], n, th, 5, simd))
			}
		}
	}
	// The pure-Go reference, once: one shape, 16 tokens, all o.Threads.
	rep.MatMul = append(rep.MatMul, benchMatMul(ms, 14336, 4096, 16, o.Threads[len(o.Threads)-1], 1, "go"))
	arenas, ms = nil, nil
	runtime.GC()

	if o.DecodeTokens > 0 {
		dir := o.ModelDir
		log.Info().Str("model", dir).Int("tokens", o.DecodeTokens).Msg("local decode, small preset")
		d, err := benchDecode(ctx, dir, o.DecodeTokens, simd, o.Threads, rep.DRAMGBps, o.Llama)
		if err != nil {
			return nil, err
		}
		d.scaling(bestStreams(rep))
		rep.Decode = d
	}
	rep.Machine.LoadAfter = testbed.LoadAvg()

	return rep, nil
}

// Check is an error when the report's decode found logits that differ:
// between the SIMD path and pure Go, or between thread counts.
func (rep *Report) Check() error {
	if rep.Decode != nil && !rep.Decode.BitIdentical {
		return fmt.Errorf("local decode: the %s path's logits differ from the pure-Go path's", rep.Path)
	}
	if rep.Decode != nil && !rep.Decode.ThreadsBitIdentical {
		return fmt.Errorf("local decode: the %s path's logits differ between thread counts", rep.Path)
	}
	return nil
}

// benchBandwidth runs the DRAM probes and every matvec (dtype, shape,
// threads) once per round, rounds times, and fills in rep.
// packed holds BF16P's matrices, one set a shape of mixtralShapes.
func benchBandwidth(ctx context.Context, rep *Report, dram *dramProbe, arenas map[kernels.DType][]kernels.Matrix, packed [][]kernels.Matrix, dtypes []kernels.DType, threads []int, rounds int) error {
	drams := make([]dramResult, len(threads))
	type mvKey struct {
		dt      kernels.DType
		shape   int
		threads int
	}
	mv := map[mvKey]*rate{}
	next := map[kernels.DType]int{} // rotation: never reuse a matrix that may be cached
	for range rounds {
		for i, th := range threads {
			if err := ctx.Err(); err != nil {
				return err
			}
			drams[i].Threads = th
			dram.run(&drams[i], th)
		}
		for _, dt := range dtypes {
			for si, s := range mixtralShapes {
				ms := arenas[dt]
				if dt == kernels.BF16P {
					ms = packed[si]
				}
				for _, th := range threads {
					k := mvKey{dt, si, th}
					if mv[k] == nil {
						mv[k] = &rate{}
					}
					x, out := benchVec(s[1]), make([]float32, s[0])
					calls := 2 * len(ms)
					kernels.SetThreads(th)
					secs, clean := timed(th, func() {
						for range calls {
							m := ms[next[dt]%len(ms)]
							next[dt]++
							if dt != kernels.BF16P {
								m.Rows, m.Cols = s[0], s[1]
							}
							kernels.MatVec(out, m, x)
						}
					})
					mv[k].add(float64(calls*s[0]*dt.RowBytes(s[1]))/secs/1e9, clean)
				}
			}
		}
	}
	for _, d := range drams {
		d.GBps = max(d.Sum.Best, d.Streams.Best)
		rep.DRAM = append(rep.DRAM, d)
		rep.DRAMGBps[strconv.Itoa(d.Threads)] = d.GBps
	}
	for _, dt := range dtypes {
		for _, th := range threads {
			roof := rep.DRAMGBps[strconv.Itoa(th)]
			res := matVecResult{DType: dt.String(), Threads: th}
			var bytes, secs float64
			for si, s := range mixtralShapes {
				r := *mv[mvKey{dt, si, th}]
				size := float64(s[0] * dt.RowBytes(s[1])) // BF16P: its packed bytes
				bytes += size
				secs += size / (r.Best * 1e9)
				res.Shapes = append(res.Shapes, shapeResult{Shape: fmt.Sprintf("%dx%d", s[0], s[1]),
					GBps: r, RooflineFraction: fraction(r.Best, roof)})
			}
			res.GBps = bytes / secs / 1e9
			res.RooflineFraction = fraction(res.GBps, roof)
			rep.MatVec = append(rep.MatVec, res)
		}
	}
	return nil
}

// timed runs fn and returns its wall time and whether the run was clean:
// this process had the CPU for >= 75% of threads x wall time, so no other
// process took a core from it for long. Where the CPU time is unknown
// (no Linux /proc), every run counts as clean.
func timed(threads int, fn func()) (secs float64, clean bool) {
	c0, ok := processCPU()
	t0 := time.Now()
	fn()
	wall := time.Since(t0)
	c1, ok1 := processCPU()
	return wall.Seconds(), !ok || !ok1 || c1-c0 >= wall*time.Duration(threads)*3/4
}

// processCPU returns the CPU time all threads of this process have run,
// in nanoseconds (Linux: /proc/self/task/*/schedstat).
func processCPU() (time.Duration, bool) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, false
	}
	var total int64
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread has exited
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			total += n
		}
	}
	return time.Duration(total), true
}

func fraction(gbps, dram float64) float64 {
	if dram <= 0 {
		return 0
	}
	return gbps / dram
}

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GOARCH: runtime.GOARCH,
		Go: runtime.Version(), LoadBefore: testbed.LoadAvg(), Features: kernels.Features()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// dramProbe reads a buffer far larger than any cache two ways, on the
// fastest path: kernels.Sum of each goroutine's share (one sequential
// stream each, the plain way to measure it), and an F32 MatVec with 4096
// columns over all of it (x stays in L1, so it is a read of four streams
// per goroutine with one multiply and add per element). Either may be the
// faster; the better one is the roofline.
type dramProbe struct {
	floats []float32
	m      kernels.Matrix
	x, out []float32
}

func newDRAMProbe(mib int) *dramProbe {
	const cols = 4096
	buf := make([]byte, mib<<20/(4*cols)*(4*cols))
	for i := 0; i < len(buf); i += 4 {
		u := math.Float32bits(float32(i>>2&1023) / 1024)
		buf[i], buf[i+1], buf[i+2], buf[i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	m := kernels.Matrix{DType: kernels.F32, Rows: len(buf) / (4 * cols), Cols: cols, Data: buf}
	return &dramProbe{
		// The bytes are float32s; Sum reads them in place.
		floats: unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(buf))), len(buf)/4),
		m:      m, x: benchVec(cols), out: make([]float32, m.Rows),
	}
}

// run adds one run of each probe with threads goroutines to r.
func (p *dramProbe) run(r *dramResult, threads int) {
	prev := kernels.Path()
	kernels.SetPath(kernels.Paths()[0])
	defer kernels.SetPath(prev)
	secs, clean := timed(threads, func() {
		var wg sync.WaitGroup
		for t := range threads {
			part := p.floats[len(p.floats)*t/threads : len(p.floats)*(t+1)/threads]
			wg.Go(func() { kernels.Sum(part) })
		}
		wg.Wait()
	})
	r.Sum.add(float64(4*len(p.floats))/secs/1e9, clean)
	kernels.SetThreads(threads)
	secs, clean = timed(threads, func() { kernels.MatVec(p.out, p.m, p.x) })
	r.Streams.add(float64(len(p.m.Data))/secs/1e9, clean)
}

// onTeam reads the buffer both ways with threads on the thread team that
// decodes, on the current path (a side-by-side run's probe between
// blocks), and returns the faster read's time: the roofline of the
// moment, as a run's roofline is the better of the two probes.
func (p *dramProbe) onTeam(threads int) time.Duration {
	t0 := time.Now()
	kernels.ParallelFor(threads, len(p.floats), func(_, i0, i1 int) { kernels.Sum(p.floats[i0:i1]) })
	t1 := time.Now()
	kernels.MatVec(p.out, p.m, p.x)
	return min(t1.Sub(t0), time.Since(t1))
}

// benchMatrices returns matrices of dt, each as large as a Mixtral expert
// matrix, totalling at least setMiB, filled with N(0, 0.02) weights.
func benchMatrices(dt kernels.DType, setMiB int) []kernels.Matrix {
	rng := rand.New(rand.NewPCG(71, 72))
	vals := make([]float32, 1<<16)
	pattern := make([]byte, len(vals)*dt.Size())
	for i := range vals {
		v := float32(rng.NormFloat64() * 0.02)
		switch dt {
		case kernels.F32:
			u := math.Float32bits(v)
			pattern[4*i], pattern[4*i+1], pattern[4*i+2], pattern[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		case kernels.BF16:
			h := kernels.F32ToBF16(v)
			pattern[2*i], pattern[2*i+1] = byte(h), byte(h>>8)
		case kernels.F16:
			h := kernels.F32ToF16(v)
			pattern[2*i], pattern[2*i+1] = byte(h), byte(h>>8)
		}
	}
	size := mixtralShapes[0][0] * mixtralShapes[0][1] * dt.Size()
	count := (setMiB<<20 + size - 1) / size
	arena := make([]byte, count*size)
	for off := 0; off < len(arena); off += len(pattern) {
		copy(arena[off:], pattern)
	}
	ms := make([]kernels.Matrix, count)
	for k := range ms {
		ms[k] = kernels.Matrix{DType: dt, Data: arena[k*size : (k+1)*size]}
	}
	return ms
}

// benchMatMul times MatMul of n vectors (prefill) on path, one rotating
// matrix per run.
func benchMatMul(ms []kernels.Matrix, rows, cols, n, threads, runs int, path string) matMulResult {
	prev := kernels.Path()
	kernels.SetPath(path)
	defer kernels.SetPath(prev)
	kernels.SetThreads(threads)
	x := benchVec(n * cols)
	out := make([]float32, n*rows)
	res := matMulResult{Path: path, Route: kernels.MatMulRoute(ms[0].DType, cols, n), DType: ms[0].DType.String(), Shape: fmt.Sprintf("%dx%d", rows, cols),
		Tokens: n, Threads: threads}
	for k := range runs {
		m := ms[k%len(ms)]
		m.Rows, m.Cols = rows, cols
		secs, clean := timed(threads, func() { kernels.MatMul(out, m, x, n) })
		res.GFLOPs.add(float64(2*rows*cols*n)/secs/1e9, clean)
	}
	return res
}

func benchVec(n int) []float32 {
	rng := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// benchDecode times greedy decode steps after a 16-token prompt on the
// small preset (generated into dir if absent, as model/bench_test.go
// does), on the pure-Go path and on simd, and checks that both produce
// the same logits bit for bit; then simd at each thread count, against
// that count's DRAM roofline (dram, GB/s by thread count); then a
// side-by-side run at each count, with llama.cpp's steps where llama
// names them.
func benchDecode(ctx context.Context, dir string, steps int, simd string, threads []int, dram map[string]float64, llama LlamaOptions) (*decodeResult, error) {
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		tmp := dir + ".partial"
		os.RemoveAll(tmp)
		if err := synth.Generate(tmp, synth.Options{Preset: "small", Seed: 1}); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return nil, err
		}
	}
	m, err := model.Load(dir, model.LoadOptions{Weights: model.WeightsAuto}) // as odmoe run -role local
	if err != nil {
		return nil, err
	}
	defer m.Close()
	prompt := make([]int, 16)
	for i := range prompt {
		prompt[i] = (i*7919 + 1) % m.Config.VocabSize
	}
	var busy float64      // the last run's CPUs busy
	var trace decodeTrace // the last run's
	run := func(path string) (tokPerS float64, digest []byte, err error) {
		if err := kernels.SetPath(path); err != nil {
			return 0, nil, err
		}
		s := model.NewSession(m, model.NewResidentExperts(m), len(prompt)+steps)
		logits, err := s.Forward(ctx, prompt)
		if err != nil {
			return 0, nil, err
		}
		h := fnv.New64a()
		hashLogits(h, logits)
		times := make([]time.Duration, steps)
		var gc0, gc1 runtime.MemStats
		runtime.ReadMemStats(&gc0)
		minor0, major0 := procmem.PageFaults()
		kernels.TraceTeam(true)
		defer kernels.TraceTeam(false)
		team0 := kernels.ReadTeamStats()
		t0, cpu0 := time.Now(), procmem.CPUTime()
		for i := range steps {
			ts := time.Now()
			if logits, err = s.Forward(ctx, []int{model.Argmax(logits)}); err != nil {
				return 0, nil, err
			}
			times[i] = time.Since(ts)
			hashLogits(h, logits)
		}
		wall := time.Since(t0)
		busy = (procmem.CPUTime() - cpu0).Seconds() / wall.Seconds()
		team := kernels.ReadTeamStats().Sub(team0)
		minor1, major1 := procmem.PageFaults()
		runtime.ReadMemStats(&gc1)
		trace = newDecodeTrace(times, team, minor1-minor0, major1-major0, gc1.NumGC-gc0.NumGC)
		return float64(steps) / wall.Seconds(), h.Sum(nil), nil
	}
	// Warm the page cache and the CPU with a short run first.
	if _, _, err := run(simd); err != nil {
		return nil, err
	}
	d := &decodeResult{Preset: "small", Model: dir, Tokens: steps, Threads: kernels.Threads(), SIMDPath: simd}
	var goDigest, simdDigest []byte
	for _, p := range []string{"go", simd, "go", simd} {
		rate, digest, err := run(p)
		if err != nil {
			return nil, err
		}
		if p == "go" {
			d.GoTokPerS, goDigest = max(d.GoTokPerS, rate), digest
		} else {
			d.SIMDTokPerS, simdDigest = max(d.SIMDTokPerS, rate), digest
		}
	}
	d.Speedup = d.SIMDTokPerS / d.GoTokPerS
	d.BitIdentical = bytes.Equal(goDigest, simdDigest)
	if err := kernels.SetPath(simd); err != nil {
		return nil, err
	}
	// simd at each thread count, interleaved, the better of two runs
	d.BytesPerToken = m.DecodeBytesPerToken()
	d.TokPerSByThreads, d.RooflineFraction, d.CPUBusy, d.Trace = map[string]float64{}, map[string]float64{}, map[string]float64{}, map[string]decodeTrace{}
	d.ThreadsBitIdentical = true
	prev := kernels.SetThreads(0)
	defer kernels.SetThreads(prev)
	for range 2 {
		for _, th := range threads {
			kernels.SetThreads(th)
			rate, digest, err := run(simd)
			if err != nil {
				return nil, err
			}
			d.ThreadsBitIdentical = d.ThreadsBitIdentical && bytes.Equal(digest, simdDigest)
			key := strconv.Itoa(th)
			if rate > d.TokPerSByThreads[key] {
				d.TokPerSByThreads[key], d.CPUBusy[key], d.Trace[key] = rate, busy, trace
				if gbps := dram[key]; gbps > 0 {
					d.RooflineFraction[key] = float64(d.BytesPerToken) * rate / (gbps * 1e9)
				}
			}
		}
	}
	probe := newDRAMProbe(sideProbeMiB)
	for _, th := range threads {
		kernels.SetThreads(th)
		s := model.NewSession(m, model.NewResidentExperts(m), len(prompt)+steps)
		logits, err := s.Forward(ctx, prompt)
		if err != nil {
			return nil, err
		}
		var l *llamaSteps
		if llama.Times != "" {
			if l, err = startLlama(ctx, llama, len(prompt), steps, th); err != nil {
				return nil, err
			}
		}
		side, err := sideBySideRun(ctx, s, logits, steps, d.BytesPerToken, probe, l)
		if l != nil {
			if cerr := l.close(); err == nil && cerr != nil {
				err = fmt.Errorf("llama.cpp's steps: %w", cerr)
			}
		}
		if err != nil {
			return nil, err
		}
		d.SideBySide = append(d.SideBySide, *side)
	}
	return d, nil
}

// bestStreams is the fastest weight stream each thread count measured in
// rep: the DRAM roofline or the BF16 matvec, whichever is more (GB/s).
func bestStreams(rep *Report) map[string]float64 {
	best := maps.Clone(rep.DRAMGBps)
	for _, m := range rep.MatVec {
		if k := strconv.Itoa(m.Threads); m.DType == "BF16" {
			best[k] = max(best[k], m.GBps)
		}
	}
	return best
}

// scaling fills Scaling and ScalingCeiling from the tokens/s by thread
// count and streams, the fastest GB/s measured at each count.
func (d *decodeResult) scaling(streams map[string]float64) {
	one := d.TokPerSByThreads["1"]
	if one == 0 {
		return
	}
	oneGBps := float64(d.BytesPerToken) * one / 1e9
	d.Scaling, d.ScalingCeiling = map[string]float64{}, map[string]float64{}
	for k, rate := range d.TokPerSByThreads {
		d.Scaling[k] = rate / one
		if gbps := streams[k]; gbps > 0 {
			d.ScalingCeiling[k] = gbps / oneGBps
		}
	}
}

func hashLogits(h io.Writer, logits []float32) {
	b := make([]byte, 4*len(logits))
	for i, v := range logits {
		u := math.Float32bits(v)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	h.Write(b)
}

func PrintReport(w io.Writer, r *Report) {
	fmt.Fprintf(w, "odmoe bench kernels  %s  %s (%d CPUs, GOMAXPROCS %d, %s)\n", r.Date, r.Machine.CPU, r.Machine.CPUs, r.Machine.GOMAXPROCS, r.Machine.Go)
	fmt.Fprintf(w, "CPU features: %s\n", strings.Join(r.Machine.Features, " "))
	fmt.Fprintf(w, "paths: %s; measured: %s; load average before %s, after %s\n", strings.Join(r.Paths, ", "), r.Path, r.Machine.LoadBefore, r.Machine.LoadAfter)
	fmt.Fprintf(w, "best clean run (min..max of clean runs; clean = this process had the CPUs for >= 75%% of the run), %d interleaved rounds\n\n", r.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DRAM read\tthreads\tGB/s\t")
	for _, d := range r.DRAM {
		fmt.Fprintf(tw, "  Sum, 1 stream/thread\t%d\t%v\t\n", d.Threads, d.Sum)
		fmt.Fprintf(tw, "  F32 MatVec, 4 streams/thread\t%d\t%v\t\n", d.Threads, d.Streams)
		fmt.Fprintf(tw, "  roofline (the better)\t%d\t%.1f\t\n", d.Threads, d.GBps)
	}
	fmt.Fprintf(tw, "MatVec [%s], weights streamed\tthreads\tGB/s\tof roofline\n", r.Path)
	for _, m := range r.MatVec {
		for _, s := range m.Shapes {
			fmt.Fprintf(tw, "  %s %s\t%d\t%v\t%.2f\n", m.DType, s.Shape, m.Threads, s.GBps, s.RooflineFraction)
		}
		fmt.Fprintf(tw, "  %s both shapes\t%d\t%.1f\t%.2f\n", m.DType, m.Threads, m.GBps, m.RooflineFraction)
	}
	fmt.Fprintln(tw, "MatMul (prefill)\ttokens\tthreads\tGFLOP/s\troute")
	for _, m := range r.MatMul {
		fmt.Fprintf(tw, "  %s %s [%s]\t%d\t%d\t%v\t%s\n", m.DType, m.Shape, m.Path, m.Tokens, m.Threads, m.GFLOPs, m.Route)
	}
	tw.Flush()
	if d := r.Decode; d != nil {
		fmt.Fprintf(w, "\nLocal decode, %s preset, %d tokens, %d threads: go %.2f tok/s, %s %.2f tok/s: %.2fx; logits bit-identical: %v\n",
			d.Preset, d.Tokens, d.Threads, d.GoTokPerS, d.SIMDPath, d.SIMDTokPerS, d.Speedup, d.BitIdentical)
		fmt.Fprintf(w, "Local decode [%s] by threads, %s of weights a token; logits the same at every count: %v\n", d.SIMDPath, progress.Bytes(d.BytesPerToken), d.ThreadsBitIdentical)
		keys := slices.Collect(maps.Keys(d.TokPerSByThreads))
		slices.SortFunc(keys, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
		for _, k := range keys {
			fmt.Fprintf(w, "  %s threads: %.2f tok/s, %.1f GB/s of weights, %.2f of the roofline, %.2f CPUs busy",
				k, d.TokPerSByThreads[k], float64(d.BytesPerToken)*d.TokPerSByThreads[k]/1e9, d.RooflineFraction[k], d.CPUBusy[k])
			if c, ok := d.ScalingCeiling[k]; ok && k != "1" {
				fmt.Fprintf(w, "; %.2fx one thread (at most %.2fx: the fastest stream measured at %s threads over one thread's decode)", d.Scaling[k], c, k)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, "Where a token's time went (the faster run at each count; kernels.TeamStats):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  threads\tms a token p10/p50/p90\tp90/p10\tregions\tin regions ms\tof it at the barrier\tserial ms\tmembers' chunks\twakes\tus a wake\tparks\talone\tpage faults minor/major\tGCs")
		for _, k := range keys {
			t, ok := d.Trace[k]
			if !ok {
				continue
			}
			fmt.Fprintf(tw, "  %s\t%.2f/%.2f/%.2f\t%.2f\t%.1f\t%.2f\t%.2f\t%.2f\t%.0f%%\t%.1f\t%.0f\t%.1f\t%.1f\t%.1f/%.1f\t%d\n",
				k, t.Passes.P10, t.Passes.P50, t.Passes.P90, t.Passes.Spread, t.Regions, t.RegionMs, t.BarrierMs, t.SerialMs, 100*t.MemberShare, t.Wakes, t.WakeUs, t.Parks, t.Alone, t.MinorFaults, t.MajorFaults, t.GCs)
		}
		tw.Flush()
		printSideBySide(w, d.SideBySide)
	}
}

// WriteJSON writes the report as indented JSON to path (bench kernels
// -json).
func (rep *Report) WriteJSON(path string) error {
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}
