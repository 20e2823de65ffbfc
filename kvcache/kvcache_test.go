package kvcache

import (
	"slices"
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
