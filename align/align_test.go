package align

import (
	"math"
	"testing"
)

func TestPolicyPeriods(t *testing.T) {
	cases := []struct {
		p         Policy
		it        int64
		token, kv bool
	}{
		{Policy{TokenPeriod: 1, KVPeriod: 1}, 1, true, true},
		{Policy{TokenPeriod: 1, KVPeriod: 4}, 3, true, false},
		{Policy{TokenPeriod: 1, KVPeriod: 4}, 8, true, true},
		{Policy{TokenPeriod: 0, KVPeriod: 0}, 4, false, false},
		{Policy{TokenPeriod: 2, KVPeriod: 0}, 6, true, false},
		{Policy{TokenPeriod: 2, KVPeriod: 2}, 0, false, false},
	}
	for _, c := range cases {
		if c.p.TokenDue(c.it) != c.token || c.p.KVDue(c.it) != c.kv {
			t.Errorf("%v at %d: token %v kv %v, want %v %v", c.p, c.it, c.p.TokenDue(c.it), c.p.KVDue(c.it), c.token, c.kv)
		}
	}
	if (Policy{TokenPeriod: -1, KVPeriod: 0}).Validate() == nil {
		t.Error("negative period accepted")
	}
	if s := (Policy{TokenPeriod: 1, KVPeriod: 4}).String(); s != "T1_KV4" {
		t.Errorf("String %q", s)
	}
}

// TestRecallIsEquationThree works a hand-made case through eqs. (2), (3):
// k = 2, L = 2 routed layers (1 and 3 of a model whose layers 0 and 2 are
// dense); prompt 0 has tokens 1 and 2, prompt 1 only token 1.
//
//	q0 n1: l1 {1,2} vs {1,2} -> 2; l3 {3,4} vs {3,5} -> 1
//	q1 n1: l1 {0,1} vs {6,7} -> 0; l3 {2,3} vs {3,2} -> 2
//	q0 n2: l1 {1,2} vs {2,6} -> 1; l3 {0,5} vs {0,5} -> 2
//
// recall(1) = (2+1+0+2) / (2*2*2) = 5/8; recall(2) = 3/(2*2*1) = 3/4;
// recall = 8 / (2*2*3) = 2/3.
func TestRecallIsEquationThree(t *testing.T) {
	r := NewRecall(2, []int{1, 3})
	obs := []struct {
		q, n, l         int
		pred, activated []int
	}{
		{0, 1, 1, []int{1, 2}, []int{1, 2}},
		{0, 1, 3, []int{3, 4}, []int{3, 5}},
		{1, 1, 1, []int{0, 1}, []int{6, 7}},
		{1, 1, 3, []int{2, 3}, []int{3, 2}},
		{0, 2, 1, []int{1, 2}, []int{2, 6}},
		{0, 2, 3, []int{0, 5}, []int{0, 5}},
	}
	for _, o := range obs {
		if err := r.Observe(o.q, o.n, o.l, o.pred, o.activated); err != nil {
			t.Fatal(err)
		}
	}
	by := r.ByToken()
	if len(by) != 2 || math.Abs(by[0]-5.0/8) > 1e-15 || math.Abs(by[1]-3.0/4) > 1e-15 {
		t.Fatalf("recall by token %v, want [0.625 0.75]", by)
	}
	if got := r.Overall(); math.Abs(got-2.0/3) > 1e-15 {
		t.Fatalf("recall %v, want 2/3", got)
	}
	if err := r.Observe(0, 0, 1, nil, []int{1, 2}); err == nil {
		t.Error("token 0 accepted (tokens are 1-based)")
	}
	if err := r.Observe(0, 1, 2, nil, []int{1, 2}); err == nil {
		t.Error("dense layer 2 accepted")
	}
	if err := r.Observe(0, 1, 1, nil, []int{1}); err == nil {
		t.Error("one activated expert accepted for top-2")
	}
}

// TestRecallOfAPassIsTheUnionsShare: a pass of rows activates the union of
// their experts; its recall is the share of the union predicted. Pass 1:
// l1 union {1,2,5} with {1,5} predicted -> 2 of 3, l3 union {0,3,4,7}
// with {3,4,6} -> 2 of 4; pass 2 of one row: l1 {2,3} vs {2,3} -> 2 of 2.
// recall(1) = 4/7, recall(2) = 1, recall = 6/9.
func TestRecallOfAPassIsTheUnionsShare(t *testing.T) {
	r := NewRecall(2, []int{1, 3})
	for _, o := range []struct {
		n, l            int
		pred, activated []int
	}{
		{1, 1, []int{1, 5}, []int{1, 2, 5}},
		{1, 3, []int{3, 4, 6}, []int{0, 3, 4, 7}},
		{2, 1, []int{2, 3}, []int{2, 3}},
	} {
		if err := r.Observe(0, o.n, o.l, o.pred, o.activated); err != nil {
			t.Fatal(err)
		}
	}
	if by := r.ByToken(); len(by) != 2 || math.Abs(by[0]-4.0/7) > 1e-15 || by[1] != 1 {
		t.Fatalf("recall by pass %v, want [4/7 1]", by)
	}
	if got := r.Overall(); math.Abs(got-6.0/9) > 1e-15 {
		t.Fatalf("recall %v, want 6/9", got)
	}
}

// TestPassTokenIsTheRowsTokensInAnyOrder: a lone row's token is itself;
// several rows' do not depend on their order, and change with any row's
// token or sequence.
func TestPassTokenIsTheRowsTokensInAnyOrder(t *testing.T) {
	if got := PassToken([]uint64{7}, []int{1234}); got != 1234 {
		t.Fatalf("one row fed 1234: PassToken %d", got)
	}
	base := PassToken([]uint64{1, 2, 3}, []int{10, 20, 30})
	if base < 0 {
		t.Fatalf("PassToken %d is negative (-1 means not said)", base)
	}
	if got := PassToken([]uint64{3, 1, 2}, []int{30, 10, 20}); got != base {
		t.Fatalf("the same rows in another order: %d, want %d", got, base)
	}
	for _, c := range []struct {
		seqs   []uint64
		tokens []int
	}{
		{[]uint64{1, 2, 3}, []int{10, 20, 31}},
		{[]uint64{1, 2, 4}, []int{10, 20, 30}},
		{[]uint64{1, 2, 3}, []int{20, 10, 30}}, // tokens swapped between sequences
		{[]uint64{1, 2}, []int{10, 20}},
	} {
		if got := PassToken(c.seqs, c.tokens); got == base {
			t.Errorf("rows %v fed %v: PassToken %d, the same as rows 1,2,3 fed 10,20,30", c.seqs, c.tokens, got)
		}
	}
}
