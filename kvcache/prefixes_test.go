package kvcache

import "testing"

// filled is a cache of n rows whose every value is its position plus
// base, so a test can tell whose rows a copy holds.
func filled(n int, base float32) *Cache {
	c := New(1, 1, 2, n)
	for p := range n {
		v := base + float32(p)
		_ = c.Put(0, p, []float32{v, v}, []float32{v, v})
	}
	_ = c.Commit(n)
	return c
}

// TestPrefixesReuseTheLongestSharedStart: a sequence reuses the rows of
// the entry that shares the most leading tokens with it; a longer
// sequence replaces the entry it extends; an entry
// that already holds new tokens is kept as it is; the least recently
// used entry goes first when the budget is full.
func TestPrefixesReuseTheLongestSharedStart(t *testing.T) {
	row := filled(1, 0).Bytes() / 16 // Bytes per reserved row
	p := NewPrefixes(3 * 16 * row)   // three 16-row caches
	if c, n := p.Take([]int{1, 2, 3}, 8); c != nil || n != 0 {
		t.Fatalf("empty cache: took %d rows", n)
	}
	p.Put([]int{1, 2, 3, 4}, filled(4, 100))
	p.Put([]int{1, 2, 9}, filled(3, 200))
	for _, c := range []struct {
		prompt []int
		want   int
		from   float32 // the entry whose rows come back
	}{
		{[]int{1, 2, 3, 4, 5, 6}, 4, 100},
		{[]int{1, 2, 3, 4}, 4, 100}, // all of them
		{[]int{1, 2, 3}, 3, 100},
		{[]int{1, 2, 9, 9}, 3, 200},
		{[]int{1, 7}, 1, 100}, // either entry shares one token
		{[]int{5, 1, 2}, 0, 0},
	} {
		got, n := p.Take(c.prompt, 8)
		if n != c.want || (n > 0) != (got != nil) {
			t.Fatalf("prompt %v: reused %d rows (cache %v), want %d", c.prompt, n, got != nil, c.want)
		}
		if n > 0 && (got.Len() != n || got.Keys(0, n)[2*(n-1)] != c.from+float32(n-1)) {
			t.Fatalf("prompt %v: %d rows ending in %v, want %d of entry %v", c.prompt, got.Len(), got.Keys(0, got.Len()), n, c.from)
		}
	}
	// the next turn of the first conversation replaces it
	p.Put([]int{1, 2, 3, 4, 5, 6, 7}, filled(7, 300))
	if len(p.entries) != 2 {
		t.Fatalf("%d entries after a longer turn, want 2 (it replaced the entry it extends)", len(p.entries))
	}
	if _, n := p.Take([]int{1, 2, 3, 4, 5, 6, 7, 8}, 8); n != 7 {
		t.Fatalf("the next turn reused %d rows, want 7", n)
	}
	// tokens an entry holds already add nothing
	p.Put([]int{1, 2, 3}, filled(3, 400))
	if len(p.entries) != 2 {
		t.Fatalf("%d entries after a prefix of one, want 2", len(p.entries))
	}
	// two more entries: the least recently used ({1,2,9}) goes
	p.Put([]int{8, 8}, filled(2, 500))
	p.Put([]int{7, 7}, filled(2, 600))
	if _, n := p.Take([]int{1, 2, 9, 1}, 8); n != 2 {
		t.Fatalf("after the budget filled, {1,2,9,1} reused %d rows, want 2 (from {1,2,3,...}; {1,2,9} went first)", n)
	}
	if p.used > p.budget {
		t.Fatalf("%d bytes kept, budget %d", p.used, p.budget)
	}
	if NewPrefixes(0) != nil {
		t.Fatal("a budget of 0 made a cache")
	}
}
