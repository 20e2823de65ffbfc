package model

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// TestStagesComputeWhatTheWholePassComputes: every family's tiny preset
// split after each layer into two stages, each loaded with only its
// layers (LoadOptions.Layers) and its sessions' caches holding only
// theirs, runs the passes of TestChunkedPrompts' shape (prompt chunks
// beside decode steps, one member joining late) with the first stage's
// returned rows handed to the second: its logits and every layer's KV
// rows equal the whole model's, bit for bit.
func TestStagesComputeWhatTheWholePassComputes(t *testing.T) {
	eachFamilyIn(t, 21, func(t *testing.T, dir string, whole *Model) {
		L := whole.Config.NumLayers
		for split := 1; split < L; split++ {
			ranges := []LayerRange{{0, split}, {split, L}}
			var stages []*Model
			for _, r := range ranges {
				m, err := Load(dir, LoadOptions{Layers: &r})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if r.First > 0 && len(m.Embed.Data) > 0 && !m.Config.TieEmbeddings || r.End < L && len(m.LMHead.Data) > 0 {
					t.Fatalf("layers %s bound the embedding or the head", r)
				}
				stages = append(stages, m)
			}
			checkStages(t, whole, stages, ranges)
		}
	})
}

func checkStages(t *testing.T, whole *Model, stages []*Model, ranges []LayerRange) {
	t.Helper()
	ctx := context.Background()
	prompts := [][]int{{1, 17, 300, 42, 8, 9, 10}, {5, 77, 6}, {9, 250, 100, 64, 3}}
	const chunk = 3
	wb := NewBatch(whole, NewResidentExperts(whole))
	sb := make([]*Batch, len(stages))
	for i, m := range stages {
		sb[i] = NewBatch(m, NewResidentExperts(m))
	}
	ws := make([]*Session, len(prompts))
	ss := make([][]*Session, len(prompts)) // [sequence][stage]
	for i := range prompts {
		ws[i] = NewSession(whole, nil, 8)
		for k, m := range stages {
			s, err := NewStageSession(m, nil, 8, ranges[k])
			if err != nil {
				t.Fatal(err)
			}
			ss[i] = append(ss[i], s)
		}
	}
	fed := make([]int, len(prompts))
	for pass := range 8 {
		var members []int
		var feeds [][]int
		for i, p := range prompts {
			if i == 2 && pass < 2 {
				continue
			}
			var feed []int
			if fed[i] < len(p) {
				feed = p[fed[i]:min(fed[i]+chunk, len(p))]
			} else {
				feed = []int{Argmax(ws[i].Logits())}
			}
			fed[i] += len(feed)
			members, feeds = append(members, i), append(feeds, feed)
		}
		of := func(stage int) []*Session {
			var out []*Session
			for _, i := range members {
				if stage < 0 {
					out = append(out, ws[i])
				} else {
					out = append(out, ss[i][stage])
				}
			}
			return out
		}
		if err := wb.Forward(ctx, of(-1), feeds); err != nil {
			t.Fatal(err)
		}
		var rows []float32
		for k := range stages {
			out, err := sb[k].ForwardLayers(ctx, of(k), feeds, ranges[k], rows)
			if err != nil {
				t.Fatalf("pass %d stage %s: %v", pass, ranges[k], err)
			}
			rows = slices.Clone(out)
		}
		for _, i := range members {
			last := ss[i][len(stages)-1]
			if d := firstDiff(last.Logits(), ws[i].Logits()); d >= 0 {
				t.Fatalf("layers split %v, pass %d, sequence %d: logit %d is %v staged, %v whole", ranges, pass, i, d, last.Logits()[d], ws[i].Logits()[d])
			}
			for k, r := range ranges {
				for l := r.First; l < r.End; l++ {
					c, wc := ss[i][k].Cache(), ws[i].Cache()
					if c.Len() != wc.Len() || c.Base(l) != wc.Base(l) || firstDiff(c.Keys(l, c.Len()), wc.Keys(l, wc.Len())) >= 0 ||
						firstDiff(c.Values(l, c.Len()), wc.Values(l, wc.Len())) >= 0 {
						t.Fatalf("layers split %v, pass %d, sequence %d: layer %d's KV rows differ", ranges, pass, i, l)
					}
				}
			}
		}
	}
	// what a stage's session must refuse: layers it does not hold
	if _, err := sb[0].ForwardLayers(ctx, []*Session{ss[0][0]}, [][]int{{1}}, ranges[1], make([]float32, whole.Config.HiddenSize)); err == nil {
		t.Fatalf("a session of layers %s ran layers %s", ranges[0], ranges[1])
	}
	if _, err := NewStageSession(stages[0], nil, 8, ranges[1]); err == nil {
		t.Fatalf("a model of layers %s made a session of layers %s", ranges[0], ranges[1])
	}
}

// TestAStageQuantizesAsTheWholeModelDoes: a stage's quantized copy (a
// shadow stage's) holds its layers' weights as the whole model's copy
// holds them, byte for byte, and only those.
func TestAStageQuantizesAsTheWholeModelDoes(t *testing.T) {
	eachFamilyIn(t, 22, func(t *testing.T, dir string, whole *Model) {
		qw, err := whole.Quantized(kernels.Q8, nil)
		if err != nil {
			t.Fatal(err)
		}
		L := whole.Config.NumLayers
		for _, r := range []LayerRange{{0, 1}, {1, L}} {
			m, err := Load(dir, LoadOptions{Layers: &r})
			if err != nil {
				t.Fatal(err)
			}
			q, err := m.Quantized(kernels.Q8, nil)
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
			if q.NonExpertBytes() >= qw.NonExpertBytes() {
				t.Errorf("layers %s: %d non-expert bytes, the whole model's %d", r, q.NonExpertBytes(), qw.NonExpertBytes())
			}
			for l := range L {
				a, b := q.Layers[l].Attention.O.Data, qw.Layers[l].Attention.O.Data
				if r.Contains(l) != (len(a) > 0) || r.Contains(l) && !slices.Equal(a, b) {
					t.Errorf("layers %s: layer %d's attention output matrix: %d bytes, the whole model's %d (equal: %v)", r, l, len(a), len(b), slices.Equal(a, b))
				}
			}
			if head := len(q.LMHead.Data) > 0; head != (r.End == L) || head && !slices.Equal(q.LMHead.Data, qw.LMHead.Data) {
				t.Errorf("layers %s: a head of %d bytes", r, len(q.LMHead.Data))
			}
		}
	})
}

// TestFootprintIsWhatANodeHolds: every family's whole int8 footprint is
// within 5% of what its quantized copy holds, stages' footprints add up
// to the whole's (the embedding in the first, the head in the last, the
// KV cache split by layers), and an unquantized one counts the
// checkpoint's bytes as bound.
func TestFootprintIsWhatANodeHolds(t *testing.T) {
	eachFamilyIn(t, 23, func(t *testing.T, dir string, m *Model) {
		L := m.Config.NumLayers
		opt := FootprintOptions{Quantized: true, Quant: kernels.Q8, Experts: true}
		whole, err := m.FootprintOf(AllLayers(L), opt)
		if err != nil {
			t.Fatal(err)
		}
		q, err := m.Quantized(kernels.Q8, nil)
		if err != nil {
			t.Fatal(err)
		}
		if held := q.NonExpertBytes() + q.ExpertBytes(); held < whole.Weights()*95/100 || held > whole.Weights()*105/100 {
			t.Errorf("int8 weights: footprint %d, the quantized copy holds %d", whole.Weights(), held)
		}
		a, err := m.FootprintOf(LayerRange{0, 1}, opt)
		if err != nil {
			t.Fatal(err)
		}
		b, err := m.FootprintOf(LayerRange{1, L}, opt)
		if err != nil {
			t.Fatal(err)
		}
		if a.Layers+b.Layers != whole.Layers || a.Experts+b.Experts != whole.Experts || a.KV+b.KV != whole.KV ||
			a.Embedding != whole.Embedding || a.Head != 0 || b.Head != whole.Head || whole.KV <= 0 {
			t.Errorf("stages %+v and %+v do not add up to %+v", a, b, whole)
		}
		if !m.Config.TieEmbeddings && b.Embedding != 0 {
			t.Errorf("the last stage counts the embedding: %+v", b)
		}
		// a first stage's own load says the same of itself, a stage of
		// dense layers alone (DeepSeek's first) too
		first := LayerRange{0, 1}
		part, err := Load(dir, LoadOptions{Layers: &first})
		if err != nil {
			t.Fatal(err)
		}
		pa, err := part.FootprintOf(first, opt)
		part.Close()
		if err != nil || pa.Layers != a.Layers || pa.Experts != a.Experts || pa.Embedding != a.Embedding {
			t.Errorf("layer 0 loaded alone: footprint %+v (%v), want %+v", pa, err, a)
		}
		bf, err := m.FootprintOf(AllLayers(L), FootprintOptions{Experts: true})
		if err != nil {
			t.Fatal(err)
		}
		if bound := m.NonExpertBytes() + m.ExpertBytes(); bf.Experts != m.ExpertBytes() || bf.Weights() < bound*9/10 {
			t.Errorf("as stored: footprint %+v, the model binds %d (%d of experts)", bf, bound, m.ExpertBytes())
		}
	})
}

// TestSplitCoversTheRangeInOrder: a range cut into k stages covers it,
// each stage beginning where the one before ended, sizes within one.
func TestSplitCoversTheRangeInOrder(t *testing.T) {
	got := LayerRange{2, 10}.Split(3)
	if want := []LayerRange{{2, 4}, {4, 7}, {7, 10}}; !slices.Equal(got, want) {
		t.Fatalf("Split(3) of 2-9: %v, want %v", got, want)
	}
}

// TestParseLayerRangeReadsWhatLayersTakes: "A-B" inclusive, "A-" to the
// model's last layer; a range outside the model, backwards or not a
// range is an error naming it.
func TestParseLayerRangeReadsWhatLayersTakes(t *testing.T) {
	for s, want := range map[string]LayerRange{"0-0": {0, 1}, "1-2": {1, 3}, "2-": {2, 4}, " 3 - ": {3, 4}, "0-": {0, 4}} {
		if got, err := ParseLayerRange(s, 4); err != nil || got != want {
			t.Errorf("ParseLayerRange(%q, 4) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"4-", "2-1", "1-4", "-1", "a-b", "3", "", "-"} {
		if got, err := ParseLayerRange(s, 4); err == nil {
			t.Errorf("ParseLayerRange(%q, 4) = %v, want an error", s, got)
		} else if !strings.Contains(err.Error(), "layers") {
			t.Errorf("ParseLayerRange(%q, 4): %v does not name the layers", s, err)
		}
	}
}

// failingRunner is a LayerRunner whose stages are gone.
type failingRunner struct{ calls int }

func (f *failingRunner) RunLayers(context.Context, Step, LayerRange, []RowSpan, []float32, func(int, []Route)) ([]float32, error) {
	f.calls++
	return nil, errors.New("the stage is gone")
}

// TestAPassWhoseStagesFailCountsUnlessRunAgain: a head-only model (it
// holds no layer) whose LayerRunner fails: the failed pass is counted,
// so the next one runs under the next step (a pass that is not run again
// must not reuse its step: the shadow has run it); RunAgain makes the
// next pass run as the failed one did, the batch's and the session's
// steps alike.
func TestAPassWhoseStagesFailCountsUnlessRunAgain(t *testing.T) {
	dir := tinyModel(t)
	m, err := Load(dir, LoadOptions{Layers: &NoLayers, Head: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r := &failingRunner{}
	if err := m.SetLayerRunner(r); err != nil {
		t.Fatal(err)
	}
	b, s := NewBatch(m, nil), NewSession(m, nil, 8)
	first, sfirst := b.Next(), s.Next()
	if err := b.Forward(context.Background(), []*Session{s}, [][]int{{3, 1, 4}}); err == nil || r.calls != 1 {
		t.Fatalf("a pass whose stages are gone: %v (%d runs)", err, r.calls)
	}
	if b.Next().Pass != first.Pass+1 || s.Next().Pass != sfirst.Pass+1 {
		t.Fatalf("after the failed pass: next %v and %v, want the passes after %v and %v", b.Next(), s.Next(), first, sfirst)
	}
	b.RunAgain([]*Session{s})
	if b.Next() != first || s.Next() != sfirst {
		t.Fatalf("RunAgain: next %v and %v, want %v and %v", b.Next(), s.Next(), first, sfirst)
	}
}
