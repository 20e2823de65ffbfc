package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"

	"github.com/odmoe/odmoe/sched"
)

// LayerStats is one layer's figures of a run's -stats (decode_layers,
// prefill_layers): summed over calls.
type LayerStats struct {
	Layer     int     `json:"layer"`
	Calls     int     `json:"calls"`
	MainMs    float64 `json:"main_ms"`
	WorkerMs  float64 `json:"worker_ms"`  // the slowest request's compute
	NetworkMs float64 `json:"network_ms"` // round trips, the slowest request's
	StallMs   float64 `json:"stall_ms"`   // the wait for the slowest request's load
	LoadMs    float64 `json:"load_ms"`
	Loads     int     `json:"loads"`
}

// Measured is one measured bench rig run, as calibration reads it.
type Measured struct {
	Prompt, Output   int
	DecodeTokensPerS float64
	Decode           []LayerStats
	Prefill          []LayerStats
	// Passes are the figures of each forward pass, summed over its
	// layers (Layer holds the pass; 1 is the prompt), as -stats
	// writes them: what the main node's layer costs as the context grows
	Passes []LayerStats
	// CPUSeconds by role ("main", "stages", "shadow", "workers"), when every node
	// ran on the measuring machine: over the whole run (start-up, prefill
	// and the figures' collection too), or, with DecodeCPU, over its
	// decode steps alone
	CPUSeconds map[string]float64
	DecodeCPU  bool
	// Recall is the run's shadow recall (eq. 3; 1 without a shadow);
	// TTFTms its time to the first token.
	Recall, TTFTms float64
}

// cpuTokens is what m's CPUSeconds are spread over to give a decode
// token's: its decode steps, or, for a whole run's, its output tokens.
func (m Measured) cpuTokens() float64 {
	if m.DecodeCPU {
		return float64(max(m.Output-1, 1))
	}
	return float64(m.Output)
}

// Calibrate fits a profile to a resident and a shadow-driven run of the
// same case on one rig: the main node's layer and token times, a
// worker's expert time and the hop from the resident run; the load time
// and the shadow from the shadow run; the prefill costs from the resident
// run's prefill; and, when cores > 0 (the nodes shared that many) and
// both runs have their CPU by role, what each role's CPU costs a token.
// The shadow's layer time is its CPU time a token over the layers: its
// forward pass, on one core. When the resident run has its passes'
// figures, the main node's layer grows with the context: its cost per
// cached position is fitted to them (positionSlope), the shadow's taken
// to be the same (the same attention over the same KV cache), and the
// fixed costs are what remains at position 0.
func Calibrate(name string, s Shape, cores int, linkBytesPerS float64, resident, shadow Measured) (Profile, error) {
	p := Profile{Name: name, LinkBytesPerS: linkBytesPerS, Cores: cores}
	rd := withCalls(resident.Decode)
	sd := withCalls(shadow.Decode)
	if len(rd) < 1 || len(sd) < 1 {
		return p, fmt.Errorf("sim: calibration needs decode figures of a layer in both runs (resident %d, shadow %d)", len(rd), len(sd))
	}
	// layer 0's main time also holds the token's own work (embedding,
	// the previous token's head and sampling): a layer's is the others'
	// mean, or, with one layer (the presets of real layer shapes), layer
	// 0's, the token's work then left to the decode rate
	var main, worker, network float64
	for _, l := range rd[min(1, len(rd)-1):] {
		main += l.MainMs / float64(l.Calls)
	}
	main /= float64(max(len(rd)-1, 1))
	for _, l := range rd {
		worker += l.WorkerMs / float64(l.Calls)
		network += l.NetworkMs / float64(l.Calls)
	}
	worker /= float64(len(rd))
	network /= float64(len(rd))
	slope := positionSlope(resident)
	p.MainPositionMs, p.ShadowPositionMs = slope, slope
	resPos, shPos := meanDecodePosition(resident), meanDecodePosition(shadow)
	p.MainLayerMs = max(0, main-slope*resPos)
	// the rest of a token: what its decode time holds beyond its layers'
	// main time (the mean of layers 1.. for each) and experts: layer 0's
	// excess (the embedding, or all of what ran since the last pass, as
	// older figures counted it) and the output head and sampling between
	// passes; without the rate, layer 0's excess alone
	p.MainTokenMs = max(0, rd[0].MainMs/float64(rd[0].Calls)-main)
	if resident.DecodeTokensPerS > 0 && len(rd) == moe(s) {
		layersMs := float64(len(rd)) * main
		for _, l := range rd {
			layersMs += (l.WorkerMs + l.NetworkMs) / float64(l.Calls)
		}
		p.MainTokenMs = max(0, 1000/resident.DecodeTokensPerS-layersMs)
	}
	p.ExpertMs = worker
	wire := 1000 * float64(s.HiddenBytes) / linkBytesPerS
	p.HopMs = max(0, network/2-wire)
	var loadMs float64
	var loads int
	for _, l := range sd {
		loadMs += l.LoadMs
		loads += l.Loads
	}
	if loads == 0 {
		return p, fmt.Errorf("sim: the shadow run made no loads to calibrate them from")
	}
	// the hop while loads run: the shadow run's round trips, as the
	// resident run's give HopMs; kept only where it differs (the shared
	// cores of the emulated rig), as a rig of separate nodes has one hop
	var loadingNet float64
	for _, l := range sd {
		loadingNet += l.NetworkMs / float64(l.Calls)
	}
	p.LoadingHopMs = max(0, loadingNet/float64(len(sd))/2-wire)
	p.dropSameLoadingHop()
	p.LoadBytesPerS = float64(s.ExpertBytes) / (loadMs / float64(loads) / 1000)
	if rp := withCalls(resident.Prefill); len(rp) > 0 && resident.Prompt > 1 {
		var m, w float64
		for _, l := range rp {
			m += l.MainMs
			w += l.WorkerMs
		}
		m, w = m/float64(len(rp)), w/float64(len(rp))
		// the first token costs what a decode token does; the layer's
		// slowest expert ran its busiest expert's tokens
		p.MainPrefillTokenMs = max(0, (m-p.MainLayerMs)/float64(resident.Prompt-1))
		if busiest := expectedBusiest(s, resident.Prompt, 0); busiest > 1 { // drawn evenly: SplitPrefill and PrefillLines read a skew's
			p.ExpertPrefillTokenMs = max(0, (w-p.ExpertMs)/(busiest-1))
		}
	}
	sh := shadow.CPUSeconds["shadow"]
	if sh <= 0 || shadow.Output < 2 {
		return p, fmt.Errorf("sim: the shadow run has no CPU time of its shadow node: its time a layer cannot be calibrated")
	}
	layers := float64(s.Layers)
	p.ShadowCPUTokenMs = max(0, 1000*sh/shadow.cpuTokens()-layers*slope*shPos)
	p.ShadowLayerMs = p.ShadowCPUTokenMs / layers
	if cores > 0 {
		rc, sc := resident.CPUSeconds, shadow.CPUSeconds
		if rc == nil || sc == nil {
			return p, fmt.Errorf("sim: shared cores but the runs have no CPU time by role")
		}
		tokens := resident.cpuTokens()
		// a main node's stages are its layers, elsewhere (their CPU the
		// main node's)
		p.MainCPUTokenMs = max(0, 1000*(rc["main"]+rc["stages"])/tokens-layers*slope*resPos)
		experts := tokens * float64(moe(s)*s.TopK)
		p.WorkerCPUExpertMs = 1000 * rc["workers"] / experts
		// what the shadow run's workers spent beyond computing: loads
		// (those of its decode when the CPU is the decode's)
		extra := 1000*sc["workers"] - p.WorkerCPUExpertMs*shadow.cpuTokens()*float64(moe(s)*s.TopK)
		p.WorkerCPULoadMs = max(0, extra/float64(loads))
		// the shadow run was CPU-bound (it is on two shared cores): the
		// share of the cores it kept busy at its measured rate
		if shadow.DecodeTokensPerS > 0 {
			cpu := p.tokenCPUMs(s, float64(loads)/float64(shadow.Output-1), true, shPos)
			p.CPUEfficiency = min(1, shadow.DecodeTokensPerS*cpu/(1000*float64(cores)))
		}
	}
	return p, p.Validate()
}

// MedianProfile is the profile whose every figure is the median of ps'
// (the mean of the middle two for an even count): the calibrations on
// each run of a repeated case, as a shared machine's speed drifts between
// runs (and a run a fifth faster than the other two would pull a mean
// off what the median run measured); its name, sources and cores are
// ps[0]'s. The figures whose 0 stands for another value count as that
// value: a LoadingHopMs of 0 as HopMs (and dropped again as Calibrate
// drops it), a CPUEfficiency of 0 as 1.
func MedianProfile(ps []Profile) Profile {
	if len(ps) == 0 {
		return Profile{}
	}
	ps = slices.Clone(ps)
	for i := range ps {
		if ps[i].LoadingHopMs == 0 {
			ps[i].LoadingHopMs = ps[i].HopMs
		}
		if ps[i].CPUEfficiency == 0 {
			ps[i].CPUEfficiency = 1
		}
	}
	out := ps[0]
	v := reflect.ValueOf(&out).Elem()
	vs := make([]float64, len(ps))
	for f := range v.NumField() {
		if v.Field(f).Kind() != reflect.Float64 {
			continue
		}
		for i, p := range ps {
			vs[i] = reflect.ValueOf(p).Field(f).Float()
		}
		slices.Sort(vs)
		n := len(vs)
		v.Field(f).SetFloat((vs[(n-1)/2] + vs[n/2]) / 2)
	}
	out.dropSameLoadingHop()
	return out
}

// dropSameLoadingHop leaves LoadingHopMs 0 (the hop) unless it exceeds
// HopMs by more than 10%: a rig of separate nodes has one hop.
func (p *Profile) dropSameLoadingHop() {
	if p.LoadingHopMs <= p.HopMs*1.1 {
		p.LoadingHopMs = 0
	}
}

// meanDecodePosition is the mean count of cached positions over a run's
// decode steps (Run's positions: the prompt, then one more a step).
func meanDecodePosition(m Measured) float64 {
	return float64(m.Prompt) + float64(max(0, m.Output-2))/2
}

// positionSlope fits what one more cached position adds to the main
// node's decode layer: the Theil-Sen slope (the median of the pairwise
// slopes, which the emulated rig's scheduling spikes do not move) of a
// decode pass's main time a layer against its position; 0 when the
// run has too few decode passes or the slope is not positive.
func positionSlope(m Measured) float64 {
	type point struct{ pos, ms float64 }
	var pts []point
	for _, it := range m.Passes {
		if it.Layer < 2 || it.Calls == 0 { // 1: the prompt
			continue
		}
		pts = append(pts, point{float64(m.Prompt + it.Layer - 2), it.MainMs / float64(it.Calls)})
	}
	// at most 256 points, evenly spread: 32640 pairs
	if n := len(pts); n > 256 {
		kept := make([]point, 256)
		for i := range kept {
			kept[i] = pts[i*n/256]
		}
		pts = kept
	}
	var slopes []float64
	for i := range pts {
		for j := i + 1; j < len(pts); j++ {
			if dx := pts[j].pos - pts[i].pos; dx != 0 {
				slopes = append(slopes, (pts[j].ms-pts[i].ms)/dx)
			}
		}
	}
	if len(slopes) < 3 {
		return 0
	}
	slices.Sort(slopes)
	return max(0, slopes[len(slopes)/2])
}

func withCalls(ls []LayerStats) []LayerStats {
	return slices.DeleteFunc(slices.Clone(ls), func(l LayerStats) bool { return l.Calls == 0 })
}

func moe(s Shape) int {
	if s.ExpertLayers == nil {
		return s.Layers
	}
	return len(s.ExpertLayers)
}

// expectedBusiest is the mean count of tokens the busiest expert of a
// layer gets of a prompt of n tokens, each routed to TopK distinct experts
// drawn as a profile of PromptSkew by draws them (0: evenly, as Run draws
// a prompt's).
func expectedBusiest(s Shape, n int, by float64) float64 {
	return promptDraws(s, n, by, sched.Layout{}).busiest
}

// FitPrefillMessage returns p with PrefillMessageMs set so that a
// resident run o (o.Mode is taken to be Resident) on layout takes ttftMs
// to its first token, as a measured run did. It stays 0 where the
// timeline without it already takes that long.
func FitPrefillMessage(p Profile, layout sched.Layout, s Shape, o Options, ttftMs float64) (Profile, error) {
	return fitPrefillMessage(p, layout, s, o, ttftMs, 0)
}

// fitPrefillMessage is FitPrefillMessage with lo the least
// PrefillMessageMs it may fit.
func fitPrefillMessage(p Profile, layout sched.Layout, s Shape, o Options, ttftMs, lo float64) (Profile, error) {
	o.Mode = Resident
	// no message takes longer than the whole prompt
	v, err := bisectTTFT(p, layout, s, o, ttftMs, lo, ttftMs, func(q *Profile, v float64) { q.PrefillMessageMs = v })
	p.PrefillMessageMs = v
	return p, err
}

// FitPrefillMessages returns p with PrefillMessageMs and
// PrefillBytesPerS set so that resident runs o and longer (a longer
// prompt; their modes are taken to be Resident) on layout take ttftMs
// and longerMs to their first tokens, as measured runs did: a message's
// fixed cost and its bytes' rate, which one prompt length cannot tell
// apart. Each is fitted in turn with the other held, until neither
// moves.
func FitPrefillMessages(p Profile, layout sched.Layout, s Shape, o Options, ttftMs float64, longer Options, longerMs float64) (Profile, error) {
	longer.Mode = Resident
	if longer.Prompt <= o.Prompt {
		return p, fmt.Errorf("sim: fitting a prompt's messages needs a longer prompt than %d tokens, not %d", o.Prompt, longer.Prompt)
	}
	// ms a byte: from nearly free to a rate at which one layer's bytes
	// alone take the whole time
	hi := longerMs / float64(longer.Prompt*s.TopK) / float64(s.HiddenBytes)
	perByte := 1000 / p.LinkBytesPerS
	// where the shorter prompt takes as long as it did with its messages
	// free (the compute alone, as measured at two lengths, on a noisy
	// machine), its messages cost nothing fixed and the longer one's
	// bytes take what is left of its time: a fixed cost fitted below
	// nothing there would be no message's cost but the noise's
	free := p
	free.PrefillMessageMs, free.PrefillBytesPerS = 0, 1000/(hi*1e-6)
	short := o
	short.Mode, short.Output = Resident, 2
	if base, err := Expect(free, layout, s, short, ExpectRuns); err != nil {
		return p, err
	} else if base.TTFTms >= ttftMs {
		p.PrefillMessageMs = 0
		perByte, err = bisectTTFT(p, layout, s, longer, longerMs, hi*1e-6, hi, func(q *Profile, v float64) { q.PrefillBytesPerS = 1000 / v })
		p.PrefillBytesPerS = 1000 / perByte
		return p, err
	}
	for range 8 {
		p.PrefillBytesPerS = 1000 / perByte
		q, err := fitPrefillMessage(p, layout, s, o, ttftMs, -ttftMs)
		if err != nil {
			return p, err
		}
		was := perByte
		if perByte, err = bisectTTFT(q, layout, s, longer, longerMs, hi*1e-6, hi, func(q *Profile, v float64) { q.PrefillBytesPerS = 1000 / v }); err != nil {
			return p, err
		}
		p = q
		if math.Abs(perByte/was-1) < 1e-3 {
			break
		}
	}
	p.PrefillBytesPerS = 1000 / perByte
	return fitPrefillMessage(p, layout, s, o, ttftMs, -ttftMs)
}

// Point is a measured run a figure is fitted to: its options and what
// it measured (a time to first token, or decode loads a step).
type Point struct {
	O    Options
	Want float64
}

// FitPrefillLoads returns p with PrefillLoadCPUMs set so that reactive
// runs (their modes are taken to be Reactive) on layout take the times
// to first token they measured: one, exactly; several (the bench's two
// prompt lengths), missed as alike as one value allows (their relative
// errors summing to nothing). Unchanged where the nodes have cores of
// their own.
func FitPrefillLoads(p Profile, layout sched.Layout, s Shape, pts ...Point) (Profile, error) {
	if p.Cores == 0 || len(pts) == 0 {
		return p, nil
	}
	// a load's CPU somewhere between nothing and the longest prompt's time
	hi := 0.0
	for i := range pts {
		pts[i].O.Mode, pts[i].O.Output = Reactive, 2 // the first token is all it times
		hi = max(hi, pts[i].Want)
	}
	v, err := bisectAlike(1e-6, hi, pts, false, func(x float64, o Options) (float64, error) {
		q := p
		q.PrefillLoadCPUMs = x
		res, err := Expect(q, layout, s, o, ExpectRuns)
		return res.TTFTms, err
	})
	p.PrefillLoadCPUMs = v
	return p, err
}

// bisectAlike returns the x in [lo, hi] at which the runs pts, each
// measuring f (rising with x, or falling), miss their Want by relative
// errors that sum to nothing (to 40 halvings): one point's x meets it;
// two points' miss them alike, one over and one under. lo where they are
// past it already, hi where still short.
func bisectAlike(lo, hi float64, pts []Point, falling bool, f func(x float64, o Options) (float64, error)) (float64, error) {
	g := func(x float64) (float64, error) {
		var sum float64
		for _, pt := range pts {
			y, err := f(x, pt.O)
			if err != nil {
				return 0, err
			}
			sum += y/pt.Want - 1
		}
		if falling {
			sum = -sum
		}
		return sum, nil
	}
	return bisect(lo, hi, 0, g)
}

// bisectTTFT returns the value between lo and hi of the figure set sets
// at which a run o takes ttftMs to its first token (the time rising with
// the figure), or lo where it takes that long already.
func bisectTTFT(p Profile, layout sched.Layout, s Shape, o Options, ttftMs, lo, hi float64, set func(*Profile, float64)) (float64, error) {
	o.Output = 2 // the first token is all it times
	return bisect(lo, hi, ttftMs, func(v float64) (float64, error) {
		q := p
		set(&q, v)
		res, err := Expect(q, layout, s, o, ExpectRuns)
		return res.TTFTms, err
	})
}

// bisect returns the x in [lo, hi] at which f, rising with x, meets
// target (to 40 halvings), or lo where f(lo) is at target already.
func bisect(lo, hi, target float64, f func(x float64) (float64, error)) (float64, error) {
	if y, err := f(lo); err != nil || y >= target {
		return lo, err
	}
	for range 40 {
		mid := (lo + hi) / 2
		y, err := f(mid)
		if err != nil {
			return lo, err
		}
		if y < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2, nil
}

// FitShadowPrefill returns p with ShadowPromptMs and
// ShadowPrefillTokenMs set so that shadow-driven runs (their modes are
// taken to be Shadow) on layout take the times to first token they
// measured (Point.Want); all 0 where the nodes have cores of their own.
// Two runs at different prompt lengths (the bench's): what the shadow's
// pass adds to each beyond the timeline is measured at both, so the two
// figures are the line through them (over the shared cores) and no share
// bounds it. One run, or two whose line would cost a prompt less than
// nothing: as shadowPrefillAtOne at the first.
func FitShadowPrefill(p Profile, layout sched.Layout, s Shape, local [][2]float64, pts ...Point) (Profile, error) {
	if len(pts) >= 2 && p.Cores > 0 {
		q := p
		q.ShadowPromptMs, q.ShadowPrefillTokenMs, q.ShadowPromptShare = 0, 0, 0
		var xs [2][2]float64 // prompt tokens, the CPU the shadow's pass added
		ok := true
		for i, pt := range pts[:2] {
			o := pt.O
			o.Output, o.Mode = 2, Shadow
			res, err := Expect(q, layout, s, o, ExpectRuns)
			if err != nil {
				return p, err
			}
			xs[i] = [2]float64{float64(o.Prompt), (pt.Want - res.TTFTms) * q.sharedCores()}
			ok = ok && xs[i][1] > 0
		}
		if ok && xs[0][0] != xs[1][0] {
			perToken := (xs[1][1] - xs[0][1]) / (xs[1][0] - xs[0][0])
			if fixed := xs[0][1] - xs[0][0]*perToken; perToken >= 0 && fixed >= 0 {
				q.ShadowPromptMs, q.ShadowPrefillTokenMs = fixed, perToken
				return q, nil
			}
		}
	}
	if len(pts) == 0 {
		return p, nil
	}
	return shadowPrefillAtOne(p, layout, s, pts[0].O, pts[0].Want, local)
}

// shadowPrefillAtOne fits ShadowPromptMs and ShadowPrefillTokenMs to one
// shadow-driven run o that took ttftMs to its first token, their ratio
// that of the fixed and per-token parts of local (local mode's times to
// first token: a prompt's tokens each, and the time; one is taken to be
// all per token), and ShadowPromptShare the least share that makes it
// so: the shadow's pass ending with the prompt's; all 0 where the nodes
// have cores of their own, or where the timeline alone already takes
// that long.
func shadowPrefillAtOne(p Profile, layout sched.Layout, s Shape, o Options, ttftMs float64, local [][2]float64) (Profile, error) {
	o.Output = 2 // the first token is all it times
	o.Mode = Shadow
	p.ShadowPromptMs, p.ShadowPrefillTokenMs, p.ShadowPromptShare = 0, 0, 0
	res, err := Expect(p, layout, s, o, ExpectRuns)
	if err != nil || p.Cores == 0 || res.TTFTms >= ttftMs || o.Prompt < 1 {
		return p, err
	}
	fixed, perToken := lineFit(local)
	if perToken <= 0 || fixed < 0 { // no shape to go by: all a token's
		fixed, perToken = 0, 1
	}
	// TTFT grows by scale * (fixed + Prompt * perToken) over the shared cores
	scale := (ttftMs - res.TTFTms) * p.sharedCores() / (fixed + float64(o.Prompt)*perToken)
	p.ShadowPromptMs, p.ShadowPrefillTokenMs = scale*fixed, scale*perToken
	// the prompt's pass alone took T = res.TTFTms - MainTokenMs and the
	// shadow's added x: T/(1 - share) = T + x
	if alone, x := res.TTFTms-p.MainTokenMs, ttftMs-res.TTFTms; alone > 0 {
		p.ShadowPromptShare = x / (alone + x)
	}
	return p, nil
}

// SplitPrefill returns p with a prompt layer's costs split anew into
// what its first token costs and what each further one adds, keeping
// their sum at a prompt of prompt tokens (the calibration's). One prompt
// length cannot split them, and Calibrate takes the first token to cost
// a decode token's, which a prompt's kernels do not: a tiny expert's
// batch costs 0.3 ms fixed against 0.03 ms a decode token, so its 128th
// token was predicted far dearer than it is. wholeTokenMs is what one
// more prompt token adds to the whole model's pass in one process (local
// mode's times to first token against the prompt's length, the same
// machine): a layer's share of it is split between its main part and its
// experts by the weights each multiplies a token by (Shape.MainWeights,
// ExpertWeights). Unchanged where wholeTokenMs is not positive or the
// weights are not known.
func (p Profile) SplitPrefill(s Shape, prompt int, wholeTokenMs float64) Profile {
	if wholeTokenMs <= 0 || s.MainWeights <= 0 || s.ExpertWeights <= 0 || prompt < 2 {
		return p
	}
	// the slowest expert's time at the calibration's prompt as Calibrate
	// read it (its busiest expert's tokens as an even draw's), split by
	// the busiest expert's tokens as the profile draws a prompt
	busiest := expectedBusiest(s, prompt, p.PromptSkew)
	mainAt := p.mainPrefillFirstMs() + float64(prompt-1)*p.MainPrefillTokenMs
	expertAt := p.expertPrefillFirstMs() + (expectedBusiest(s, prompt, 0)-1)*p.ExpertPrefillTokenMs
	perLayer := wholeTokenMs / float64(s.Layers)
	weights := float64(s.MainWeights) + float64(s.TopK)*float64(s.ExpertWeights)
	p.MainPrefillLayerMs, p.MainPrefillTokenMs = splitAt(mainAt, float64(prompt), perLayer*float64(s.MainWeights)/weights)
	p.ExpertPrefillMs, p.ExpertPrefillTokenMs = splitAt(expertAt, busiest, perLayer*float64(s.ExpertWeights)/weights)
	return p
}

// splitAt splits at, the time of n tokens, into the first token's and
// each further one's, perToken each where the first keeps a positive
// share (else every token alike, at / n).
func splitAt(at, n, perToken float64) (first, each float64) {
	if n <= 1 {
		return at, perToken
	}
	if first = at - (n-1)*perToken; first > 0 {
		return first, perToken
	}
	return at / n, at / n
}

// PrefillSlope is what one more prompt token adds to a pass over the
// prompt: the slope of the least-squares line through pts (prompt
// tokens, time), 0 without two different lengths.
func PrefillSlope(pts [][2]float64) float64 {
	if !slices.ContainsFunc(pts, func(q [2]float64) bool { return q[0] != pts[0][0] }) {
		return 0 // none, or one length: lineFit's y/x is no slope
	}
	_, b := lineFit(pts)
	return max(0, b)
}

// lineFit is the least-squares line y = a + b x through pts; a = 0 and
// b = y/x for one x (or none of two different x).
func lineFit(pts [][2]float64) (a, b float64) {
	var mx, my float64
	for _, q := range pts {
		mx, my = mx+q[0], my+q[1]
	}
	if len(pts) == 0 || mx == 0 {
		return 0, 0
	}
	mx, my = mx/float64(len(pts)), my/float64(len(pts))
	var num, den float64
	for _, q := range pts {
		num += (q[0] - mx) * (q[1] - my)
		den += (q[0] - mx) * (q[0] - mx)
	}
	if den == 0 {
		return 0, my / mx
	}
	b = num / den
	return my - b*mx, b
}

// FitRouteRepeat returns p with RouteRepeat set so that shadow-driven
// runs (their modes are taken to be Shadow) on layout load the experts a
// decode step they measured (Point.Want): the model's routing locality,
// which the loads a token show (a layer that routes the next token to an
// expert a worker holds for it loads nothing). One run's loads are met;
// several runs' (the bench's two prompt lengths: the small preset loads
// 9.6 a token after a 16-token prompt, 11.3 after 128) missed as alike as
// one locality allows. It stays 0 where even drawing every token's
// experts anew loads no more than that.
func FitRouteRepeat(p Profile, layout sched.Layout, s Shape, pts ...Point) (Profile, error) {
	for i := range pts {
		pts[i].O.Mode = Shadow
	}
	// the loads a step fall as the locality rises
	saved, err := bisectAlike(0, maxRouteRepeat, pts, true, func(repeat float64, o Options) (float64, error) {
		q := p
		q.RouteRepeat = repeat
		res, err := Expect(q, layout, s, o, ExpectRuns)
		// a run's figures count the loads a request used
		return float64(res.Loads-res.WastedLoads) / float64(o.Output-1), err
	})
	p.RouteRepeat = saved
	return p, err
}

// maxRouteRepeat is the locality FitRouteRepeat tries at most.
const maxRouteRepeat = 0.98

// PrefillLines returns p with a prompt layer's costs read from two
// resident runs at different prompt lengths (their prefill figures): the
// main node's part of a layer and a layer's slowest expert, each a line
// through its two measurements against the prompt's tokens (the busiest
// expert's, for the expert): what a first token costs and what each
// further one adds, as the swarm ran them (on shared cores, each worker's
// expert beside the others', slower than local mode's). ok is false, and
// p unchanged, where either run has no prefill figures, the lengths are
// the same, or a line would give a first token a negative cost.
func (p Profile) PrefillLines(s Shape, a, b Measured) (q Profile, ok bool) {
	if a.Prompt > b.Prompt {
		a, b = b, a
	}
	perLayer := func(m Measured) (main, worker float64, ok bool) {
		ls := withCalls(m.Prefill)
		if len(ls) == 0 {
			return 0, 0, false
		}
		for _, l := range ls {
			main += l.MainMs / float64(l.Calls)
			worker += l.WorkerMs / float64(l.Calls)
		}
		return main / float64(len(ls)), worker / float64(len(ls)), true
	}
	ma, wa, okA := perLayer(a)
	mb, wb, okB := perLayer(b)
	if !okA || !okB || a.Prompt < 1 || b.Prompt <= a.Prompt {
		return p, false
	}
	mainToken := (mb - ma) / float64(b.Prompt-a.Prompt)
	mainFirst := ma - float64(a.Prompt-1)*mainToken
	ba, bb := expectedBusiest(s, a.Prompt, p.PromptSkew), expectedBusiest(s, b.Prompt, p.PromptSkew)
	if bb <= ba {
		return p, false
	}
	expertToken := (wb - wa) / (bb - ba)
	expertFirst := wa - (ba-1)*expertToken
	if mainToken < 0 || mainFirst < 0 || expertToken < 0 || expertFirst < 0 {
		return p, false
	}
	p.MainPrefillLayerMs, p.MainPrefillTokenMs = mainFirst, mainToken
	p.ExpertPrefillMs, p.ExpertPrefillTokenMs = expertFirst, expertToken
	return p, true
}

// FitPrefillCPU returns p with PrefillCPUByteNs and PrefillMessageMs
// set so that resident runs o and longer (a longer prompt; their modes
// are taken to be Resident) on layout take ttftMs and longerMs to their
// first tokens, as measured runs did, with PrefillCPUTokenMs the prompt's
// compute as given and its messages' bytes at their links' rate
// (PrefillBytesPerS let go): on shared cores a long prompt's pass is
// CPU-bound, and a short one's waits on its messages one after another,
// each holding its node's turn (their fixed cost, never below nothing;
// where the short prompt takes longer than ttftMs with them free, its
// experts' first token, ExpertPrefillMs, comes down: fitShortPrompt).
// Each is fitted in turn with the other held, until neither moves; p is
// unchanged where the nodes have cores of their own.
func FitPrefillCPU(p Profile, layout sched.Layout, s Shape, o Options, ttftMs float64, longer Options, longerMs float64) (Profile, error) {
	if p.Cores == 0 {
		return p, nil
	}
	if longer.Prompt <= o.Prompt {
		return p, fmt.Errorf("sim: fitting a prompt's CPU needs a longer prompt than %d tokens, not %d", o.Prompt, longer.Prompt)
	}
	longer.Mode = Resident
	p.PrefillMessageMs, p.PrefillBytesPerS, p.PrefillCPUByteNs = 0, 0, 0
	// ns a byte: from nothing to what makes one layer's activations
	// alone take the whole time on the cores
	hi := 1e6 * longerMs * p.sharedCores() / float64(max(longer.Prompt*s.TopK, 1)*int(max(s.HiddenBytes, 1)))
	firstHi := p.expertPrefillFirstMs() // a prompt expert's first token as read: at most that
	for range 8 {
		q, err := fitShortPrompt(p, layout, s, o, ttftMs, firstHi)
		if err != nil {
			return p, err
		}
		was := p.PrefillCPUByteNs
		if q.PrefillCPUByteNs, err = bisectTTFT(q, layout, s, longer, longerMs, 0, hi, func(q *Profile, v float64) { q.PrefillCPUByteNs = v }); err != nil {
			return p, err
		}
		p = q
		if math.Abs(p.PrefillCPUByteNs-was) <= 1e-3*max(was, 1e-9) {
			break
		}
	}
	return fitShortPrompt(p, layout, s, o, ttftMs, firstHi)
}

// fitShortPrompt fits the shorter resident prompt o's time to its first
// token, ttftMs: its messages' fixed cost (fitPrefillMessage, never below
// nothing), and, where the timeline takes longer than ttftMs with them
// free, a prompt expert's first token (ExpertPrefillMs), at most firstHi
// (as read) and no less than a thousandth of it, to meet it: that cost
// is a bound from above (PrefillLines reads it off each layer's slowest
// expert, the most contended of its results, and the timeline runs a
// worker's experts in turn at it); on the Zen 4 VM the small preset's
// 16-token prompt took 138 ms where the timeline with free messages
// gave 172. Where even the least of it cannot meet ttftMs the experts
// are not what is long, and the first token is left as read.
func fitShortPrompt(p Profile, layout sched.Layout, s Shape, o Options, ttftMs, firstHi float64) (Profile, error) {
	p.ExpertPrefillMs = firstHi
	p, err := fitPrefillMessage(p, layout, s, o, ttftMs, 0)
	if err != nil || p.PrefillMessageMs > 0 {
		return p, err
	}
	o.Mode, o.Output = Resident, 2 // the first token is all it times
	at := func(first float64) (float64, error) {
		q := p
		q.ExpertPrefillMs = first
		res, err := Expect(q, layout, s, o, ExpectRuns)
		return res.TTFTms, err
	}
	lo := firstHi * 1e-3
	if t, err := at(firstHi); err != nil || t <= ttftMs {
		return p, err
	}
	if t, err := at(lo); err != nil || t > ttftMs {
		return p, err
	}
	p.ExpertPrefillMs, err = bisectTTFT(p, layout, s, o, ttftMs, lo, firstHi, func(q *Profile, v float64) { q.ExpertPrefillMs = v })
	return p, err
}

// FitPromptSkew returns p with PromptSkew set so that a layer of a prompt
// of prompt tokens uses used of its experts on average, as a measured
// reactive run's prompt loads say (each expert a prompt layer uses is
// loaded once); 0 where an even draw uses no more.
func FitPromptSkew(p Profile, s Shape, prompt int, used float64) (Profile, error) {
	p.PromptSkew = 0
	if prompt < 1 || used <= 0 {
		return p, nil
	}
	// fewer experts used as the skew grows (bisect's way: rising)
	by, err := bisect(0, maxPromptSkew, -used, func(by float64) (float64, error) {
		return -promptDraws(s, prompt, by, sched.Layout{}).used, nil
	})
	p.PromptSkew = by
	return p, err
}

// maxPromptSkew is the skew FitPromptSkew tries at most: the most chosen
// expert e^8 (~3000) times as likely as the next.
const maxPromptSkew = 8.0

// SplitLoadCPU returns p, calibrated from a shadow run (Calibrate), with
// the CPU its workers spent beyond computing split between loads and
// predictions by a reactive run of the same case, whose every load is
// one on demand: WorkerCPULoadMs becomes a reactive load's and
// WorkerCPUHintMs what each of the shadow's predictions cost besides
// (never below nothing: then a load costs the shadow run's). The share of
// the cores the shadow run kept busy is taken again. Unchanged where the
// nodes have cores of their own or the reactive run has no loads or no
// workers' CPU.
func (p Profile) SplitLoadCPU(s Shape, reactive, shadow Measured) Profile {
	rc := reactive.CPUSeconds
	if p.Cores == 0 || rc == nil || rc["workers"] <= 0 || shadow.Output < 2 {
		return p
	}
	loads := func(m Measured) float64 {
		var n int
		for _, l := range m.Decode {
			n += l.Loads
		}
		return float64(n)
	}
	rl, sl := loads(reactive), loads(shadow)
	if rl == 0 || sl == 0 {
		return p
	}
	acts := float64(moe(s) * s.TopK)
	perLoad := max(0, (1000*rc["workers"]-p.WorkerCPUExpertMs*reactive.cpuTokens()*acts)/rl)
	shadowLoads := p.WorkerCPULoadMs * sl // what Calibrate counted as the shadow run's loads
	if perLoad*sl >= shadowLoads {
		return p
	}
	p.WorkerCPULoadMs = perLoad
	p.WorkerCPUHintMs = (shadowLoads - perLoad*sl) / (float64(shadow.Output-1) * acts) // a decode step's, as tokenCPUMs counts them
	if shadow.DecodeTokensPerS > 0 {
		cpu := p.tokenCPUMs(s, sl/float64(shadow.Output-1), true, meanDecodePosition(shadow))
		p.CPUEfficiency = min(1, shadow.DecodeTokensPerS*cpu/(1000*float64(p.Cores)))
	}
	return p
}

// OnLayout returns p with its expert and hops read anew for a rig
// whose layout runs more than one of a decode layer's experts on a
// worker. Calibrate reads a layer's round trip from the resident run as
// its slowest request's time less its own expert's compute, and an
// expert's compute as the slowest result's; but a resident swarm's
// worker holds the experts its owner mapping gives it, and the busiest
// of a layer's runs several in turn (top-8 over four workers: 3.5 on
// average), which the timeline runs in turn too. So where the layer's
// wall (two hops and the slowest result) is less than the busiest
// worker's experts at the slowest result's cost, an expert's compute is
// its share of the wall (the slowest of eight results on shared cores is
// a contended outlier) and the hops nothing more; and the shadow run's
// hop (its workers each run ceil(k / group) of a layer) is less the
// experts before the slowest.
func (p Profile) OnLayout(s Shape, l sched.Layout) Profile {
	if m := residentBusiest(s, l); m > 1 {
		// where the wall cannot hold the busiest worker's experts at the
		// slowest result's cost, that cost is the outlier: an expert
		// gets its share of the wall, the hops nothing more
		if wall := 2*p.HopMs + p.ExpertMs; m*p.ExpertMs > wall { // less the wire both ways
			p.ExpertMs, p.HopMs = wall/m, 0
		}
	}
	each := (s.TopK + l.Group - 1) / max(l.Group, 1) // a worker's experts of a decode layer
	if each > 1 && p.LoadingHopMs > 0 {
		p.LoadingHopMs = max(0, p.LoadingHopMs-float64(each-1)*p.ExpertMs/2)
	}
	return p
}

// residentBusiest is how many of a decode layer's TopK experts, drawn
// evenly, the busiest worker of a resident swarm on l holds (each
// expert on its owner, sched.Layout.Owner), averaged over many draws.
func residentBusiest(s Shape, l sched.Layout) float64 {
	if l.Workers < 1 || s.TopK < 2 {
		return 1
	}
	rng := rand.New(rand.NewPCG(0xb05, uint64(l.Workers)))
	per := make([]int, l.Workers)
	const draws = 1024
	var sum float64
	for range draws {
		clear(per)
		for _, e := range rng.Perm(s.Experts)[:s.TopK] {
			per[l.Owner(0, e)]++
		}
		sum += float64(slices.Max(per))
	}
	return sum / draws
}

// ExpertPrefillFromWall returns p with ExpertPrefillMs, a prompt
// expert's first token, read from a resident run's prompt layers' wall
// (their slowest request's compute and the round trip around it, which
// holds the experts its worker ran before it) where that is less than
// p's: the busiest worker runs its experts in turn, each its first token
// and ExpertPrefillTokenMs for each further one, between two hops. Both
// are bounds from above: the slowest single expert (p's, PrefillLines')
// is the most contended of a layer's results, far above a typical one
// where a worker runs many experts of a layer (top-8 over four workers:
// ten to thirteen of a 16-token prompt's 41 experts); the wall holds the
// messages' time that the timeline counts again. ok is false, and p unchanged,
// where the run has no prefill figures or the wall gives no less.
func (p Profile) ExpertPrefillFromWall(s Shape, l sched.Layout, m Measured) (q Profile, ok bool) {
	ls := withCalls(m.Prefill)
	if len(ls) == 0 || m.Prompt < 1 || l.Workers < 1 {
		return p, false
	}
	var wall float64
	for _, x := range ls {
		wall += (x.WorkerMs + x.NetworkMs) / float64(x.Calls)
	}
	wall /= float64(len(ls))
	d := promptDraws(s, m.Prompt, p.PromptSkew, l)
	experts, tokens := d.workerExperts, d.tokens
	first := (wall - 2*p.HopMs - experts*(tokens-1)*p.ExpertPrefillTokenMs) / experts
	if first <= 0 || first >= p.expertPrefillFirstMs() {
		return p, false
	}
	p.ExpertPrefillMs = first
	return p, true
}
