package anonmem

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// Allocations come zero, do not overlap (each holds what was written
// to it after all were made), start 64-byte aligned, the big ones at a
// huge page; Close ends the arena.
func TestAllocationsHoldTheirBytesApart(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var a Arena
	var srcs, dsts [][]byte
	zero := make([]byte, 1<<20)
	for _, n := range []int{1, 63, 64, 4096, 100000, 3 << 20, 17, 0, 2 << 20, 31 << 20, chunk/2 + 1} {
		src := make([]byte, n)
		k := byte(rng.Uint32())
		for i := range src {
			src[i] = byte(i*7) ^ k
		}
		dst, err := a.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i += len(zero) {
			if end := min(n, i+len(zero)); !bytes.Equal(dst[i:end], zero[:end-i]) {
				t.Fatalf("%d bytes allocated are not zero", n)
			}
		}
		copy(dst, src)
		if len(dst) != n || cap(dst) != n {
			t.Fatalf("a copy of %d bytes has len %d, cap %d", n, len(dst), cap(dst))
		}
		if n > 0 && addr(dst)%64 != 0 {
			t.Fatalf("a copy of %d bytes starts at %#x, not 64-byte aligned", n, addr(dst))
		}
		if n > chunk/2 && addr(dst)%align != 0 {
			t.Fatalf("a copy of %d bytes starts at %#x, not at a huge page", n, addr(dst))
		}
		srcs, dsts = append(srcs, src), append(dsts, dst)
	}
	var total int64
	for i, d := range dsts { // written after every copy: an overlap shows here
		if !bytes.Equal(d, srcs[i]) {
			t.Fatalf("copy %d (%d bytes) does not hold its source's bytes", i, len(d))
		}
		total += int64(len(d))
	}
	if a.Held() != total {
		t.Errorf("Held %d, want %d", a.Held(), total)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Alloc(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: %v, want ErrClosed", err)
	}
}
