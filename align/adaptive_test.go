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
// controller through each of its rules: it starts aligned every step;
// while recall holds it doubles both periods up to the bounds (the KV
// rows then go every K steps, counted from the last that went); a
// rewind brings the token back to every step; a recall drop halves the
// KV period.
func TestAdaptiveControllerFollowsRecallAndRewinds(t *testing.T) {
	lastKV = 0
	c := NewController(Policy{TokenPeriod: 2, KVPeriod: 8, Adaptive: true})
	var it int64
	tokens, kvs := runWindow(c, &it, 0.99, 0)
	if len(tokens) != Window || len(kvs) != Window {
		t.Fatalf("first window: %d token and %d KV alignments, want every step's (%d)", len(tokens), len(kvs), Window)
	}
	want := []Policy{{TokenPeriod: 2, KVPeriod: 2}, {TokenPeriod: 2, KVPeriod: 4}, {TokenPeriod: 2, KVPeriod: 8}, {TokenPeriod: 2, KVPeriod: 8}}
	for i, w := range want { // recall holds: the periods grow to the bounds and stay
		tokens, kvs = runWindow(c, &it, 0.99, 0)
		if got := c.Current(); got != w {
			t.Fatalf("window %d: %v, want %v", i+2, got, w)
		}
		if len(tokens) != Window/w.TokenPeriod || len(kvs) != Window/w.KVPeriod {
			t.Fatalf("window %d under %v: %d token and %d KV alignments, want %d and %d", i+2, w, len(tokens), len(kvs), Window/w.TokenPeriod, Window/w.KVPeriod)
		}
		for j := 1; j < len(kvs); j++ {
			if kvs[j]-kvs[j-1] != int64(w.KVPeriod) {
				t.Fatalf("window %d: KV alignments at %v, want every %d steps", i+2, kvs, w.KVPeriod)
			}
		}
	}
	runWindow(c, &it, 0.99, 1) // a rewind: the token goes every step again
	runWindow(c, &it, 0.99, 0)
	if got := c.Current(); got != (Policy{TokenPeriod: 1, KVPeriod: 8}) {
		t.Fatalf("after a window with a rewind: %v, want T1_KV8", got)
	}
	runWindow(c, &it, 0.97, 0) // recall fell 2 points below T1/KV1's
	runWindow(c, &it, 0.97, 0)
	if got := c.Current(); got != (Policy{TokenPeriod: 1, KVPeriod: 4}) {
		t.Fatalf("after a recall drop: %v, want T1_KV4", got)
	}
	if got := c.Chosen(); got != (Policy{TokenPeriod: 2, KVPeriod: 8}) {
		t.Fatalf("chosen %v, want T2_KV8 (the most steps ran under it)", got)
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
