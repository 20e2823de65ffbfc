package wire

import (
	"slices"
	"testing"
)

// TestActivationRowsAreChecked: per-expert rows must name every expert,
// add up, and stay inside the activation's tokens; ExpertRows splits them.
func TestActivationRowsAreChecked(t *testing.T) {
	good := Activation{Tokens: 3, Experts: []int32{1, 4}, Rows: []int32{0, 2, 1}, RowCounts: []int32{2, 1}}
	if err := good.validate(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(good.ExpertRows(0), []int32{0, 2}) || !slices.Equal(good.ExpertRows(1), []int32{1}) {
		t.Fatalf("rows %v, %v", good.ExpertRows(0), good.ExpertRows(1))
	}
	if (&Activation{Tokens: 1, Experts: []int32{1}}).ExpertRows(0) != nil {
		t.Fatal("an activation without row counts gave an expert rows")
	}
	for name, a := range map[string]Activation{
		"counts for fewer experts":  {Tokens: 3, Experts: []int32{1, 4}, Rows: []int32{0}, RowCounts: []int32{1}},
		"counts that do not add up": {Tokens: 3, Experts: []int32{1}, Rows: []int32{0, 1}, RowCounts: []int32{1}},
		"a row outside the tokens":  {Tokens: 2, Experts: []int32{1}, Rows: []int32{2}, RowCounts: []int32{1}},
		"an expert with no rows":    {Tokens: 2, Experts: []int32{1, 2}, Rows: []int32{0}, RowCounts: []int32{1, 0}},
	} {
		if err := a.validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
