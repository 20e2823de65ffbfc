package align

import "testing"

// lastKV is the step of the test sequence's latest KV alignment.
var lastKV int64

// runWindow feeds one window of decode steps from step it on, each with
// the given recall over 8 activations (scaled to whole activations) and
// rewinds spread over it, and returns the steps that sent the token and
// the KV rows.
func runWindow(c *Controller, it *int64, recall float64, rewinds int64) (tokens, kvs []int64) {
	for range Window {
		*it++
		tok, kv := c.Step(*it, lastKV)
		if tok {
			tokens = append(tokens, *it)
		}
		if kv {
			kvs = append(kvs, *it)
			lastKV = *it
		}
		c.Observe(int(recall*800+0.5), 800)
	}
	c.Rewound(rewinds)
	return tokens, kvs
}

// TestFixedControllerIsThePolicy: without Adaptive the controller answers
// exactly as the fixed Policy's periods say.
func TestFixedControllerIsThePolicy(t *testing.T) {
	p := Policy{TokenPeriod: 2, KVPeriod: 3}
	c := NewController(p)
	for it := int64(1); it <= 40; it++ {
		c.Observe(1, 8) // whatever recall does, a fixed policy holds
		tok, kv := c.Step(it, 0)
		if tok != p.TokenDue(it) || kv != p.KVDue(it) {
			t.Fatalf("step %d: token %v kv %v, the policy says %v %v", it, tok, kv, p.TokenDue(it), p.KVDue(it))
		}
	}
	if c.Current() != p || c.Chosen() != p {
		t.Fatalf("current %v chosen %v, want %v", c.Current(), c.Chosen(), p)
	}
}

// TestAdaptiveControllerFollowsRecallAndRewinds walks the adaptive
// controller through each of its rules, window by window: it starts
// aligned every step; while recall holds it doubles the KV period up to
// its bound, then the token period (the KV rows then go every K steps,
// counted from the last that went); a rewind brings the token back to
// every step, and it grows again only after a back-off; a recall drop
// undoes the period grown last, or, with none to undo, halves the KV
// period.
func TestAdaptiveControllerFollowsRecallAndRewinds(t *testing.T) {
	lastKV = 0
	c := NewController(Policy{TokenPeriod: 2, KVPeriod: 8, Adaptive: true})
	var it int64
	windows := []struct {
		recall  float64
		rewinds int64
		want    Policy // in force during the window
		why     string
	}{
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 1}, "the start"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 2}, "recall held: KV grows first"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 4}, "KV grows"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 8}, "KV reaches its bound"},
		{0.99, 1, Policy{TokenPeriod: 2, KVPeriod: 8}, "then the token period grows"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 8}, "a rewind: the token every step"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 8}, "backing off"},
		{0.97, 0, Policy{TokenPeriod: 2, KVPeriod: 8}, "the back-off over, the token period grows"},
		{0.97, 0, Policy{TokenPeriod: 1, KVPeriod: 8}, "recall fell 2 points: the token period, grown last, is undone"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 4}, "recall fell again, nothing grown to undo: KV halves"},
		{0.99, 0, Policy{TokenPeriod: 1, KVPeriod: 4}, "both periods back off"},
	}
	for i, w := range windows {
		tokens, kvs := runWindow(c, &it, w.recall, w.rewinds)
		if got := c.Current(); got != w.want {
			t.Fatalf("window %d (%s): %v, want %v", i+1, w.why, got, w.want)
		}
		if len(tokens) != Window/w.want.TokenPeriod || len(kvs) != Window/w.want.KVPeriod {
			t.Fatalf("window %d under %v: %d token and %d KV alignments, want %d and %d", i+1, w.want, len(tokens), len(kvs), Window/w.want.TokenPeriod, Window/w.want.KVPeriod)
		}
		for j := 1; j < len(kvs); j++ {
			if kvs[j]-kvs[j-1] != int64(w.want.KVPeriod) {
				t.Fatalf("window %d: KV alignments at %v, want every %d steps", i+1, kvs, w.want.KVPeriod)
			}
		}
	}
	if got := c.Chosen(); got != (Policy{TokenPeriod: 1, KVPeriod: 8}) {
		t.Fatalf("chosen %v, want T1_KV8 (the most steps ran under it)", got)
	}
}

// TestAdaptiveRecallDropUndoesTheTokenPeriodFirst: with nothing grown
// to undo, a recall drop takes the token period down before the KV one
// (a shadow that runs on its own tokens drifts more than on old KV rows).
func TestAdaptiveRecallDropUndoesTheTokenPeriodFirst(t *testing.T) {
	lastKV = 0
	c := NewController(Policy{TokenPeriod: 4, KVPeriod: 2, Adaptive: true})
	var it int64
	for i, w := range []struct {
		recall float64
		want   Policy
	}{
		{0.99, Policy{TokenPeriod: 1, KVPeriod: 1}},
		{0.99, Policy{TokenPeriod: 1, KVPeriod: 2}},
		{0.99, Policy{TokenPeriod: 2, KVPeriod: 2}},
		{0.97, Policy{TokenPeriod: 4, KVPeriod: 2}}, // a drop: the token period grown last is undone
		{0.97, Policy{TokenPeriod: 2, KVPeriod: 2}}, // another: nothing grown, the token period goes first
		{0.99, Policy{TokenPeriod: 1, KVPeriod: 2}},
	} {
		runWindow(c, &it, w.recall, 0)
		if got := c.Current(); got != w.want {
			t.Fatalf("window %d: %v, want %v", i+1, got, w.want)
		}
	}
}

// TestAdaptiveBoundsMustBePositive: an adaptive policy's periods are its
// bounds, so 0 (never) is refused.
func TestAdaptiveBoundsMustBePositive(t *testing.T) {
	if err := (Policy{TokenPeriod: 1, KVPeriod: 0, Adaptive: true}).Validate(); err == nil {
		t.Fatal("adaptive policy with a KV bound of 0 accepted")
	}
	if err := (Policy{TokenPeriod: 1, KVPeriod: 16, Adaptive: true}).Validate(); err != nil {
		t.Fatal(err)
	}
}
