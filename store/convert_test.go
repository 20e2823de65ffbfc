package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
)

var (
	tinyOnce sync.Once
	tinyDirs [2]string
	tinyErr  error
)

// tinyModels generates two tiny checkpoints (seeds 1 and 2) once per run.
func tinyModels(t *testing.T) (seed1, seed2 string) {
	t.Helper()
	tinyOnce.Do(func() {
		root, err := os.MkdirTemp("", "odmoe-store-test-")
		if err != nil {
			tinyErr = err
			return
		}
		for i := range tinyDirs {
			tinyDirs[i] = filepath.Join(root, "tiny", string(rune('1'+i)))
			if tinyErr = synth.Generate(tinyDirs[i], synth.Options{Preset: "tiny", Seed: uint64(i + 1)}); tinyErr != nil {
				return
			}
		}
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return tinyDirs[0], tinyDirs[1]
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tinyDirs[0] != "" {
		os.RemoveAll(filepath.Dir(filepath.Dir(tinyDirs[0])))
	}
	os.Exit(code)
}

// TestConvertTinyModelReadsBackEveryExpert converts a checkpoint and reads
// every expert back bit for bit, under the model's identity.
func TestConvertTinyModelReadsBackEveryExpert(t *testing.T) {
	modelDir, otherDir := tinyModels(t)
	out := filepath.Join(t.TempDir(), "store")
	var last, total int64
	err := Convert(context.Background(), modelDir, out, ConvertOptions{Shards: 3, Progress: func(d, tot int64) { last, total = d, tot }})
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(modelDir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if last != total || total != m.ExpertBytes() {
		t.Errorf("progress ended at %d of %d, experts hold %d bytes", last, total, m.ExpertBytes())
	}
	id, err := ModelIdentity(modelDir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(out, Options{Identity: id, VerifyDecoded: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !slices.Equal(st.Layers(), m.Config.ExpertLayers()) || st.Experts() != m.Config.NumExperts {
		t.Fatalf("store has layers %v x %d experts, model %v x %d", st.Layers(), st.Experts(), m.Config.ExpertLayers(), m.Config.NumExperts)
	}
	for _, l := range st.Layers() {
		for e := range st.Experts() {
			n, _ := st.ExpertBytes(l, e)
			got, err := st.ReadExpert(context.Background(), l, e, make([]byte, n))
			if err != nil {
				t.Fatal(err)
			}
			want := m.Layers[l].MoE.Experts[e]
			for i, pair := range [][2]kernels.Matrix{{got.Gate, want.Gate}, {got.Up, want.Up}, {got.Down, want.Down}} {
				g, w := pair[0], pair[1]
				if g.Rows != w.Rows || g.Cols != w.Cols || g.DType != w.DType || !bytes.Equal(g.Data, w.Data) {
					t.Fatalf("layer %d expert %d matrix %d differs from the checkpoint", l, e, i)
				}
			}
		}
	}
	if err := st.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	r := st.Report()
	if r.Total.OriginalBytes != m.ExpertBytes() || r.Total.Ratio() > 0.7 || r.Total.Overhead() > 0.02 || r.Total.Overhead() < 0 {
		t.Errorf("report: original %d ratio %.4f bound %.4f overhead %.4f", r.Total.OriginalBytes, r.Total.Ratio(), r.Total.BoundRatio(), r.Total.Overhead())
	}

	otherID, err := ModelIdentity(otherDir)
	if err != nil {
		t.Fatal(err)
	}
	if otherID == id {
		t.Fatal("two different checkpoints have the same identity")
	}
	if _, err := Open(out, Options{Identity: otherID}); !errors.Is(err, ErrModelMismatch) {
		t.Errorf("store opened as another model's: %v", err)
	}
}

// TestConvertWritesAtomicallyAndRefusesToOverwrite.
func TestConvertWritesAtomicallyAndRefusesToOverwrite(t *testing.T) {
	modelDir, otherDir := tinyModels(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "store")
	ctx := context.Background()
	noLeftovers := func(when string) {
		t.Helper()
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if e.Name() != "store" {
				t.Errorf("%s: leftover %s", when, e.Name())
			}
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := Convert(cctx, modelDir, out, ConvertOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled convert: %v", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("cancelled convert left %s", out)
	}
	noLeftovers("after a cancelled convert")

	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Convert(ctx, modelDir, out, ConvertOptions{}); err != nil {
		t.Fatalf("into an empty directory: %v", err)
	}
	if err := Convert(ctx, otherDir, out, ConvertOptions{}); !errors.Is(err, ErrExist) {
		t.Fatalf("over an existing store without Force: %v", err)
	}
	id1, _ := ModelIdentity(modelDir)
	if st, err := Open(out, Options{Identity: id1}); err != nil {
		t.Fatalf("refused convert damaged the store: %v", err)
	} else {
		st.Close()
	}
	if err := Convert(ctx, otherDir, out, ConvertOptions{Force: true}); err != nil {
		t.Fatalf("with Force: %v", err)
	}
	id2, _ := ModelIdentity(otherDir)
	if st, err := Open(out, Options{Identity: id2}); err != nil {
		t.Fatalf("after Force: %v", err)
	} else {
		st.Close()
	}
	noLeftovers("after replacing")

	notStore := filepath.Join(parent, "notes")
	os.Mkdir(notStore, 0o755)
	os.WriteFile(filepath.Join(notStore, "a.txt"), []byte("keep me"), 0o644)
	if err := Convert(ctx, modelDir, notStore, ConvertOptions{Force: true}); !errors.Is(err, ErrExist) || !strings.Contains(err.Error(), "holds no store") {
		t.Fatalf("Force over a directory that is not a store: %v", err)
	}
}
