package stage

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/kvcache"
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

// TestTheKVJournalGivesBackWhatTheStagesWrote: two stages' KV rows of a
// sequence, handed back run after run (a prompt chunk, decode steps, a
// rewind of two rows and the steps after it), give back the rows of any
// span of positions as one cache packed whole holds them (both stages'
// layers, in order); rows forgotten, or never handed back, are not given.
func TestTheKVJournalGivesBackWhatTheStagesWrote(t *testing.T) {
	whole := kvcache.New(4, 2, 4, 0)
	fill := func(n int, seed float32) { // positions [whole.Len(), n) with values of seed
		whole.Reserve(n)
		row := make([]float32, whole.Width())
		for p := whole.Len(); p < n; p++ {
			for l := range 4 {
				for i := range row {
					row[i] = seed + float32(l) + float32(p)/8 + float32(i)/64
				}
				whole.Put(l, p, row, row)
			}
		}
		whole.Commit(n)
	}
	c := &Client{stages: []*remote{{layers: model.LayerRange{First: 0, End: 2}}, {layers: model.LayerRange{First: 2, End: 4}}}}
	hand := func(from, to int) { // each stage hands back its layers' rows [from, to)
		t.Helper()
		kv, err := align.PackKV(whole, from, to)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range c.stages {
			part := kv.Layers(st.layers.First, st.layers.End)
			m := wire.StageKV{Seq: 9, FromPos: from, First: part.First}
			m.Keys, m.Values = part.Tensors()
			if err := c.journal(st, []wire.StageKV{m}); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(from, to int) {
		t.Helper()
		got, ok := c.KVRows(9, from, to)
		want, err := align.PackKV(whole, from, to)
		if err != nil || !ok || !reflect.DeepEqual(got, want) {
			t.Fatalf("rows [%d, %d): ok %v, equal %v (%v)", from, to, ok, reflect.DeepEqual(got, want), err)
		}
	}
	fill(5, 1)
	hand(0, 5) // a prompt chunk
	for p := 5; p < 8; p++ {
		fill(p+1, 1)
		hand(p, p+1)
	}
	check(0, 8)
	check(3, 6)
	whole.Truncate(6) // a rewind of two rows: the stages run from 6 again
	fill(8, 2)
	hand(6, 7)
	hand(7, 8)
	check(4, 8)
	c.ForgetKV(9, 5)
	check(5, 8)
	if _, ok := c.KVRows(9, 4, 8); ok {
		t.Fatal("rows forgotten were given back")
	}
	if _, ok := c.KVRows(9, 5, 9); ok {
		t.Fatal("rows never handed back were given")
	}
	if _, ok := c.KVRows(3, 0, 1); ok {
		t.Fatal("another sequence's rows were given")
	}
	c.ForgetKV(9, -1)
	if len(c.kv) != 0 {
		t.Fatal("an ended sequence's rows are kept")
	}
}

// TestAReplacedStagesFiguresAreKept: a stage restarted counts from
// nothing; the client adds what the one it replaced had counted, so the
// figures and the CPU time it reports (the main node's counters) never
// go back. Rows without figures (a shadow stage's) still count their CPU.
func TestAReplacedStagesFiguresAreKept(t *testing.T) {
	st := &remote{layers: model.LayerRange{First: 2, End: 4}}
	c := &Client{stages: []*remote{st}}
	figs := func(loads, results int64) *wire.StageFigures {
		return &wire.StageFigures{First: 2, Decode: []wire.LayerFigures{{Loads: loads}, {}}, Prefill: make([]wire.LayerFigures, 2),
			Workers: []wire.WorkerFigures{{Results: results}}}
	}
	c.keepFigures(st, figs(5, 7), 3*time.Second)
	c.retire(0) // the stage was lost and replaced
	if got := c.Figures(); len(got) != 1 || got[0].Decode[0].Loads != 5 || got[0].Workers[0].Results != 7 {
		t.Fatalf("before the new stage's first rows: %+v", got)
	}
	if got := c.CPU(); got != 3*time.Second {
		t.Fatalf("CPU before the new stage's first rows: %v, want 3s", got)
	}
	c.keepFigures(st, figs(2, 3), 2*time.Second)
	if got := c.Figures(); len(got) != 1 || got[0].Decode[0].Loads != 7 || got[0].Workers[0].Results != 10 || got[0].First != 2 {
		t.Fatalf("after: %+v, want 7 loads and 10 results", got)
	}
	c.keepFigures(st, nil, 4*time.Second)
	if got := c.CPU(); got != 7*time.Second || c.Figures()[0].Decode[0].Loads != 7 {
		t.Fatalf("after rows without figures: CPU %v, want 7s; figures %+v kept", got, c.Figures())
	}
}
