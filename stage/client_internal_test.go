package stage

import (
	"context"
	"slices"
	"testing"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/wire"
)

// TestChunksCutSpansWhereTheyMust: spans of 5, 1 and 7 rows in runs of at
// most 4 rows: every row once, in order, a span's later part beginning
// where its earlier ended.
func TestChunksCutSpansWhereTheyMust(t *testing.T) {
	got := chunks([]model.RowSpan{{Seq: 1, Start: 10, Count: 5}, {Seq: 2, Start: 0, Count: 1}, {Seq: 3, Start: 3, Count: 7}}, 4)
	want := [][]model.RowSpan{
		{{Seq: 1, Start: 10, Count: 4}},
		{{Seq: 1, Start: 14, Count: 1}, {Seq: 2, Start: 0, Count: 1}, {Seq: 3, Start: 3, Count: 2}},
		{{Seq: 3, Start: 5, Count: 4}},
		{{Seq: 3, Start: 9, Count: 1}},
	}
	if !slices.EqualFunc(got, want, func(a, b []model.RowSpan) bool { return slices.Equal(a, b) }) {
		t.Fatalf("chunks %v, want %v", got, want)
	}
}

// TestAwaitLetsGoOfEarlierAnswers: answers to a run whose caller stopped
// waiting (an earlier id) are let go, not taken for the run awaited, and
// a refusal of KV rows (an Error of no run) is kept for ApplyKV rather
// than failing the run; an Error of the run awaited fails it.
func TestAwaitLetsGoOfEarlierAnswers(t *testing.T) {
	c := &Client{}
	st := &remote{in: make(chan wire.Message, 8)}
	rows := wire.Float32Tensor([]float32{1, 2}, 1, 2)
	st.in <- &wire.StageRoutes{ID: 3, Layer: 2, Experts: []int32{1}, Weights: []float32{1}}
	st.in <- &wire.StageRows{ID: 3, Hidden: wire.Float32Tensor([]float32{9, 9}, 1, 2)}
	st.in <- &wire.Error{Code: wire.ReqBadRequest, Msg: "KV rows of sequence 7", Seq: 7}
	st.in <- &wire.StageRoutes{ID: 4, Layer: 2, Experts: []int32{5}, Weights: []float32{1}}
	st.in <- &wire.StageRows{ID: 4, Hidden: rows}
	var routed []int
	out, err := c.await(context.Background(), st, 4, func(layer int, rs []model.Route) { routed = append(routed, rs[0].Expert) })
	if err != nil || !slices.Equal(out, []float32{1, 2}) || !slices.Equal(routed, []int{5}) {
		t.Fatalf("await: rows %v, routes %v, %v", out, routed, err)
	}
	if c.refused == nil {
		t.Fatal("the refusal of sequence 7's KV rows was lost")
	}
	st.in <- &wire.Error{Code: wire.ReqBadRequest, Msg: "rows from 3", ID: 5}
	if _, err := c.await(context.Background(), st, 5, nil); err == nil {
		t.Fatal("the run's own Error did not fail it")
	}
}
