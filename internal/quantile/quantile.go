// Package quantile reads quantiles off samples by nearest rank: the
// p-quantile of n sorted samples is the ceil(p*n)-th, the first for p 0.
package quantile

import (
	"cmp"
	"math"
	"slices"
)

// Of returns the ps-quantiles (each in 0..1) of samples, which it does
// not change; zeros where there are no samples.
func Of[T cmp.Ordered](samples []T, ps ...float64) []T {
	out := make([]T, len(ps))
	if len(samples) == 0 {
		return out
	}
	sorted := slices.Sorted(slices.Values(samples))
	for i, p := range ps {
		k := int(math.Ceil(p*float64(len(sorted)))) - 1
		out[i] = sorted[min(max(k, 0), len(sorted)-1)]
	}
	return out
}
