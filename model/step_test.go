package model

import (
	"context"
	"strings"
	"testing"
)

// stepRecorder is an ExpertRunner that notes the step of every layer it
// runs and runs it on resident experts.
type stepRecorder struct {
	*ResidentExperts
	steps []Step
}

func (r *stepRecorder) RunExperts(ctx context.Context, step Step, layer int, x []float32, n int, routes []Route, out []float32) error {
	r.steps = append(r.steps, step)
	return r.ResidentExperts.RunExperts(ctx, step, layer, x, n, routes, out)
}

// TestSessionCountsItsStepsAndHandsThemDown: a Session numbers its forward
// passes 1 (the prompt), 2, 3, ... under its own sequence id, and every
// layer's routing hook and expert runner see that step; a pass refused
// for bad input does not count.
func TestSessionCountsItsStepsAndHandsThemDown(t *testing.T) {
	m := loadTiny(t)
	runA := &stepRecorder{ResidentExperts: NewResidentExperts(m)}
	a := NewSession(m, runA, 0)
	b := NewSession(m, NewResidentExperts(m), 0)
	if a.Seq() == b.Seq() || a.Seq() == 0 {
		t.Fatalf("sessions share sequence id %d (or it is 0)", a.Seq())
	}
	var routed []Step
	a.OnRoute = func(step Step, _ int, _ []float32, _ []Route) { routed = append(routed, step) }
	ctx := context.Background()
	if got := a.Next(); got != (Step{Seq: a.Seq(), Pass: 1}) {
		t.Fatalf("first step %+v, want pass 1 of sequence %d", got, a.Seq())
	}
	if _, err := a.Forward(ctx, testTokens[:5]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Forward(ctx, []int{m.Config.VocabSize}); err == nil {
		t.Fatal("a token outside the vocabulary was accepted")
	}
	for range 2 {
		if _, err := a.Forward(ctx, testTokens[:1]); err != nil {
			t.Fatal(err)
		}
	}
	L := m.Config.NumLayers
	if len(runA.steps) != 3*L || len(routed) != 3*L {
		t.Fatalf("%d runner calls and %d routing calls, want %d each", len(runA.steps), len(routed), 3*L)
	}
	for i, st := range runA.steps {
		want := Step{Seq: a.Seq(), Pass: int64(i/L + 1)}
		if st != want || routed[i] != want {
			t.Fatalf("layer call %d: runner saw %+v, hook %+v, want %+v", i, st, routed[i], want)
		}
	}
	if got := a.Next(); got.Pass != 4 {
		t.Fatalf("after three passes the next step is %+v, want pass 4", got)
	}
}

// TestGenerateStopsCleanlyWhenTheContextIsFull: a generation that would
// run past max_position_embeddings stops at the last position with
// FinishReason "length" and ContextFull, not with an error; a prompt that
// does not fit at all is refused before any forward pass.
func TestGenerateStopsCleanlyWhenTheContextIsFull(t *testing.T) {
	m := loadTiny(t)
	m.Config.MaxPositions = 12
	prompt := []int{1, 5, 9, 13, 17, 21, 25, 29}
	s := NewSession(m, NewResidentExperts(m), 0)
	ids, st, err := Generate(context.Background(), s, prompt, GenerateOptions{MaxTokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	// 8 prompt positions + 4 fed tokens fill 12; the 5th token is sampled from the last logits
	if len(ids) != 5 || !st.ContextFull || st.FinishReason != "length" || s.Len() != 12 {
		t.Fatalf("%d tokens, stats %+v, %d positions", len(ids), st, s.Len())
	}
	_, st, err = Generate(context.Background(), s, prompt, GenerateOptions{MaxTokens: 1})
	if err == nil || !strings.Contains(err.Error(), "does not fit the context of 12") {
		t.Fatalf("err = %v", err)
	}
	s = NewSession(m, NewResidentExperts(m), 0)
	if _, st, err = Generate(context.Background(), s, prompt, GenerateOptions{MaxTokens: 2}); err != nil || st.ContextFull || st.FinishReason != "length" {
		t.Fatalf("a short generation: %+v, %v", st, err)
	}
}
