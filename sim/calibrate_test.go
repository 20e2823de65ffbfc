package sim

import (
	"math"
	"reflect"
	"testing"

	"github.com/odmoe/odmoe/sched"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

// figure is a calibrated profile's figure and the value it must have.
type figure struct {
	name      string
	got, want float64
}

func checkFigures(t *testing.T, fs []figure) {
	t.Helper()
	for _, f := range fs {
		if !near(f.got, f.want) {
			t.Errorf("%s = %v, want %v", f.name, f.got, f.want)
		}
	}
}

// TestCalibrateReadsEachCostFromItsFigure: runs made up from known
// costs give those costs back, and the CPU a token by role.
func TestCalibrateReadsEachCostFromItsFigure(t *testing.T) {
	s := Shape{Layers: 4, Experts: 8, TopK: 2, ExpertBytes: 1 << 20, HiddenBytes: 1000}
	const calls, out = 10, 11
	layers := func(main0, main, worker, network, load float64, loads int) []LayerStats {
		var ls []LayerStats
		for l := range s.Layers {
			m := main
			if l == 0 {
				m = main0
			}
			ls = append(ls, LayerStats{Layer: l, Calls: calls, MainMs: m * calls, WorkerMs: worker * calls, NetworkMs: network * calls, LoadMs: load * float64(loads), Loads: loads})
		}
		return ls
	}
	resident := Measured{Prompt: 16, Output: out, Decode: layers(3, 1, 2, 0.5, 0, 0),
		Prefill:    []LayerStats{{Calls: 1, MainMs: 1.6, WorkerMs: 8}},
		CPUSeconds: map[string]float64{"main": 0.11, "workers": 0.176}}
	shadow := Measured{Prompt: 16, Output: out, DecodeTokensPerS: 20, Decode: layers(3, 1, 2, 0.5, 4, 5),
		CPUSeconds: map[string]float64{"main": 0.11, "workers": 0.196, "shadow": 0.088}}
	p, err := Calibrate("t", s, 2, 1e8, resident, shadow)
	if err != nil {
		t.Fatal(err)
	}
	checkFigures(t, []figure{
		{"main_layer_ms", p.MainLayerMs, 1},
		{"main_token_ms", p.MainTokenMs, 2},                                                            // layer 0's excess
		{"expert_ms", p.ExpertMs, 2},                                                                   // the slowest request's compute a call
		{"hop_ms", p.HopMs, 0.25 - 0.01},                                                               // half the round trip less the bytes' time (1000 B at 100 MB/s)
		{"load_bytes_per_s", p.LoadBytesPerS, float64(s.ExpertBytes) / 4e-3},                           // 4 ms a load
		{"main_prefill_token_ms", p.MainPrefillTokenMs, (1.6 - 1) / 15},                                // the first token costs a decode layer's
		{"expert_prefill_token_ms", p.ExpertPrefillTokenMs, (8 - 2) / (expectedBusiest(s, 16, 0) - 1)}, // the busiest expert's tokens after the first
		{"shadow_cpu_token_ms", p.ShadowCPUTokenMs, 8},
		{"shadow_layer_ms", p.ShadowLayerMs, 2},
		{"main_cpu_token_ms", p.MainCPUTokenMs, 10},
		{"worker_cpu_expert_ms", p.WorkerCPUExpertMs, 176.0 / (out * 4 * 2)},
		{"worker_cpu_load_ms", p.WorkerCPULoadMs, 20.0 / 20}, // 20 ms more over 20 loads
	})
	// 16 tokens over 8 experts, 2 each: the busiest gets more than the
	// mean 4, rarely more than 8
	if b := expectedBusiest(s, 16, 0); b <= 4.5 || b >= 8 {
		t.Errorf("the busiest of 8 experts gets %v of 16 tokens' 32 routes on average", b)
	}
	// the shadow run at 20 tok/s kept this share of 2 cores busy
	cpu := 10 + 8*(176.0/(out*4*2)) + 20.0/10*1 + 8
	if !near(p.CPUEfficiency, 20*cpu/2000) {
		t.Errorf("cpu_efficiency = %v, want %v", p.CPUEfficiency, 20*cpu/2000)
	}
	if _, err := Calibrate("t", s, 2, 1e8, resident, Measured{Output: out, Decode: layers(3, 1, 2, 0.5, 4, 5)}); err == nil {
		t.Error("a shadow run without the shadow's CPU time calibrated")
	}
	// the same CPU measured over decode alone is spread over its steps
	// (out-1), not the run's output tokens
	resident.DecodeCPU, shadow.DecodeCPU = true, true
	d, err := Calibrate("t", s, 2, 1e8, resident, shadow)
	if err != nil {
		t.Fatal(err)
	}
	checkFigures(t, []figure{
		{"main_cpu_token_ms (decode CPU)", d.MainCPUTokenMs, 110.0 / (out - 1)},
		{"shadow_cpu_token_ms (decode CPU)", d.ShadowCPUTokenMs, 88.0 / (out - 1)},
		{"worker_cpu_expert_ms (decode CPU)", d.WorkerCPUExpertMs, 176.0 / ((out - 1) * 4 * 2)},
	})
}

// TestSharedCoresBoundDecode: with cores shared, decode goes no faster
// than the cores over a token's CPU, the shadow's included; without,
// the timeline alone sets it.
func TestSharedCoresBoundDecode(t *testing.T) {
	p, l, s := testRig(t)
	o := Options{Mode: Shadow, Prompt: 4, Output: 33, Recall: 1, Ahead: 1, Seed: 4}
	free := mustRun(t, p, l, s, o)
	p.Cores, p.CPUEfficiency = 2, 0.5
	p.MainCPUTokenMs, p.WorkerCPUExpertMs, p.WorkerCPULoadMs, p.ShadowCPUTokenMs = 20, 1, 0.5, 30
	bound := mustRun(t, p, l, s, o)
	cpu := 20 + float64(s.Layers*s.TopK)*1 + float64(bound.Loads)/32*0.5 + 30
	if want := 0.5 * 2 * 1000 / cpu; !bound.CPUBound || !near(bound.DecodeTokensPerS, want) || want >= free.DecodeTokensPerS {
		t.Fatalf("shared cores: %+v, want %.3f tok/s, CPU-bound (free: %.3f)", bound, want, free.DecodeTokensPerS)
	}
	o.Mode = Resident // no shadow, no loads: a lighter token
	if res := mustRun(t, p, l, s, o); !(res.DecodeTokensPerS > bound.DecodeTokensPerS) {
		t.Fatalf("resident %v tok/s under the shadow's %v with shared cores", res.DecodeTokensPerS, bound.DecodeTokensPerS)
	}
}

// TestPositionSlopeFitsTheMainLayersGrowth: passes whose main time a
// layer grows by a known amount a position give that slope back, through
// spikes in a fifth of them; calibration then keeps the position-0 costs.
func TestPositionSlopeFitsTheMainLayersGrowth(t *testing.T) {
	const prompt, out, layers = 16, 300, 4
	const base, slope = 0.5, 0.003                                // ms a layer; ms a layer a position
	iters := []LayerStats{{Layer: 1, Calls: layers, MainMs: 100}} // the prompt: not a decode step
	for it := 2; it <= out; it++ {
		ms := base + slope*float64(prompt+it-2)
		if it%5 == 0 {
			ms += 7 // a descheduled node
		}
		iters = append(iters, LayerStats{Layer: it, Calls: layers, MainMs: ms * layers})
	}
	m := Measured{Prompt: prompt, Output: out, Passes: iters}
	if got := positionSlope(m); math.Abs(got-slope) > 1e-9 {
		t.Fatalf("slope = %v ms a position, want %v", got, slope)
	}
	if got := positionSlope(Measured{Prompt: prompt, Output: out, Passes: iters[:3]}); got != 0 {
		t.Errorf("two decode passes gave a slope %v, want none (0)", got)
	}
	for i := range iters[1:] { // flat: no growth to fit
		iters[i+1].MainMs = base * layers
	}
	if got := positionSlope(m); got != 0 {
		t.Errorf("a flat run's slope = %v, want 0", got)
	}
}

// TestCalibrateTakesTheContextsGrowthOut: a resident run whose main layer
// grows with the context calibrates to its position-0 layer, the slope,
// and CPU a token at position 0; the shadow's the same way.
func TestCalibrateTakesTheContextsGrowthOut(t *testing.T) {
	s := Shape{Layers: 2, Experts: 4, TopK: 1, ExpertBytes: 1 << 20, HiddenBytes: 1000}
	const prompt, out, slope = 10, 21, 0.01
	mean := float64(prompt) + float64(out-2)/2 // 19.5
	var iters []LayerStats
	for it := 2; it <= out; it++ {
		iters = append(iters, LayerStats{Layer: it, Calls: 2, MainMs: 2 * (1 + slope*float64(prompt+it-2))})
	}
	calls := float64(out - 1)
	layer := 1 + slope*mean // the run's mean main time a layer
	decode := []LayerStats{{Layer: 0, Calls: out - 1, MainMs: (layer + 3) * calls, WorkerMs: calls, NetworkMs: calls},
		{Layer: 1, Calls: out - 1, MainMs: layer * calls, WorkerMs: calls, NetworkMs: calls, LoadMs: 8, Loads: 2}}
	resident := Measured{Prompt: prompt, Output: out, Decode: decode, Passes: iters, CPUSeconds: map[string]float64{"main": 0.42, "workers": 0.1}}
	shadow := Measured{Prompt: prompt, Output: out, DecodeTokensPerS: 10, Decode: decode, CPUSeconds: map[string]float64{"main": 0.42, "workers": 0.2, "shadow": 0.21}}
	p, err := Calibrate("t", s, 2, 1e8, resident, shadow)
	if err != nil {
		t.Fatal(err)
	}
	checkFigures(t, []figure{
		{"main_position_ms", p.MainPositionMs, slope},
		{"shadow_position_ms", p.ShadowPositionMs, slope},
		{"main_layer_ms", p.MainLayerMs, 1},
		{"main_token_ms", p.MainTokenMs, 3},
		{"main_cpu_token_ms", p.MainCPUTokenMs, 420.0/out - 2*slope*mean},
		{"shadow_cpu_token_ms", p.ShadowCPUTokenMs, 210.0/out - 2*slope*mean},
		{"shadow_layer_ms", p.ShadowLayerMs, (210.0/out - 2*slope*mean) / 2},
	})
}

// TestMedianProfileTakesEveryFiguresMedian: each float figure is the
// median of the profiles' (of two, their mean; of three, the middle
// one); name, sources and cores are the first's; a 0 that stands for
// another figure counts as that figure.
func TestMedianProfileTakesEveryFiguresMedian(t *testing.T) {
	a := Profile{Name: "a", Sources: []string{"s"}, Cores: 2, MainLayerMs: 1, HopMs: 0.5, LoadBytesPerS: 1e9, LinkBytesPerS: 1e8, CPUEfficiency: 0.5, MainPositionMs: 0.002}
	b := Profile{Name: "b", Cores: 2, MainLayerMs: 3, HopMs: 1.5, LoadBytesPerS: 3e9, LinkBytesPerS: 1e8, CPUEfficiency: 1, LoadingHopMs: 2}
	m := MedianProfile([]Profile{a, b})
	want := Profile{Name: "a", Sources: []string{"s"}, Cores: 2, MainLayerMs: 2, HopMs: 1, LoadBytesPerS: 2e9, LinkBytesPerS: 1e8, CPUEfficiency: 0.75, MainPositionMs: 0.001, LoadingHopMs: 1.25} // a's loading hop: its hop, 0.5
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("MedianProfile = %+v\nwant %+v", m, want)
	}
	c := Profile{Name: "c", Cores: 2, MainLayerMs: 10, HopMs: 1, LoadBytesPerS: 1e9, LinkBytesPerS: 1e8}
	if m := MedianProfile([]Profile{a, b, c}); m.MainLayerMs != 3 || m.HopMs != 1 || m.LoadBytesPerS != 1e9 {
		t.Errorf("of three: main_layer_ms %v (want 3), hop_ms %v (1), load_bytes_per_s %v (1e9)", m.MainLayerMs, m.HopMs, m.LoadBytesPerS)
	}
	// a's loading hop of 0 is its hop, 0.6: the mean 0.75 is within 10%
	// of the mean hop 0.7 (left 0); b's efficiency of 0 is 1
	a.HopMs, b.HopMs, b.LoadingHopMs, b.CPUEfficiency = 0.6, 0.8, 0.9, 0
	if m := MedianProfile([]Profile{a, b}); m.LoadingHopMs != 0 || !near(m.CPUEfficiency, 0.75) {
		t.Errorf("loading hops 0 (hop 0.6) and 0.9 (hop 0.8): %v; efficiencies 0.5 and 0 (1): %v; want 0 and 0.75", m.LoadingHopMs, m.CPUEfficiency)
	}
	b.LoadingHopMs = 2.6
	if m := MedianProfile([]Profile{a, b}); !near(m.LoadingHopMs, 1.6) {
		t.Errorf("loading hops 0 (hop 0.6) and 2.6: mean %v, want 1.6", m.LoadingHopMs)
	}
}

// TestRouteRepeatSavesTheLoadsOfKeptExperts: a layer that routes the
// next token to experts it routed the token before (RouteRepeat) loads
// fewer experts in shadow mode, where a worker hinted an expert it holds
// keeps it, and no fewer in reactive mode, where every activation loads.
func TestRouteRepeatSavesTheLoadsOfKeptExperts(t *testing.T) {
	p, l, s := testRig(t)
	o := Options{Prompt: 16, Output: 64, Recall: 1, Ahead: 1}
	loads := func(mode Mode, repeat float64) int {
		q := p
		q.RouteRepeat = repeat
		o.Mode = mode
		r, err := Expect(q, l, s, o, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r.Loads
	}
	even, kept := loads(Shadow, 0), loads(Shadow, 0.8)
	if !(kept < even*2/3) {
		t.Errorf("shadow mode loads %d experts with RouteRepeat 0.8, %d without: want far fewer", kept, even)
	}
	if a, b := loads(Reactive, 0), loads(Reactive, 0.8); a != b || a != 63*8*2 {
		t.Errorf("reactive mode loads %d and %d experts: want every activation's, %d", a, b, 63*8*2)
	}
}

// TestFitsRecoverWhatTheyFit: runs simulated with a known routing
// locality, prompt message cost and shadow prompt cost are fitted back
// to them from the figures they give.
func TestFitsRecoverWhatTheyFit(t *testing.T) {
	p, l, s := testRig(t)
	p.Cores, p.WorkerCPULoadMs = 2, 0.5
	want := p
	want.RouteRepeat, want.PrefillMessageMs, want.ShadowPromptMs, want.ShadowPrefillTokenMs = 0.6, 0.4, 30, 2
	o := Options{Prompt: 16, Output: 64, Recall: 1, Ahead: 1}
	measure := func(mode Mode) Result {
		o.Mode = mode
		r, err := Expect(want, l, s, o, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	resident, shadow := measure(Resident), measure(Shadow)
	got, err := FitPrefillMessage(p, l, s, o, resident.TTFTms)
	if err != nil || math.Abs(got.PrefillMessageMs-0.4) > 0.01 {
		t.Errorf("prefill_message_ms fitted %v (%v), want 0.4", got.PrefillMessageMs, err)
	}
	if got, err = FitRouteRepeat(got, l, s, Point{o, float64(shadow.Loads) / float64(o.Output-1)}); err != nil || math.Abs(got.RouteRepeat-0.6) > 0.05 {
		t.Errorf("route_repeat fitted %v (%v), want 0.6", got.RouteRepeat, err)
	}
	// the local runs' prompts: 30 ms fixed, 2 a token
	local := [][2]float64{{16, 30 + 16*2}, {128, 30 + 128*2}}
	if got, err = FitShadowPrefill(got, l, s, local, Point{o, shadow.TTFTms}); err != nil || math.Abs(got.ShadowPromptMs-30) > 1.5 || math.Abs(got.ShadowPrefillTokenMs-2) > 0.1 {
		t.Errorf("shadow_prompt_ms, shadow_prefill_token_ms fitted %v, %v (%v), want 30, 2", got.ShadowPromptMs, got.ShadowPrefillTokenMs, err)
	}
	// with cores of their own, the shadow's prompt costs the TTFT nothing
	got.Cores = 0
	if own, _ := FitShadowPrefill(got, l, s, local, Point{o, shadow.TTFTms}); own.ShadowPromptMs != 0 || own.ShadowPrefillTokenMs != 0 {
		t.Errorf("no shared cores, yet the shadow's prompt fitted at %v + %v a token", own.ShadowPromptMs, own.ShadowPrefillTokenMs)
	}
}

// TestTwoPromptLengthsTellAMessagesBytesFromItsFixedCost: resident runs
// simulated with a known message cost (negative: a line through a cost
// that grows faster than its bytes) and a known rate for a prompt's
// bytes, at 16 and 128 prompt tokens, are fitted back to both; one
// length alone cannot tell them apart, so a fit at 16 tokens alone,
// keeping the link's rate, misses the 128-token prompt by far.
func TestTwoPromptLengthsTellAMessagesBytesFromItsFixedCost(t *testing.T) {
	p, l, s := testRig(t)
	want := p
	want.PrefillMessageMs, want.PrefillBytesPerS = -0.05, p.LinkBytesPerS/5
	short, long := Options{Prompt: 16, Output: 64}, Options{Prompt: 128, Output: 64}
	ttft := func(q Profile, o Options) float64 {
		o.Mode = Resident
		r, err := Expect(q, l, s, o, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r.TTFTms
	}
	at, longer := ttft(want, short), ttft(want, long)
	got, err := FitPrefillMessages(p, l, s, short, at, long, longer)
	if err != nil || math.Abs(got.PrefillMessageMs-want.PrefillMessageMs) > 0.01 || math.Abs(got.PrefillBytesPerS/want.PrefillBytesPerS-1) > 0.02 {
		t.Errorf("fitted prefill_message_ms %v, prefill_bytes_per_s %v (%v): want %v, %v", got.PrefillMessageMs, got.PrefillBytesPerS, err, want.PrefillMessageMs, want.PrefillBytesPerS)
	}
	one, err := FitPrefillMessage(p, l, s, short, at)
	if err != nil {
		t.Fatal(err)
	}
	if miss := ttft(one, long)/longer - 1; math.Abs(miss) < 0.15 {
		t.Errorf("fitted at 16 tokens alone, 128 tokens predicted within %.0f%%: the test tells nothing", 100*miss)
	}
	if _, err := FitPrefillMessages(p, l, s, long, longer, short, at); err == nil {
		t.Error("the longer prompt shorter than the calibration's: no error")
	}
}

// TestSplitPrefillKeepsTheCalibratedPromptAndTakesLocalsSlope: split by
// local mode's slope, a prompt layer costs what it did at the
// calibration's prompt, each further token adds the slope's share by
// weights (the main part's and an expert's), and a slope too steep for
// the measured time leaves every token alike.
func TestSplitPrefillKeepsTheCalibratedPromptAndTakesLocalsSlope(t *testing.T) {
	p, _, s := testRig(t)
	s.MainWeights, s.ExpertWeights = 1000, 2000 // a token: 1000 + 2 x 2000 weights a layer
	p.MainLayerMs, p.MainPrefillTokenMs, p.ExpertMs, p.ExpertPrefillTokenMs = 0.1, 0.2, 0.1, 0.3
	const prompt = 16
	busiest := expectedBusiest(s, prompt, 0)
	mainAt, expertAt := 0.1+15*0.2, 0.1+(busiest-1)*0.3
	whole := 0.05 * float64(s.Layers) // a prompt token adds 0.05 ms a layer
	q := p.SplitPrefill(s, prompt, whole)
	if math.Abs(q.MainPrefillTokenMs-0.01) > 1e-9 || math.Abs(q.ExpertPrefillTokenMs-0.02) > 1e-9 {
		t.Errorf("a token adds %v to the main part, %v to an expert: want 0.01, 0.02", q.MainPrefillTokenMs, q.ExpertPrefillTokenMs)
	}
	if got := q.mainPrefillFirstMs() + 15*q.MainPrefillTokenMs; math.Abs(got-mainAt) > 1e-9 {
		t.Errorf("the main part at %d tokens: %v, want %v as calibrated", prompt, got, mainAt)
	}
	if got := q.expertPrefillFirstMs() + (busiest-1)*q.ExpertPrefillTokenMs; math.Abs(got-expertAt) > 1e-9 {
		t.Errorf("the busiest expert at %d tokens: %v, want %v as calibrated", prompt, got, expertAt)
	}
	steep := p.SplitPrefill(s, prompt, 100*float64(s.Layers))
	if math.Abs(steep.MainPrefillTokenMs-mainAt/prompt) > 1e-9 || math.Abs(steep.MainPrefillLayerMs-mainAt/prompt) > 1e-9 {
		t.Errorf("a slope steeper than the measured time: main %v first, %v a token; want %v each", steep.MainPrefillLayerMs, steep.MainPrefillTokenMs, mainAt/prompt)
	}
	if same := p.SplitPrefill(Shape{Layers: s.Layers, Experts: s.Experts, TopK: s.TopK}, prompt, whole); !reflect.DeepEqual(same, p) {
		t.Error("split without the weights known: the profile changed")
	}
	if got := PrefillSlope([][2]float64{{16, 3}, {128, 3 + 112*0.11}}); math.Abs(got-0.11) > 1e-9 {
		t.Errorf("PrefillSlope: %v, want 0.11", got)
	}
	if got := PrefillSlope([][2]float64{{16, 3}, {16, 4}}); got != 0 {
		t.Errorf("PrefillSlope of one length: %v, want 0", got)
	}
}

// TestTheShadowsPromptShareHoldsAtALongerPrompt: a shadow whose pass
// over the prompt outlasts the prompt's own (a large CPU, a 30% share of
// the cores) stretches the prompt's pass by 1/(1 - 0.3) at any length;
// fitted at 16 tokens, the least share and CPU that explain it predict
// the 128-token prompt, where adding the shadow's CPU whole, as the fit
// without the share did, overshoots it by far.
func TestTheShadowsPromptShareHoldsAtALongerPrompt(t *testing.T) {
	p, l, s := testRig(t)
	p.Cores, p.WorkerCPULoadMs = 2, 0.5
	want := p
	want.ShadowPromptMs, want.ShadowPrefillTokenMs, want.ShadowPromptShare = 3000, 200, 0.3
	ttft := func(q Profile, prompt int) float64 {
		r, err := Expect(q, l, s, Options{Mode: Shadow, Prompt: prompt, Output: 2, Recall: 1, Ahead: 1}, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r.TTFTms
	}
	local := [][2]float64{{16, 3000 + 16*200}, {128, 3000 + 128*200}}
	got, err := FitShadowPrefill(p, l, s, local, Point{Options{Prompt: 16, Output: 64, Recall: 1, Ahead: 1}, ttft(want, 16)})
	if err != nil || math.Abs(got.ShadowPromptShare-0.3) > 0.01 {
		t.Fatalf("shadow_prompt_share fitted %v (%v), want 0.3", got.ShadowPromptShare, err)
	}
	if at := ttft(got, 16) / ttft(want, 16); math.Abs(at-1) > 0.01 {
		t.Errorf("at the calibration's 16 tokens the fit predicts %.3f of the run", at)
	}
	if longer := ttft(got, 128) / ttft(want, 128); math.Abs(longer-1) > 0.02 {
		t.Errorf("at 128 tokens the fit predicts %.3f of the run", longer)
	}
	whole := got
	whole.ShadowPromptShare = 0
	if over := ttft(whole, 128) / ttft(want, 128); over < 1.2 {
		t.Errorf("the shadow's CPU added whole predicts %.3f of the 128-token run: the test tells nothing", over)
	}
}

// TestPrefillLinesReadEachPartsLineFromTwoLengths: resident runs whose
// prompt layers' main part and slowest expert grow by known lines (the
// expert's with its busiest expert's tokens) give those lines back,
// either run first; a line that would give a first token a negative
// cost, or two runs of one length, leave the profile as it was.
func TestPrefillLinesReadEachPartsLineFromTwoLengths(t *testing.T) {
	p, _, s := testRig(t)
	const mainFirst, mainToken, expertFirst, expertToken = 1.5, 0.12, 7.5, 0.9
	run := func(prompt int, mainAdd float64) Measured {
		m := Measured{Prompt: prompt}
		busiest := expectedBusiest(s, prompt, 0)
		for l := range s.Layers {
			// two calls a layer, as a prompt in two chunks sums them
			m.Prefill = append(m.Prefill, LayerStats{Layer: l, Calls: 2, MainMs: 2 * (mainFirst + float64(prompt-1)*mainToken + mainAdd),
				WorkerMs: 2 * (expertFirst + (busiest-1)*expertToken)})
		}
		return m
	}
	short, long := run(16, 0), run(128, 0)
	for _, pair := range [][2]Measured{{short, long}, {long, short}} {
		got, ok := p.PrefillLines(s, pair[0], pair[1])
		if !ok || math.Abs(got.MainPrefillLayerMs-mainFirst) > 1e-9 || math.Abs(got.MainPrefillTokenMs-mainToken) > 1e-9 ||
			math.Abs(got.ExpertPrefillMs-expertFirst) > 1e-9 || math.Abs(got.ExpertPrefillTokenMs-expertToken) > 1e-9 {
			t.Errorf("lines %v: main %v + %v a token, expert %v + %v: want %v + %v, %v + %v", ok, got.MainPrefillLayerMs, got.MainPrefillTokenMs,
				got.ExpertPrefillMs, got.ExpertPrefillTokenMs, mainFirst, mainToken, expertFirst, expertToken)
		}
	}
	// the short prompt's main part dearer than the long one's line allows
	if got, ok := p.PrefillLines(s, run(16, 20), long); ok || !reflect.DeepEqual(got, p) {
		t.Errorf("a negative per-token cost taken: %v, %+v", ok, got)
	}
	if got, ok := p.PrefillLines(s, short, short); ok || !reflect.DeepEqual(got, p) {
		t.Errorf("one length taken for two: %v, %+v", ok, got)
	}
}

// TestPromptCPUAndTwoLengthFitsRecoverWhatTheyFit: resident, reactive
// and shadow-driven runs simulated on shared cores with known figures,
// at 16 and 128 prompt tokens, are fitted back to them: a prompt's
// messages' CPU a byte (the long prompt CPU-bound) and a message's fixed
// cost (the short one), a prompt load's CPU from both reactive runs, and
// the shadow's pass over the prompt as the line through what it added at
// each length.
func TestPromptCPUAndTwoLengthFitsRecoverWhatTheyFit(t *testing.T) {
	p, l, s := testRig(t)
	p.Cores, p.WorkerCPULoadMs, p.PrefillCPUTokenMs = 2, 0.5, 0.3
	want := p
	want.PrefillCPUByteNs, want.PrefillMessageMs, want.PrefillLoadCPUMs = 40, 0.3, 1.5
	want.ShadowPromptMs, want.ShadowPrefillTokenMs = 20, 1.5
	short, long := Options{Prompt: 16, Output: 2, Recall: 1}, Options{Prompt: 128, Output: 2, Recall: 1}
	ttft := func(q Profile, o Options, mode Mode) float64 {
		o.Mode = mode
		r, err := Expect(q, l, s, o, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r.TTFTms
	}
	// the long prompt is CPU-bound, the short one is not: else the test
	// tells the two figures nothing apart
	if free := want; true {
		free.PrefillCPUByteNs = 0
		if ttft(free, long, Resident) >= 0.9*ttft(want, long, Resident) || ttft(free, short, Resident) < 0.98*ttft(want, short, Resident) {
			t.Fatalf("the rig's long prompt is not CPU-bound, or its short one is: %v/%v, %v/%v", ttft(free, long, Resident), ttft(want, long, Resident), ttft(free, short, Resident), ttft(want, short, Resident))
		}
	}
	got, err := FitPrefillCPU(p, l, s, short, ttft(want, short, Resident), long, ttft(want, long, Resident))
	if err != nil || math.Abs(got.PrefillCPUByteNs/want.PrefillCPUByteNs-1) > 0.02 || math.Abs(got.PrefillMessageMs-want.PrefillMessageMs) > 0.02 {
		t.Errorf("prefill_cpu_byte_ns %v, prefill_message_ms %v (%v): want %v, %v", got.PrefillCPUByteNs, got.PrefillMessageMs, err, want.PrefillCPUByteNs, want.PrefillMessageMs)
	}
	got.PrefillCPUByteNs, got.PrefillMessageMs = want.PrefillCPUByteNs, want.PrefillMessageMs
	if got, err = FitPrefillLoads(got, l, s, Point{short, ttft(want, short, Reactive)}, Point{long, ttft(want, long, Reactive)}); err != nil || math.Abs(got.PrefillLoadCPUMs/want.PrefillLoadCPUMs-1) > 0.02 {
		t.Errorf("prefill_load_cpu_ms %v (%v), want %v", got.PrefillLoadCPUMs, err, want.PrefillLoadCPUMs)
	}
	got.PrefillLoadCPUMs = want.PrefillLoadCPUMs
	got, err = FitShadowPrefill(got, l, s, nil, Point{short, ttft(want, short, Shadow)}, Point{long, ttft(want, long, Shadow)})
	if err != nil || math.Abs(got.ShadowPromptMs-want.ShadowPromptMs) > 0.5 || math.Abs(got.ShadowPrefillTokenMs-want.ShadowPrefillTokenMs) > 0.02 || got.ShadowPromptShare != 0 {
		t.Errorf("shadow_prompt_ms %v, shadow_prefill_token_ms %v, share %v (%v): want %v, %v, 0", got.ShadowPromptMs, got.ShadowPrefillTokenMs, got.ShadowPromptShare, err, want.ShadowPromptMs, want.ShadowPrefillTokenMs)
	}
}

// TestPromptCPUFitMeetsTheShortPromptWhereItsExpertsAreOverstated:
// where the timeline with free messages already takes longer than the
// short prompt did (its experts' first token read off the most contended
// of each layer's results), the fit brings that first token down to
// the short prompt's time and leaves the messages free; the long,
// CPU-bound prompt still fits its bytes' CPU.
func TestPromptCPUFitMeetsTheShortPromptWhereItsExpertsAreOverstated(t *testing.T) {
	p, l, s := testRig(t)
	p.Cores, p.WorkerCPULoadMs, p.PrefillCPUTokenMs = 2, 0.5, 0.3
	want := p
	want.PrefillCPUByteNs, want.ExpertPrefillMs = 40, 2
	short, long := Options{Prompt: 16, Output: 2, Recall: 1, Mode: Resident}, Options{Prompt: 128, Output: 2, Recall: 1, Mode: Resident}
	ttft := func(q Profile, o Options) float64 {
		r, err := Expect(q, l, s, o, ExpectRuns)
		if err != nil {
			t.Fatal(err)
		}
		return r.TTFTms
	}
	over := p
	over.ExpertPrefillMs = 3 * want.ExpertPrefillMs // as PrefillLines may read it
	if free := over; ttft(free, short) <= 1.05*ttft(want, short) {
		t.Fatalf("the overstated expert does not lengthen the short prompt: %v against %v", ttft(free, short), ttft(want, short))
	}
	got, err := FitPrefillCPU(over, l, s, short, ttft(want, short), long, ttft(want, long))
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(ttft(got, short)/ttft(want, short)-1) > 0.01 || got.PrefillMessageMs > 1e-6 || math.Abs(got.ExpertPrefillMs/want.ExpertPrefillMs-1) > 0.02 {
		t.Errorf("short prompt %v ms (want %v), prefill_message_ms %v (want 0), expert_prefill_ms %v (want %v)", ttft(got, short), ttft(want, short), got.PrefillMessageMs, got.ExpertPrefillMs, want.ExpertPrefillMs)
	}
	if math.Abs(ttft(got, long)/ttft(want, long)-1) > 0.01 {
		t.Errorf("long prompt %v ms, want %v", ttft(got, long), ttft(want, long))
	}
	// where no expert cost meets the short prompt (its main part
	// overstated instead), the experts' first token is left as read
	slow := over
	slow.MainPrefillLayerMs = 20
	if got, err = FitPrefillCPU(slow, l, s, short, ttft(want, short), long, ttft(want, long)); err != nil || got.ExpertPrefillMs != slow.ExpertPrefillMs {
		t.Errorf("an unreachable short prompt: expert_prefill_ms %v (%v), want it left at %v", got.ExpertPrefillMs, err, slow.ExpertPrefillMs)
	}
}

// TestSplitLoadCPUGivesAReactiveLoadItsOwnCPU: a reactive run's workers'
// CPU beyond computing is its loads'; a shadow run's, beyond its loads
// at that cost, its predictions' (one an activation). The share of the
// cores is taken again so the shadow run's CPU a token is what it was.
func TestSplitLoadCPUGivesAReactiveLoadItsOwnCPU(t *testing.T) {
	_, _, s := testRig(t) // 8 layers of top-2: 16 activations a token
	p := Profile{Cores: 2, WorkerCPUExpertMs: 1, WorkerCPULoadMs: 5, MainCPUTokenMs: 10, ShadowCPUTokenMs: 8}
	decode := func(loadsPerLayer int) []LayerStats {
		ls := make([]LayerStats, s.Layers)
		for i := range ls {
			ls[i] = LayerStats{Layer: i, Calls: 10, Loads: 10 * loadsPerLayer}
		}
		return ls
	}
	// 11 decode steps (DecodeCPU: the CPU is theirs): reactive, 2 loads a
	// layer at 2 ms CPU each beside 16 activations at 1 ms
	reactive := Measured{Output: 11, DecodeCPU: true, Decode: decode(2), CPUSeconds: map[string]float64{"workers": 10 * (16*1 + 16*2) / 1000.0}}
	shadow := Measured{Output: 11, DecodeCPU: true, Decode: decode(1), DecodeTokensPerS: 20}
	got := p.SplitLoadCPU(s, reactive, shadow)
	// the shadow run's 80 loads at 5 ms were 400 ms: at 2 ms, 160, the
	// other 240 over 10 steps of 16 predictions
	if math.Abs(got.WorkerCPULoadMs-2) > 1e-9 || math.Abs(got.WorkerCPUHintMs-1.5) > 1e-9 {
		t.Errorf("worker_cpu_load_ms %v, worker_cpu_hint_ms %v: want 2, 1.5", got.WorkerCPULoadMs, got.WorkerCPUHintMs)
	}
	if a, b := p.tokenCPUMs(s, 8, true, 0), got.tokenCPUMs(s, 8, true, 0); math.Abs(a-b) > 1e-9 {
		t.Errorf("the shadow run's CPU a token %v, after the split %v", a, b)
	}
	// a reactive load dearer than the shadow run's: nothing to split
	dear := reactive
	dear.CPUSeconds = map[string]float64{"workers": 10 * (16*1 + 16*9) / 1000.0}
	if got := p.SplitLoadCPU(s, dear, shadow); got.WorkerCPULoadMs != 5 || got.WorkerCPUHintMs != 0 {
		t.Errorf("a dearer reactive load split the shadow run's: %v, %v", got.WorkerCPULoadMs, got.WorkerCPUHintMs)
	}
}

// TestOnLayoutGivesABusyWorkersExpertsTheirShareOfTheWall: with top-8 on
// four workers the busiest owner of a resident layer holds about three
// of its experts; a measured wall (two hops and the slowest result) too
// short for three at the slowest result's cost gives an expert its share
// of it and the hops nothing; a wall that holds them (top-2) is kept.
func TestOnLayoutGivesABusyWorkersExpertsTheirShareOfTheWall(t *testing.T) {
	four, err := sched.NewLayout(4, 4)
	if err != nil {
		t.Fatal(err)
	}
	wide := Shape{Layers: 1, Experts: 128, TopK: 8}
	m := residentBusiest(wide, four)
	if m < 3.3 || m > 3.6 {
		t.Fatalf("the busiest of four owners holds %v of a layer's 8 experts, want about 3.5", m)
	}
	got := Profile{HopMs: 1, ExpertMs: 4}.OnLayout(wide, four)
	if math.Abs(got.ExpertMs-6/m) > 1e-9 || got.HopMs != 0 {
		t.Errorf("expert_ms %v, hop_ms %v: want %v, 0", got.ExpertMs, got.HopMs, 6/m)
	}
	two, err := sched.NewLayout(4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := (Profile{HopMs: 1, ExpertMs: 1}).OnLayout(Shape{Layers: 8, Experts: 8, TopK: 2}, two); got.ExpertMs != 1 || got.HopMs != 1 {
		t.Errorf("a wall that holds the experts changed: %+v", got)
	}
}
