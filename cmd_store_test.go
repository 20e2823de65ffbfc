package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/harness/inproc"
)

// TestStoreConvertInspectVerifyAndCorruption drives the store commands as
// a user would: convert a generated model, inspect and verify the store,
// then corrupt one byte and see -verify name the damaged tensor.
func TestStoreConvertInspectVerifyAndCorruption(t *testing.T) {
	dir := t.TempDir()
	modelDir, other, st := filepath.Join(dir, "tiny"), filepath.Join(dir, "tiny2"), filepath.Join(dir, "store")
	for i, d := range []string{modelDir, other} {
		if _, se, code := run(t, "", "gen-tiny", "-out", d, "-seed", []string{"1", "2"}[i]); code != 0 {
			t.Fatalf("gen-tiny exit %d: %s", code, se)
		}
	}
	if _, se, code := run(t, "", "convert", "-model", modelDir, "-out", st); code != 0 || !strings.Contains(se, "store written") {
		t.Fatalf("convert exit %d: %s", code, se)
	}
	if _, se, code := run(t, "", "convert", "-model", modelDir, "-out", st); code != 1 || !strings.Contains(se, "use -force") {
		t.Fatalf("convert over an existing store: exit %d: %s", code, se)
	}
	if _, se, code := run(t, "", "convert", "-model", modelDir, "-out", st, "-force", "-shards", "3"); code != 0 {
		t.Fatalf("convert -force exit %d: %s", code, se)
	}

	so, se, code := run(t, "", "inspect", "-store", st, "-verify", "-model", modelDir)
	if code != 0 {
		t.Fatalf("inspect -verify exit %d: %s", code, se)
	}
	for _, want := range []string{"4 layers x 8 experts, BF16", "3 shards per tensor at most", "matches", "w1", "w2", "w3", "total", "verify: OK"} {
		if !strings.Contains(so, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, so)
		}
	}
	if _, se, code := run(t, "", "inspect", "-store", st, "-model", other); code != 1 || !strings.Contains(se, "another model") {
		t.Errorf("inspect against another model: exit %d: %s", code, se)
	}
	// a store of the same config and routers with one expert's weights
	// changed (a fine-tune of the experts) is another model, and inspect
	// names the expert
	tuned, err := inproc.OtherExperts(context.Background(), filepath.Join(dir, "tuned"), inproc.Files{Model: modelDir}, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, se, code := run(t, "", "inspect", "-store", tuned.Store, "-model", modelDir); code != 1 || !strings.Contains(se, "another model") ||
		!strings.Contains(se, "layer 1 expert 2 is the first expert whose weights differ") {
		t.Errorf("inspect of a store of other expert weights: exit %d: %s", code, se)
	}

	// The last bytes of the chunk file are the sign-mantissa chunk of the
	// last shard of the last tensor: layer 3, expert 7, w3, whose 32K
	// elements are one shard (a shard holds 64K elements at least).
	chunks := filepath.Join(st, "chunks.bin")
	b, err := os.ReadFile(chunks)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-10] ^= 0x40
	if err := os.WriteFile(chunks, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, se, code := run(t, "", "inspect", "-store", st); code != 0 {
		t.Errorf("inspect without -verify reads only the index, exit %d: %s", code, se)
	}
	_, se, code = run(t, "", "inspect", "-store", st, "-verify")
	if code != 1 || !strings.Contains(se, "layer 3 expert 7 w3 shard 0 sign-mantissa chunk") || !strings.Contains(se, "checksum mismatch") {
		t.Fatalf("inspect -verify of a flipped byte: exit %d: %s", code, se)
	}
}
