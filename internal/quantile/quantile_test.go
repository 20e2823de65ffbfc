package quantile

import (
	"slices"
	"testing"
	"time"
)

// TestOfIsNearestRank: the quantiles of 1..10 by nearest rank (p*n
// rounded up), the input left in its order, zeros for no samples.
func TestOfIsNearestRank(t *testing.T) {
	in := []int{7, 3, 10, 1, 5, 9, 2, 8, 6, 4}
	orig := slices.Clone(in)
	got := Of(in, 0, 0.1, 0.15, 0.5, 0.9, 0.95, 1)
	if want := []int{1, 1, 2, 5, 9, 10, 10}; !slices.Equal(got, want) {
		t.Errorf("quantiles of 1..10: %v, want %v", got, want)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("the samples were reordered: %v", in)
	}
	if got := Of([]time.Duration(nil), 0.5, 0.9); got[0] != 0 || got[1] != 0 || len(got) != 2 {
		t.Errorf("no samples: %v, want two zeros", got)
	}
}
