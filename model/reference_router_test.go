package model

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// deepseekRouter64 is transformers' DeepseekV3TopkRouter in float64,
// written from its Python: scores = sigmoid(logits); scores_for_choice =
// scores + e_score_correction_bias; group scores = the sum of each
// group's top-2 choices; topk_group groups kept; every other expert's
// choice masked_fill(0.0); top-k over the choices; weights the scores
// gathered at those indices, over their sum + 1e-20 when norm_topk_prob,
// times routed_scaling_factor. It returns the experts ascending and their
// weights.
func deepseekRouter64(logits []float32, bias []float32, nGroup, topkGroup, k int, norm bool, scale float64) ([]int, []float64) {
	E := len(logits)
	scores, choice := make([]float64, E), make([]float64, E)
	for e, x := range logits {
		scores[e] = 1 / (1 + math.Exp(-float64(x)))
		choice[e] = scores[e] + float64(bias[e])
	}
	per := E / nGroup
	type group struct {
		i     int
		score float64
	}
	groups := make([]group, nGroup)
	for i := range groups {
		g := slices.Clone(choice[i*per : (i+1)*per])
		sort.Sort(sort.Reverse(sort.Float64Slice(g)))
		groups[i] = group{i, g[0] + g[1]}
	}
	sort.SliceStable(groups, func(a, b int) bool { return groups[a].score > groups[b].score })
	kept := map[int]bool{}
	for _, g := range groups[:topkGroup] {
		kept[g.i] = true
	}
	for e := range choice {
		if !kept[e/per] {
			choice[e] = 0
		}
	}
	idx := make([]int, E)
	for e := range idx {
		idx[e] = e
	}
	sort.SliceStable(idx, func(a, b int) bool { return choice[idx[a]] > choice[idx[b]] })
	top := slices.Clone(idx[:k])
	slices.Sort(top)
	w := make([]float64, k)
	sum := 1e-20
	for i, e := range top {
		w[i] = scores[e]
		sum += w[i]
	}
	for i := range w {
		if norm {
			w[i] /= sum
		}
		w[i] *= scale
	}
	return top, w
}

// TestGroupedRouterMatchesTransformers: routeGrouped chooses the experts
// transformers' DeepseekV3TopkRouter chooses, with its weights within
// float32 rounding, over random tokens of a 64-expert router in 8 groups
// of which 3 are kept, top-6, with and without renormalising, with biases
// that are sometimes negative enough for a dropped group's expert (its
// choice 0) to win a place. The cases are made so that every detail
// decides some of them: without the bias, without the group limit, with
// the masked choices at minus infinity instead of 0, other experts would
// be chosen.
func TestGroupedRouterMatchesTransformers(t *testing.T) {
	const E, groups, kept, k = 64, 8, 3, 6
	rng := rand.New(rand.NewPCG(36, 3))
	var byBias, byGroups, byZeroMask int
	for tok := range 400 {
		logits, bias := make([]float32, E), make([]float32, E)
		for e := range logits {
			logits[e] = float32(rng.NormFloat64() * 2)
			bias[e] = float32(rng.NormFloat64() * 0.3)
			if tok%5 == 0 {
				bias[e] -= 0.9 // every biased choice below 0: masked experts compete
			}
		}
		norm := tok%2 == 0
		g := &GroupRouting{Bias: bias, Groups: groups, GroupsKept: kept, Scale: 2.5}
		got := make([]Route, k)
		routeGrouped(got, logits, make([]float32, g.scratch(E)), g, norm)
		want, weights := deepseekRouter64(logits, bias, groups, kept, k, norm, 2.5)
		for i, r := range got {
			if r.Expert != want[i] {
				t.Fatalf("token %d: experts %v, transformers' %v", tok, got, want)
			}
			if d := math.Abs(float64(r.Weight)-weights[i]) / weights[i]; d > 1e-5 {
				t.Fatalf("token %d expert %d: weight %v, transformers' %v", tok, r.Expert, r.Weight, weights[i])
			}
		}
		// what each detail decides
		zero := make([]float32, E)
		if e, _ := deepseekRouter64(logits, zero, groups, kept, k, norm, 2.5); !slices.Equal(e, want) {
			byBias++
		}
		if e, _ := deepseekRouter64(logits, bias, groups, groups, k, norm, 2.5); !slices.Equal(e, want) {
			byGroups++
		}
		if e := maskedAtMinusInf(logits, bias, groups, kept, k); !slices.Equal(e, want) {
			byZeroMask++
		}
	}
	t.Logf("of 400 tokens, the bias decided %d, the group limit %d, the 0 (not -inf) mask %d", byBias, byGroups, byZeroMask)
	if byBias == 0 || byGroups == 0 || byZeroMask == 0 {
		t.Fatalf("a detail decided no token (bias %d, groups %d, mask %d): the test would not see it removed", byBias, byGroups, byZeroMask)
	}
}

// maskedAtMinusInf is the router with dropped groups masked at minus
// infinity: only kept groups' experts can win.
func maskedAtMinusInf(logits, bias []float32, nGroup, topkGroup, k int) []int {
	lifted := slices.Clone(bias)
	for e := range lifted {
		lifted[e] += 10 // every choice positive: a 0 mask then drops like -inf
	}
	top, _ := deepseekRouter64(logits, lifted, nGroup, topkGroup, k, false, 1)
	return top
}

// TestAMoEBlockWithGroupRoutingRoutesWithIt: a MoE block with Grouped set
// routes every token with routeGrouped (the session's routes are those
// of its logits), not with the softmax router.
func TestAMoEBlockWithGroupRoutingRoutesWithIt(t *testing.T) {
	m := loadTiny(t)
	E, k := m.Config.NumExperts, m.Config.TopK
	rng := rand.New(rand.NewPCG(36, 4))
	for l := range m.Layers {
		if moe := m.Layers[l].MoE; moe != nil {
			bias := make([]float32, E)
			for e := range bias {
				bias[e] = float32(rng.NormFloat64() * 0.3)
			}
			moe.Grouped = &GroupRouting{Bias: bias, Groups: E / 2, GroupsKept: 2, Scale: 1.5}
		}
	}
	s := NewSession(m, NewResidentExperts(m), 0)
	var checked, unlikeSoftmax int
	s.OnRoute = func(_ Step, layer int, logits []float32, routes []Route) {
		g := m.Layers[layer].MoE.Grouped
		for t0 := 0; t0 < len(logits)/E; t0++ {
			want := make([]Route, k)
			routeGrouped(want, logits[t0*E:(t0+1)*E], make([]float32, g.scratch(E)), g, m.Layers[layer].MoE.NormTopK)
			if !slices.Equal(routes[t0*k:(t0+1)*k], want) {
				t.Fatalf("layer %d token %d: routes %v, routeGrouped %v", layer, t0, routes[t0*k:(t0+1)*k], want)
			}
			soft := make([]Route, k)
			route(soft, logits[t0*E:(t0+1)*E], make([]float32, E), m.Layers[layer].MoE.NormTopK)
			if !slices.Equal(soft, want) {
				unlikeSoftmax++
			}
			checked++
		}
	}
	if _, err := s.Forward(context.Background(), testTokens); err != nil {
		t.Fatal(err)
	}
	if checked == 0 || unlikeSoftmax == 0 {
		t.Fatalf("%d routings checked, %d unlike the softmax router's", checked, unlikeSoftmax)
	}
}

// gptOssRouter64 is transformers' GptOssTopKRouter in float64: logits =
// linear(x, W, b) (given here with the bias added), the top-k logits and
// their softmax. It returns the experts ascending and their weights.
func gptOssRouter64(logits []float64, k int) ([]int, []float64) {
	idx := make([]int, len(logits))
	for e := range idx {
		idx[e] = e
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	top := slices.Clone(idx[:k])
	vals := make([]float64, k)
	for i, e := range top {
		vals[i] = logits[e]
	}
	p := softmax64(vals)
	w := map[int]float64{}
	for i, e := range top {
		w[e] = p[i]
	}
	slices.Sort(top)
	ws := make([]float64, k)
	for i, e := range top {
		ws[i] = w[e]
	}
	return top, ws
}

// TestTopKSoftmaxRouterMatchesTransformers: routeTopKSoftmax chooses the
// experts transformers' GptOssTopKRouter chooses, weighted by the softmax
// of the chosen logits alone (within float32 rounding), for 32 experts
// top-4 over 400 tokens; and the weights differ from the softmax over
// every expert, which a block without SoftmaxOfTopK would use.
func TestTopKSoftmaxRouterMatchesTransformers(t *testing.T) {
	const E, k = 32, 4
	rng := rand.New(rand.NewPCG(36, 5))
	var unlikeFull int
	for tok := range 400 {
		logits, l64 := make([]float32, E), make([]float64, E)
		for e := range logits {
			logits[e] = float32(rng.NormFloat64() * 2)
			l64[e] = float64(logits[e])
		}
		got := make([]Route, k)
		routeTopKSoftmax(got, logits, make([]float32, k))
		want, weights := gptOssRouter64(l64, k)
		for i, r := range got {
			if r.Expert != want[i] || math.Abs(float64(r.Weight)-weights[i]) > 1e-6*weights[i]+1e-9 {
				t.Fatalf("token %d: routes %v, transformers' %v %v", tok, got, want, weights)
			}
		}
		full := make([]Route, k)
		route(full, logits, make([]float32, E), false)
		if full[0].Weight != got[0].Weight {
			unlikeFull++
		}
	}
	if unlikeFull == 0 {
		t.Fatal("the softmax over the chosen logits never differed from the softmax over all")
	}
}

// TestAMoEBlockWithARouterBiasAndTopKSoftmaxRoutesWithThem: a MoE block
// with RouterBias and SoftmaxOfTopK set (and norm_topk_prob off) adds the
// bias to every token's logits (the session's logits are the biased
// ones) and routes them with routeTopKSoftmax, whose weights sum to one.
func TestAMoEBlockWithARouterBiasAndTopKSoftmaxRoutesWithThem(t *testing.T) {
	m := loadTiny(t)
	E, k := m.Config.NumExperts, m.Config.TopK
	plain := loadTiny(t)
	rng := rand.New(rand.NewPCG(36, 6))
	for l := range m.Layers {
		if moe := m.Layers[l].MoE; moe != nil {
			moe.RouterBias = make([]float32, E)
			for e := range moe.RouterBias {
				moe.RouterBias[e] = float32(rng.NormFloat64())
			}
			moe.SoftmaxOfTopK = true
			// off: the softmax router's weights would then not sum to one,
			// unlike the top-k's own softmax (with it on they are the same
			// numbers, computed otherwise)
			moe.NormTopK = false
		}
	}
	var unbiased [][]float32
	ps := NewSession(plain, NewResidentExperts(plain), 0)
	ps.OnRoute = func(_ Step, layer int, logits []float32, _ []Route) {
		if layer == 0 {
			unbiased = append(unbiased, slices.Clone(logits[:E]))
		}
	}
	if _, err := ps.Forward(context.Background(), testTokens[:1]); err != nil {
		t.Fatal(err)
	}
	s := NewSession(m, NewResidentExperts(m), 0)
	checked := 0
	s.OnRoute = func(_ Step, layer int, logits []float32, routes []Route) {
		if layer == 0 && checked == 0 {
			for e := range E {
				if logits[e] != unbiased[0][e]+m.Layers[0].MoE.RouterBias[e] {
					t.Fatalf("expert %d: logit %v, unbiased %v + bias %v", e, logits[e], unbiased[0][e], m.Layers[0].MoE.RouterBias[e])
				}
			}
		}
		for t0 := 0; t0 < len(logits)/E; t0++ {
			want := make([]Route, k)
			routeTopKSoftmax(want, logits[t0*E:(t0+1)*E], make([]float32, k))
			if !slices.Equal(routes[t0*k:(t0+1)*k], want) {
				t.Fatalf("layer %d token %d: routes %v, routeTopKSoftmax %v", layer, t0, routes[t0*k:(t0+1)*k], want)
			}
			var sum float32
			for _, r := range routes[t0*k : (t0+1)*k] {
				sum += r.Weight
			}
			if math.Abs(float64(sum)-1) > 1e-5 {
				t.Fatalf("layer %d token %d: weights sum to %v, not one", layer, t0, sum)
			}
			checked++
		}
	}
	if _, err := s.Forward(context.Background(), testTokens[:1]); err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no routing checked")
	}
}
