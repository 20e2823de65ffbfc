package fetch

import "testing"

// TestAheadFitsItsBytes: with AheadBytes, as many chunks of the share's
// mean size as fit, never under 4 nor over 16; without, Parallel.
func TestAheadFitsItsBytes(t *testing.T) {
	for _, c := range []struct {
		opt          Options
		bytes        int64
		chunks, want int
	}{
		{Options{Parallel: 2}, 1 << 30, 1000, 2},
		{Options{Parallel: 4, AheadBytes: 16 << 20}, 300 << 20, 1000, 16}, // ~300 KB chunks: 53 fit
		{Options{Parallel: 4, AheadBytes: 16 << 20}, 2 << 30, 512, 4},     // 4 MiB chunks: 4 fit
		{Options{Parallel: 4, AheadBytes: 16 << 20}, 7 << 30, 1000, 4},    // 7 MiB chunks: 2 fit, at least 4
		{Options{Parallel: 4, AheadBytes: 16 << 20}, 10 << 20, 10, 16},    // 1 MiB chunks: 16 fit
		{Options{Parallel: 4, AheadBytes: 16 << 20}, 20 << 20, 10, 8},     // 2 MiB chunks: 8 fit
		{Options{Parallel: 3, AheadBytes: 16 << 20}, 0, 0, 3},             // an empty share
	} {
		if got := ahead(c.opt, c.bytes, c.chunks); got != c.want {
			t.Errorf("%+v, %d bytes in %d chunks: %d at once, want %d", c.opt, c.bytes, c.chunks, got, c.want)
		}
	}
}
