package model

import (
	"math"
	"testing"
)

func TestArgmaxTakesLowestIndexOnTiesAndSkipsNaN(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		v    []float32
		want int
	}{
		{[]float32{1, 3, 3, 2}, 1},
		{[]float32{nan, 0, 5}, 2},
		{[]float32{-1}, 0},
		{[]float32{2, nan, 2}, 0},
	}
	for _, tc := range cases {
		if got := Argmax(tc.v); got != tc.want {
			t.Errorf("Argmax(%v) = %d, want %d", tc.v, got, tc.want)
		}
	}
}

func TestSamplerFollowsTemperatureAndTopP(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	if got := NewSampler(0, 1, 1).Sample(logits); got != 0 {
		t.Fatalf("greedy picked %d", got)
	}
	// top-p 0.5 keeps only the most probable token (p0 = 0.64 at T=1)
	s := NewSampler(1, 0.5, 9)
	for range 200 {
		if got := s.Sample(logits); got != 0 {
			t.Fatalf("top-p 0.5 sampled %d", got)
		}
	}
	// at T=1 without a cut, frequencies follow softmax(logits)
	s = NewSampler(1, 1, 42)
	counts := make([]int, 4)
	const n = 20000
	for range n {
		counts[s.Sample(logits)]++
	}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	for i, l := range logits {
		p := math.Exp(float64(l)) / z
		got := float64(counts[i]) / n
		if math.Abs(got-p) > 4*math.Sqrt(p*(1-p)/n)+1e-3 {
			t.Errorf("token %d: frequency %.4f, want %.4f", i, got, p)
		}
	}
	// same seed, same draws
	a, b := NewSampler(0.8, 0.9, 5), NewSampler(0.8, 0.9, 5)
	for range 50 {
		if a.Sample(logits) != b.Sample(logits) {
			t.Fatal("same seed gave different samples")
		}
	}
}

// TestSamplerTopKComesBeforeTopP: top-k 2 draws only the two most likely
// tokens, in proportion to their renormalised probabilities, and the
// nucleus cut is then taken over those two (Hugging Face's warper order).
func TestSamplerTopKComesBeforeTopP(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	s := NewSampler(1, 1, 3).WithTopK(2)
	counts := make([]int, 4)
	const n = 20000
	for range n {
		counts[s.Sample(logits)]++
	}
	p0 := math.E / (math.E + 1) // softmax over the top two at T=1
	if counts[2]+counts[3] != 0 {
		t.Fatalf("top-k 2 sampled tokens outside the top two: %v", counts)
	}
	if got := float64(counts[0]) / n; math.Abs(got-p0) > 4*math.Sqrt(p0*(1-p0)/n) {
		t.Fatalf("token 0: frequency %.4f, want %.4f", got, p0)
	}
	// over the top two, p0 = 0.73 >= 0.7: the nucleus keeps token 0 alone
	// (over all four tokens p0 = 0.64 would have kept token 1 too)
	s = NewSampler(1, 0.7, 4).WithTopK(2)
	for range 500 {
		if got := s.Sample(logits); got != 0 {
			t.Fatalf("top-k 2 then top-p 0.7 sampled %d", got)
		}
	}
}

func TestRouteRenormalisesAndSortsByExpert(t *testing.T) {
	logits := []float32{0.1, 2, -1, 1.5, 0}
	probs := make([]float32, len(logits))
	routes := make([]Route, 2)
	route(routes, logits, probs, true)
	if routes[0].Expert != 1 || routes[1].Expert != 3 {
		t.Fatalf("routes %+v, want experts 1 and 3 in id order", routes)
	}
	e1, e3 := math.Exp(2), math.Exp(1.5)
	if w := float64(routes[0].Weight); math.Abs(w-e1/(e1+e3)) > 1e-6 {
		t.Fatalf("weight %v, want %v", w, e1/(e1+e3))
	}
	if s := routes[0].Weight + routes[1].Weight; math.Abs(float64(s)-1) > 1e-6 {
		t.Fatalf("weights sum to %v", s)
	}
	if err := CheckRoutes([]Route{{Expert: 5}}, 5); err == nil {
		t.Fatal("expert 5 of 5 accepted")
	}
}
