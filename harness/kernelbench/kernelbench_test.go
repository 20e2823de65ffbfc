package kernelbench

import (
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// TestDecodeScalingCeiling: the ceiling of N threads over one is the
// fastest BF16 or DRAM stream measured at N over the GB/s one thread's
// decode reads; other dtypes' matvecs do not count.
func TestDecodeScalingCeiling(t *testing.T) {
	rep := &Report{
		DRAMGBps: map[string]float64{"1": 8, "2": 12},
		MatVec: []matVecResult{
			{DType: "BF16", Threads: 2, GBps: 15},
			{DType: "F16", Threads: 2, GBps: 20},
			{DType: "BF16", Threads: 1, GBps: 7},
		},
	}
	streams := bestStreams(rep)
	if streams["1"] != 8 || streams["2"] != 15 {
		t.Fatalf("best streams %v, want 1: 8 (DRAM), 2: 15 (BF16 matvec)", streams)
	}
	d := &decodeResult{BytesPerToken: 1e9, TokPerSByThreads: map[string]float64{"1": 10, "2": 13}}
	d.scaling(streams)
	if d.Scaling["2"] != 1.3 || d.ScalingCeiling["2"] != 1.5 {
		t.Errorf("2 threads: scaling %v, ceiling %v; want 1.3 and 1.5 (15 GB/s over one thread's 10)", d.Scaling["2"], d.ScalingCeiling["2"])
	}
	if d.Scaling["1"] != 1 {
		t.Errorf("1 thread over itself: %v", d.Scaling["1"])
	}
	d = &decodeResult{BytesPerToken: 1e9, TokPerSByThreads: map[string]float64{"2": 13}}
	d.scaling(streams)
	if d.Scaling != nil {
		t.Errorf("without a 1-thread figure there is no scaling, got %v", d.Scaling)
	}
}

// TestReportSaysTheFeaturesAndEachProductsRoute: the printed report names
// the CPU's features and, for each MatMul, the way its path took, so that
// a table from an AVX2 machine and one from an AVX-512 machine cannot be
// taken for each other.
func TestReportSaysTheFeaturesAndEachProductsRoute(t *testing.T) {
	route := "avx512: BF16 widened to a float32 tile, 4x4 register tiles"
	r := &Report{Machine: Machine{CPU: "Test CPU", Features: []string{"avx2", "f16c", "avx512f", "avx512_bf16"}}, Path: "avx512", Paths: []string{"avx512", "avx2", "go"},
		MatMul: []matMulResult{{Path: "avx512", Route: route, DType: "BF16", Shape: "1024x1024", Tokens: 128, Threads: 2}}}
	var b strings.Builder
	PrintReport(&b, r)
	for _, want := range []string{"CPU features: avx2 f16c avx512f avx512_bf16", route} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestDecodeTraceIsATokensShare: ten steps of 1..10 ms, of which the
// team's regions took 50 ms (4 at the barrier) and the members ran half
// the chunks, read as a token's: 5 ms in regions, 0.5 outside, p10 1 ms,
// p90 9 ms (nearest rank), spread 9; ten wakes of 500 us in all, 50 us a
// wake.
func TestDecodeTraceIsATokensShare(t *testing.T) {
	var steps []time.Duration
	for i := 1; i <= 10; i++ {
		steps = append(steps, time.Duration(i)*time.Millisecond)
	}
	team := kernels.TeamStats{Regions: 30, RegionTime: 50 * time.Millisecond, BarrierTime: 4 * time.Millisecond, Chunks: 8, MemberChunks: 4, Wakes: 10, WakeTime: 500 * time.Microsecond, Parks: 20}
	tr := newDecodeTrace(steps, team, 5, 0, 1)
	want := decodeTrace{Passes: model.PassSpread{Passes: 10, P10: 1, P50: 5, P90: 9, Spread: 9}, Regions: 3, RegionMs: 5, BarrierMs: 0.4, SerialMs: 0.5,
		MemberShare: 0.5, Wakes: 1, WakeUs: 50, Parks: 2, MinorFaults: 0.5, GCs: 1}
	if tr != want {
		t.Errorf("trace %+v, want %+v", tr, want)
	}
}
