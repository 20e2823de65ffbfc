package kvcache

import (
	"slices"
	"strings"
	"testing"
)

func TestPutKeysValuesAcrossGrowth(t *testing.T) {
	c := New(2, 2, 3, 1)
	row := func(p, l int, kind float32) []float32 {
		r := make([]float32, c.Width())
		for i := range r {
			r[i] = kind*1000 + float32(l*100+p*10+i)
		}
		return r
	}
	for p := range 40 { // forces several Reserve growths
		c.Reserve(p + 1)
		for l := range 2 {
			if err := c.Put(l, p, row(p, l, 1), row(p, l, 2)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Commit(p + 1); err != nil {
			t.Fatal(err)
		}
	}
	for l := range 2 {
		k, v := c.Keys(l, c.Len()), c.Values(l, c.Len())
		for p := range 40 {
			if !slices.Equal(k[p*6:p*6+6], row(p, l, 1)) || !slices.Equal(v[p*6:p*6+6], row(p, l, 2)) {
				t.Fatalf("layer %d pos %d rows changed", l, p)
			}
		}
	}
	c.Truncate(10)
	if c.Len() != 10 {
		t.Fatalf("Len after Truncate = %d", c.Len())
	}
}

func TestPutRefusesBadRows(t *testing.T) {
	c := New(1, 1, 4, 2)
	cases := []struct {
		name       string
		layer, pos int
		kLen, vLen int
	}{
		{"short key", 0, 0, 3, 4},
		{"long value", 0, 0, 4, 5},
		{"layer out of range", 1, 0, 4, 4},
		{"position past reserve", 0, 16, 4, 4},
		{"negative position", 0, -1, 4, 4},
	}
	for _, tc := range cases {
		if err := c.Put(tc.layer, tc.pos, make([]float32, tc.kLen), make([]float32, tc.vLen)); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := c.Commit(17); err == nil {
		t.Error("Commit past reserve: no error")
	}
}

// TestPrefixCopiesTheFirstRowsApart: a prefix holds the source's first
// rows, in a cache of its own (writing either leaves the other as it
// was), and refuses more rows than the source has.
func TestPrefixCopiesTheFirstRowsApart(t *testing.T) {
	c := New(2, 1, 2, 4)
	for p := range 5 {
		c.Reserve(p + 1)
		for l := range 2 {
			v := float32(l*100 + p)
			if err := c.Put(l, p, []float32{v, v + .5}, []float32{-v, -v - .5}); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Commit(p + 1); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.Prefix(3, 8)
	if err != nil {
		t.Fatal(err)
	}
	const row = 2 * 4 * 2 * 2 // keys and values, float32, 2 layers, width 2
	if p.Len() != 3 || p.Bytes() < 8*row || p.Bytes()%row != 0 {
		t.Fatalf("prefix: %d rows, %d bytes; want 3 rows and room for 8 or more rows of %d bytes", p.Len(), p.Bytes(), row)
	}
	for l := range 2 {
		if !slices.Equal(p.Keys(l, 3), c.Keys(l, 3)) || !slices.Equal(p.Values(l, 3), c.Values(l, 3)) {
			t.Fatalf("layer %d: prefix rows %v, source %v", l, p.Keys(l, 3), c.Keys(l, 3))
		}
	}
	if err := p.Put(0, 1, []float32{9, 9}, []float32{9, 9}); err != nil {
		t.Fatal(err)
	}
	if c.Keys(0, 3)[2] == 9 {
		t.Fatal("writing the prefix wrote the source")
	}
	if _, err := c.Prefix(6, 8); err == nil {
		t.Fatal("a prefix of 6 rows of 5: no error")
	}
}

// TestALatentCacheKeepsOneRowAsKeyAndValue: a latent cache stores one row
// per position (Put ignores the value row), hands it out as keys and as
// values across growth and into a prefix, and holds half the bytes of a
// key-and-value cache of the same width.
func TestALatentCacheKeepsOneRowAsKeyAndValue(t *testing.T) {
	const layers, width = 3, 6
	c := NewLatent(layers, width, 2)
	if !c.Latent() || New(layers, 2, 3, 2).Latent() {
		t.Fatal("Latent() does not tell the kinds apart")
	}
	row := func(l, p int) []float32 {
		r := make([]float32, width)
		for i := range r {
			r[i] = float32(100*l + 10*p + i)
		}
		return r
	}
	for p := range 20 { // past the first reserve
		c.Reserve(p + 1)
		for l := range layers {
			if err := c.Put(l, p, row(l, p), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Commit(p + 1); err != nil {
			t.Fatal(err)
		}
	}
	for l := range layers {
		k, v := c.Keys(l, 20), c.Values(l, 20)
		for p := range 20 {
			if !slices.Equal(k[p*width:(p+1)*width], row(l, p)) || !slices.Equal(v[p*width:(p+1)*width], row(l, p)) {
				t.Fatalf("layer %d position %d: key %v value %v, want %v", l, p, k[p*width:(p+1)*width], v[p*width:(p+1)*width], row(l, p))
			}
		}
	}
	p, err := c.Prefix(7, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Latent() || !slices.Equal(p.Values(2, 7), c.Keys(2, 7)) {
		t.Fatal("the prefix of a latent cache is not the same latent rows")
	}
	kv := New(layers, 1, width, 0)
	kv.Reserve(c.cap)
	if 2*c.Bytes() != kv.Bytes() {
		t.Fatalf("a latent cache holds %d bytes, a key-and-value one %d", c.Bytes(), kv.Bytes())
	}
}

// TestAWindowedLayerHoldsWhatItsWindowReads: a layer with a window of 8
// beside a full one, fed 300 positions in passes of 1 to 37 rows, holds
// every row a query at the next position reads (the same rows the full
// layer holds), keeps about 2*8+WindowSlack rows however long the
// sequence, steps back within WindowSlack (the shadow's Truncate), drops
// a Put below its base, and serves a prefix only while it holds it.
func TestAWindowedLayerHoldsWhatItsWindowReads(t *testing.T) {
	const w = 8
	c := New(2, 1, 2, 0)
	if err := c.SetWindows([]int{w, 0}); err != nil {
		t.Fatal(err)
	}
	row := func(p int, kind float32) []float32 { return []float32{kind, float32(p)} }
	check := func(n int) {
		t.Helper()
		lo := max(n-w+1, 0) // what a query at n reads, below n
		base := c.Base(0)
		if lo < base || !c.Holds(n) {
			t.Fatalf("at %d: the windowed layer starts at %d, a query reads from %d", n, base, lo)
		}
		k, v := c.Keys(0, n), c.Values(0, n)
		full := c.Keys(1, n)
		for p := lo; p < n; p++ {
			if !slices.Equal(k[(p-base)*2:(p-base)*2+2], row(p, 1)) || !slices.Equal(v[(p-base)*2:(p-base)*2+2], row(p, 2)) ||
				!slices.Equal(full[p*2:p*2+2], row(p, 1)) {
				t.Fatalf("at %d: position %d's rows are %v %v", n, p, k[(p-base)*2:(p-base)*2+2], v[(p-base)*2:(p-base)*2+2])
			}
		}
	}
	n := 0
	for pass := 1; n < 300; pass = pass%37 + 1 {
		c.Reserve(n + pass)
		for p := n; p < n+pass; p++ {
			for l := range 2 {
				if err := c.Put(l, p, row(p, 1), row(p, 2)); err != nil {
					t.Fatal(err)
				}
			}
		}
		n += pass
		if err := c.Commit(n); err != nil {
			t.Fatal(err)
		}
		check(n)
		if held := len(c.k[0]) / 2; held > 2*w+WindowSlack+37 {
			t.Fatalf("at %d: the windowed layer holds %d rows", n, held)
		}
	}
	if c.Base(0) == 0 {
		t.Fatal("the windowed layer never dropped a row")
	}
	c.Truncate(n - WindowSlack) // back as far as the slack allows
	check(c.Len())
	if err := c.Put(0, c.Base(0)-1, row(0, 9), row(0, 9)); err != nil { // below the base: dropped
		t.Fatal(err)
	}
	check(c.Len())
	if c.Holds(c.Base(0)) || !c.Holds(c.Len()) {
		t.Errorf("Holds: at the base %v (want false), at the end %v", c.Holds(c.Base(0)), c.Holds(c.Len()))
	}
	p, err := c.Prefix(c.Len(), c.Len()+10)
	if err != nil {
		t.Fatal(err)
	}
	pk, ck := p.Keys(0, p.Len()), c.Keys(0, c.Len())
	if p.Base(0) < c.Base(0) || !slices.Equal(pk, ck[(p.Base(0)-c.Base(0))*2:]) || !slices.Equal(p.Keys(1, p.Len()), c.Keys(1, c.Len())) {
		t.Error("the prefix's rows differ from the cache's")
	}
	if _, err := c.Prefix(c.Base(0), 0); err == nil {
		t.Error("a prefix whose rows a windowed layer dropped was served")
	}
	if full := New(2, 1, 2, 300); c.Bytes() >= full.Bytes() {
		t.Errorf("the windowed cache holds %d bytes, a full one of 300 positions %d", c.Bytes(), full.Bytes())
	}
}

// TestAStagesCacheHoldsItsLayersOnly: a cache set to layers 1 to 2 of 4
// reserves rows for those only, refuses a row of another layer by name,
// and its prefixes hold the same layers.
func TestAStagesCacheHoldsItsLayersOnly(t *testing.T) {
	whole, stage := New(4, 2, 4, 0), New(4, 2, 4, 0)
	if err := stage.SetLayers(1, 3); err != nil {
		t.Fatal(err)
	}
	whole.Reserve(32)
	stage.Reserve(32)
	if 2*stage.Bytes() != whole.Bytes() {
		t.Fatalf("two layers of four hold %d bytes, the whole cache %d", stage.Bytes(), whole.Bytes())
	}
	row := make([]float32, 8)
	for l := range 4 {
		err := stage.Put(l, 0, row, row)
		if held := l == 1 || l == 2; (err == nil) != held {
			t.Fatalf("layer %d: Put gave %v", l, err)
		}
		if err != nil && !strings.Contains(err.Error(), "not among the layers held (1 to 2)") {
			t.Fatalf("layer %d: %v", l, err)
		}
	}
	if err := stage.Commit(1); err != nil {
		t.Fatal(err)
	}
	p, err := stage.Prefix(1, 8)
	if err != nil {
		t.Fatal(err)
	}
	if first, end := p.HeldLayers(); first != 1 || end != 3 || p.Put(0, 0, row, row) == nil {
		t.Fatalf("the prefix holds layers %d to %d", first, end-1)
	}
	if err := stage.SetLayers(0, 4); err == nil {
		t.Fatal("layers set on a cache that holds rows")
	}
}

// TestResetRunsASequenceAgainFromItsFirstRow: a windowed cache that has
// dropped its oldest rows, Reset, holds no position, and the rows written
// again from position 0 read back as a new cache's do (a sequence run
// again after its rows elsewhere were lost).
func TestResetRunsASequenceAgainFromItsFirstRow(t *testing.T) {
	const w = 4
	fill := func(c *Cache, n int, kind float32) {
		c.Reserve(n)
		for p := c.Len(); p < n; p++ {
			for l := range 2 {
				if err := c.Put(l, p, []float32{kind, float32(p)}, []float32{-kind, float32(p)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := c.Commit(n); err != nil {
			t.Fatal(err)
		}
	}
	newCache := func() *Cache {
		c := New(2, 1, 2, 0)
		if err := c.SetWindows([]int{w, 0}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := newCache()
	fill(c, 60, 1)
	if c.Base(0) == 0 {
		t.Fatal("the windowed layer dropped no row: nothing to test")
	}
	c.Reset()
	if c.Len() != 0 || c.Base(0) != 0 || !c.Holds(0) {
		t.Fatalf("after Reset: %d positions, base %d", c.Len(), c.Base(0))
	}
	fresh := newCache()
	for _, n := range []int{1, 30} {
		fill(c, n, 2)
		fill(fresh, n, 2)
		for l := range 2 {
			if c.Base(l) != fresh.Base(l) || !slices.Equal(c.Keys(l, n), fresh.Keys(l, n)) || !slices.Equal(c.Values(l, n), fresh.Values(l, n)) {
				t.Fatalf("at %d, layer %d: the reset cache's rows differ from a new one's", n, l)
			}
		}
	}
}
