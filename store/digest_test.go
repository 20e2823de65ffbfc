package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/store"
)

// TestAStoreOfOtherExpertWeightsIsAnotherModel: a checkpoint that differs
// from another only in one expert's weights (same config, shapes and
// routers: a fine-tune of the experts) has another identity, so its store
// is refused by a node of the first (ErrModelMismatch), and Compare names
// the expert that differs.
func TestAStoreOfOtherExpertWeightsIsAnotherModel(t *testing.T) {
	ctx := context.Background()
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	o, err := inproc.OtherExperts(ctx, t.TempDir(), f, 2, 5)
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.ModelIdentity(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	other, err := store.ModelIdentity(o.Model)
	if err != nil {
		t.Fatal(err)
	}
	if id == other {
		t.Fatalf("a checkpoint with other weights for layer 2 expert 5 has the same identity %s", id.Short())
	}
	if _, err := store.Open(o.Store, store.Options{Identity: id}); !errors.Is(err, store.ErrModelMismatch) || !strings.Contains(err.Error(), other.Short()) || !strings.Contains(err.Error(), id.Short()) {
		t.Fatalf("opening the other store as %s: %v, want ErrModelMismatch naming both", id.Short(), err)
	}
	if ok, err := store.Current(f.Model, o.Store); err != nil || ok {
		t.Fatalf("Current(model, the other experts' store) = %v, %v", ok, err)
	}
	diff, err := store.Compare(f.Model, o.Store)
	if err != nil || !strings.Contains(diff, "layer 2 expert 5 is the first expert whose weights differ") {
		t.Fatalf("Compare: %q, %v", diff, err)
	}
	if diff, err := store.Compare(f.Model, f.Store); err != nil || diff != "" {
		t.Fatalf("Compare with its own store: %q, %v", diff, err)
	}
}

// TestExpertDigestsAreCachedByTheCheckpointsFiles: the digests are
// computed once and read back from the cache beside the checkpoint while
// its files are unchanged; a rewritten file (another modification time)
// is hashed again.
func TestExpertDigestsAreCachedByTheCheckpointsFiles(t *testing.T) {
	ctx := context.Background()
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 6, 1)
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(f.Model, ".odmoe-expert-digests.json")
	id, err := store.ModelIdentity(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(cache)
	if err != nil {
		t.Fatalf("no digest cache beside the checkpoint: %v", err)
	}
	// a cache that lies about one digest (its first hex digit changed),
	// under the right key, is what the next
	// start reads: proof that it did not hash the experts again
	b, err := os.ReadFile(cache)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(b), `"digests":["`) + len(`"digests":["`)
	if b[i] == '0' {
		b[i] = '1'
	} else {
		b[i] = '0'
	}
	if err := os.WriteFile(cache, b, st.Mode()); err != nil {
		t.Fatal(err)
	}
	cached, err := store.ModelIdentity(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	if cached == id {
		t.Fatal("the identity ignored the cached digests: the checkpoint was hashed again")
	}
	// touch the weights: the cache's key no longer matches, they are hashed again
	w := filepath.Join(f.Model, "model.safetensors")
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(w, later, later); err != nil {
		t.Fatal(err)
	}
	again, err := store.ModelIdentity(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	if again != id {
		t.Fatalf("after the weights' file changed, identity %s, want the hashed %s", again.Short(), id.Short())
	}
}

// BenchmarkModelIdentity: what a node's start pays for the identity of
// the checkpoint in $ODMOE_BENCH_MODEL (default: a generated tiny model):
// cold (every expert byte hashed, the cache written) and warm (the cache
// read). Reports the expert bytes hashed per second when cold.
func BenchmarkModelIdentity(b *testing.B) {
	dir := os.Getenv("ODMOE_BENCH_MODEL")
	if dir == "" {
		f, err := inproc.Generate(context.Background(), b.TempDir(), "tiny", 1, 1)
		if err != nil {
			b.Fatal(err)
		}
		dir = f.Model
	}
	var weights int64
	if st, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
		weights = st.Size()
	}
	b.Run("cold", func(b *testing.B) {
		b.SetBytes(weights) // nearly all of a MoE checkpoint's bytes are experts'
		for b.Loop() {
			os.Remove(filepath.Join(dir, ".odmoe-expert-digests.json"))
			if _, err := store.ModelIdentity(dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("warm", func(b *testing.B) {
		for b.Loop() {
			if _, err := store.ModelIdentity(dir); err != nil {
				b.Fatal(err)
			}
		}
	})
}
