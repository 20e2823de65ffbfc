package shadow

import (
	"context"
	"slices"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// layerHints is what the shadow predicted for one layer of a pass it ran
// ahead: each row's experts, and their union as hinted, each expert with
// the worker it went to. When the main node's pass keeps some of the rows
// and not others, the union is revised from it (revise).
type layerHints struct {
	rows []int // k experts a row, in the order they ran
	// member and step are each row's member (its index in the pass) and
	// which of its rows it is (0: its token's; i: its i-th guess's)
	member, step []int
	experts      []int // their union, sorted
	on           []int // on[i]: the worker experts[i] was hinted to (-1: none)
}

// kept appends to dst, for each of lh's rows, whether it is kept: it is
// one of the first keep[m] rows of its member m.
func (lh *layerHints) kept(dst []bool, keep []int) []bool {
	for r, m := range lh.member {
		dst = append(dst, lh.step[r] < keep[m])
	}
	return dst
}

// rowExperts appends the experts of routes (k a row) to dst.
func rowExperts(dst []int, routes []model.Route) []int {
	for _, r := range routes {
		dst = append(dst, r.Expert)
	}
	return dst
}

// union appends to dst the distinct experts of rows (k a row) whose keep
// is set (every row when keep is nil) and of extra, and sorts them.
func union(dst []int, rows []int, keep []bool, extra []int) []int {
	start := len(dst)
	k := 0
	if len(keep) > 0 {
		k = len(rows) / len(keep)
	}
	for i, e := range rows {
		if keep != nil && (k == 0 || !keep[i/k]) {
			continue
		}
		if !slices.Contains(dst[start:], e) {
			dst = append(dst, e)
		}
	}
	for _, e := range extra {
		if !slices.Contains(dst[start:], e) {
			dst = append(dst, e)
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// predict is the routing hook of a forward pass, step (seq, it), that fed
// token (a batch's pass: align.PassToken of its rows' tokens): the moment
// layer l is routed, the union of its rows' experts is hinted to the
// group's workers and told to the main node (hint). A pass run ahead
// records what it hinted in rec (nil otherwise). If ctx has ended
// nothing is queued, and the forward pass stops at its next layer.
func (n *Node) predict(ctx context.Context, seq uint64, it int64, token, l int, routes []model.Route, rec *aheadPass) {
	now := time.Now()
	n.trace.Span(trace.Shadow, it, l, -1, n.mark, now)
	n.mark = now
	n.experts = union(n.experts[:0], nil, nil, rowExperts(n.on[:0], routes))
	on := n.hint(ctx, seq, it, token, l, n.experts, nil)
	if rec != nil {
		lh := &rec.layers[l]
		lh.rows, lh.experts, lh.on = rowExperts(lh.rows[:0], routes), append(lh.experts[:0], n.experts...), append(lh.on[:0], on...)
		lh.member, lh.step = lh.member[:0], lh.step[:0]
		for i := range rec.seqs { // one row each
			lh.member, lh.step = append(lh.member, i), append(lh.step, 0)
		}
	}
}

// predictDrafted is the routing hook of step s of a pass run ahead with
// guesses (rec; step 0 feeds each member's token, step i its i-th
// guess), whose rows are those of members (indices into the pass's
// members): layer l's union grows by the rows' experts, hinted to the
// workers at once (only the experts not hinted before) and told to the
// main node, as partial until the pass's last step.
func (n *Node) predictDrafted(ctx context.Context, seq uint64, it int64, token, l int, routes []model.Route, rec *aheadPass, members []int, s int, partial bool) {
	now := time.Now()
	n.trace.Span(trace.Shadow, it, l, -1, n.mark, now)
	n.mark = now
	lh := &rec.layers[l]
	lh.rows = rowExperts(lh.rows, routes)
	for _, m := range members {
		lh.member, lh.step = append(lh.member, m), append(lh.step, s)
	}
	n.experts = union(n.experts[:0], lh.experts, nil, rowExperts(n.on[:0], routes))
	on := n.hintAs(ctx, seq, it, token, l, n.experts, lh, partial)
	lh.experts, lh.on = append(lh.experts[:0], n.experts...), append(lh.on[:0], on...)
}

// hint hints layer l of step (seq, it), predicted to use experts (distinct,
// sorted), and tells the main node, and returns the worker each expert is
// hinted to (in n.on, valid until the next call). was, if set, is what an
// earlier prediction of the same step hinted: an expert it has stays on
// its worker and is not hinted again, and one it has that experts no
// longer has is withdrawn from its worker. Each worker of the group loads
// its share, where the main node's planner will look for it
// (sched.Layout.PredictionWorkers, PlacePredicted), or each owner its
// experts when they stay resident (-residency on); no worker is hinted
// when the main node has already run the pass (a shadow fallen
// behind): the loads would come too late and take the cores and links
// from loads that are not.
func (n *Node) hint(ctx context.Context, seq uint64, it int64, token, l int, experts []int, was *layerHints) []int {
	return n.hintAs(ctx, seq, it, token, l, experts, was, false)
}

// hintAs is hint, the prediction to the main node marked partial as
// said (Prediction.Partial: more of the pass's rows are still to come).
func (n *Node) hintAs(ctx context.Context, seq uint64, it int64, token, l int, experts []int, was *layerHints, partial bool) []int {
	var wasExperts, wasOn []int
	if was != nil {
		// an expert whose worker has gone down since goes to a live one
		// of the group (and is hinted there)
		wasExperts, wasOn = was.experts, slices.Clone(was.on)
		for i, w := range wasOn {
			if w >= 0 && !n.workers[w].up.Load() {
				wasOn[i] = -1
			}
		}
	}
	n.on = n.on[:0]
	if n.owners != nil {
		for _, e := range experts {
			n.on = append(n.on, n.owners.Owner(l, e))
		}
	} else {
		n.on = n.layout.PredictionWorkers(n.on, l, experts, wasExperts, wasOn, func(w int) bool { return n.workers[w].up.Load() })
	}
	for i, w := range n.on {
		if !n.workers[w].up.Load() {
			n.on[i] = -1 // no hint goes out: the main node places it itself
		}
	}
	var failed error
	if n.started.passed(seq, it) {
		n.unhinted++
	} else {
		byWorker(n.on, experts, wasExperts, wasOn, func(w int, es []int32) {
			if failed == nil {
				failed = n.queue(ctx, outgoing{worker: w, it: it, layer: l, msg: &wire.Prediction{Seq: seq, Pass: it, Layer: l, Experts: es, Token: int32(token)}})
			}
		})
		byWorker(wasOn, wasExperts, experts, n.on, func(w int, es []int32) {
			if failed == nil && n.workers[w].up.Load() {
				failed = n.queue(ctx, outgoing{worker: w, it: it, layer: l, msg: &wire.Withdraw{Seq: seq, From: it, Layer: l, Experts: es}})
			}
		})
	}
	if failed == nil {
		_ = n.queue(ctx, outgoing{worker: -1, it: it, layer: l, msg: &wire.Prediction{Seq: seq, Pass: it, Layer: l, Experts: int32s(experts), Workers: int32s(n.on), Token: int32(token), Partial: partial}})
	}
	return n.on
}

// byWorker calls f once for each worker w >= 0 of on (parallel to experts)
// that has experts not already on it in (than, thanOn), in order of first
// appearance, with those experts (a new slice, which the sender owns).
func byWorker(on, experts, than, thanOn []int, f func(w int, experts []int32)) {
	for i, w := range on {
		if w < 0 || slices.Index(on, w) != i {
			continue
		}
		var es []int32
		for j, e := range experts {
			if on[j] != w {
				continue
			}
			if k, ok := slices.BinarySearch(than, e); ok && thanOn[k] == w {
				continue
			}
			es = append(es, int32(e))
		}
		if len(es) > 0 {
			f(w, es)
		}
	}
}
