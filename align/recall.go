package align

import (
	"fmt"
	"slices"
)

// Recall scores expert predictions as OD-MoE's equations (2) and (3): for
// prompt q, output token n (1-based) and layer l, c(q,n,l) is the number of
// the k activated experts that were predicted; A(q,n) says token n exists
// for prompt q.
//
//	recall(n) = sum_q sum_l c(q,n,l) A(q,n) / (k L sum_q A(q,n))      (2)
//	recall    = sum_n sum_q sum_l c(q,n,l) A(q,n) / (k L sum_n sum_q A(q,n))   (3)
//
// L counts the layers that route (a model's dense layers predict nothing).
// A pass of several sequences activates, in a layer, the union of its
// rows' experts (at least k of them), and the shadow predicts a union: n
// is then the pass and c counts the union's predicted experts, over the
// union's size instead of k. A pass of one row is eq. (2) and (3) exactly.
type Recall struct {
	k       int
	layers  []int   // the layers with experts, ascending
	correct []int64 // per n-1: sum over q and l of c(q,n,l)
	total   []int64 // per n-1: sum over q and l of the experts activated
}

// NewRecall scores a model whose layers (ascending) route with top-k.
func NewRecall(k int, layers []int) *Recall {
	return &Recall{k: k, layers: layers}
}

// Observe records layer l of output token (or pass) n (1-based) of
// prompt q: the experts the shadow predicted and those the router
// activated (distinct; k for one token, their union for a pass).
func (r *Recall) Observe(q, n, l int, predicted, activated []int) error {
	if _, ok := slices.BinarySearch(r.layers, l); n < 1 || !ok {
		return fmt.Errorf("align: token %d layer %d outside tokens 1.. and the routed layers %v", n, l, r.layers)
	}
	if len(activated) < r.k {
		return fmt.Errorf("align: %d activated experts, fewer than top-k %d", len(activated), r.k)
	}
	for len(r.total) < n {
		r.total = append(r.total, 0)
		r.correct = append(r.correct, 0)
	}
	c := 0
	for _, a := range activated {
		if slices.Contains(predicted, a) {
			c++
		}
	}
	r.correct[n-1] += int64(c)
	r.total[n-1] += int64(len(activated))
	return nil
}

// ByToken is recall(n) for n = 1..N (eq. 2); a token no prompt reached is 0.
func (r *Recall) ByToken() []float64 {
	out := make([]float64, len(r.total))
	for i := range out {
		if r.total[i] > 0 {
			out[i] = float64(r.correct[i]) / float64(r.total[i])
		}
	}
	return out
}

// Overall is recall over every token observed (eq. 3), 0 if none.
func (r *Recall) Overall() float64 {
	var c, a int64
	for i := range r.total {
		c += r.correct[i]
		a += r.total[i]
	}
	if a == 0 {
		return 0
	}
	return float64(c) / float64(a)
}
