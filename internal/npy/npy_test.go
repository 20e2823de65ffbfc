package npy

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriterProducesNumpyLayout(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.npy")
	w, err := Create(p, 3)
	if err != nil {
		t.Fatal(err)
	}
	rows := [][]float32{{1, 2, 3}, {-1, float32(math.Inf(1)), 0.5}}
	for _, r := range rows {
		if err := w.Append(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Append([]float32{1}); err == nil {
		t.Fatal("short row accepted")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if string(b[:8]) != "\x93NUMPY\x01\x00" {
		t.Fatalf("magic %q", b[:8])
	}
	hl := int(binary.LittleEndian.Uint16(b[8:10]))
	if (10+hl)%64 != 0 || b[10+hl-1] != '\n' {
		t.Fatalf("header length %d not 64-aligned or not newline-terminated", hl)
	}
	if h := string(b[10 : 10+hl]); !strings.Contains(h, "'shape': (2, 3)") || !strings.Contains(h, "'<f4'") {
		t.Fatalf("header %q", h)
	}
	data := b[10+hl:]
	if len(data) != 2*3*4 {
		t.Fatalf("%d data bytes", len(data))
	}
	for i, r := range rows {
		for j, v := range r {
			got := math.Float32frombits(binary.LittleEndian.Uint32(data[4*(3*i+j):]))
			if got != v {
				t.Fatalf("[%d,%d] = %v, want %v", i, j, got, v)
			}
		}
	}
}
