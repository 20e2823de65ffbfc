package fetch

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// A range that holds written bytes is never taken for a hole (a piece
// fetched before would be fetched again at best, and at worst a damaged
// one kept), and one taken for a hole reads as zeros.
func TestAHoleIsNeverTakenForWrittenBytes(t *testing.T) {
	const size = 4 << 20
	f, err := os.Create(filepath.Join(t.TempDir(), "chunks"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	written := make([]bool, size)
	for range 40 {
		off, n := rng.IntN(size-9000), 1+rng.IntN(9000)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(1 + rng.IntN(255))
		}
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		for i := off; i < off+n; i++ {
			written[i] = true
		}
	}
	holes := 0
	for range 4000 {
		off, n := rng.IntN(size-1), 1+rng.IntN(64<<10)
		n = min(n, size-off)
		if !hole(f, int64(off), int64(n)) {
			continue
		}
		holes++
		for i := off; i < off+n; i++ {
			if written[i] {
				t.Fatalf("[%d, %d) taken for a hole: byte %d was written", off, off+n, i)
			}
		}
		b := make([]byte, n)
		if _, err := f.ReadAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, make([]byte, n)) {
			t.Fatalf("[%d, %d) taken for a hole reads other bytes than zeros", off, off+n)
		}
	}
	t.Logf("%d of 4000 ranges were holes to this file system", holes)
}

// alreadyThere keeps a piece whose bytes pass and refuses one whose
// bytes do not, or that was never written; a piece of zeros reads as
// what a hole holds.
func TestAlreadyThereChecksWhatTheFileHolds(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "chunks"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	piece := bytes.Repeat([]byte("odmoe"), 1000)
	if _, err := f.WriteAt(piece, 300000); err != nil {
		t.Fatal(err)
	}
	is := func(want []byte) func([]byte) error {
		return func(b []byte) error {
			if !bytes.Equal(b, want) {
				return errors.New("not the piece")
			}
			return nil
		}
	}
	buf := make([]byte, len(piece))
	if !alreadyThere(f, buf, 300000, is(piece)) {
		t.Error("the written piece was not kept")
	}
	if alreadyThere(f, buf, 300001, is(piece)) {
		t.Error("bytes one off the piece were kept")
	}
	if alreadyThere(f, buf, 700000, is(piece)) {
		t.Error("a range never written was kept")
	}
	zeros := make([]byte, len(piece))
	if !alreadyThere(f, buf, 700000, is(zeros)) {
		t.Error("a piece of zeros where the file has a hole (or zeros) was not kept")
	}
}
