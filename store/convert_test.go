package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
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
	readsBackEveryExpert(t, st, m, nil)
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

// TestAGptOssStoreHoldsItsFusedExpertsAsTheyAre: gpt-oss-tiny's experts
// (the transposed, interleaved gate_up, down and both biases) convert into
// a version 3 store of the clamped-SwiGLU form that reads back byte for
// byte with the checkpoint's limit and alpha, verifies, and gives each
// bias one shard; the expert digests cover each expert's part of the
// stacked tensors (another seed's experts are another model); and an
// index whose form or activation is damaged is refused as corrupt.
func TestAGptOssStoreHoldsItsFusedExpertsAsTheyAre(t *testing.T) {
	for _, preset := range []string{"gpt-oss-tiny", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) { checkGptOssStore(t, preset) })
	}
}

func checkGptOssStore(t *testing.T, preset string) {
	dirs := []string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	for i, d := range dirs {
		if err := synth.Generate(d, synth.Options{Preset: preset, Seed: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "store")
	if err := Convert(context.Background(), dirs[0], out, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dirs[0], model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	id, err := ModelIdentity(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(out, Options{Identity: id, VerifyDecoded: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Form() != FormClampedSwiGLU || st.ix.version != 3 {
		t.Fatalf("store form %v version %d, want clamped-swiglu in version 3", st.Form(), st.ix.version)
	}
	if h, in, err := st.ExpertShape(1, 3); err != nil || h != m.Config.HiddenSize || in != m.Config.IntermediateSize {
		t.Fatalf("ExpertShape: %d, %d, %v", h, in, err)
	}
	readsBackEveryExpert(t, st, m, func(l, e int, got model.Expert) {
		if !got.Fused() || got.Check(m.Config.HiddenSize) != nil {
			t.Fatalf("layer %d expert %d: fused %v, %v", l, e, got.Fused(), got.Check(m.Config.HiddenSize))
		}
	})
	if err := st.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []Kind{B13, B2} {
		if tr, _ := st.ix.find(0, 0, k); len(tr.shards) != 1 {
			t.Errorf("%v has %d shards, want 1", k, len(tr.shards))
		}
	}
	if w13, _ := st.ix.find(0, 0, W13); w13.dtype == kernels.MXFP4 {
		// the codes in their shards, the scales in one more of their own
		codes := w13.rows * w13.cols / 2
		want := min(DefaultShards, max(1, codes/minShardElems)) + 1
		if lo, hi := w13.shardRange(len(w13.shards) - 1); len(w13.shards) != want || lo != codes || hi != codes+w13.rows*w13.cols/32 {
			t.Errorf("MXFP4 w13 of %d shards, the last [%d, %d); want %d, the scales [%d, %d)", len(w13.shards), lo, hi, want, codes, codes+w13.rows*w13.cols/32)
		}
	} else if preset == "gpt-oss-tiny-mxfp4" {
		t.Fatalf("%s's store holds %v experts", preset, w13.dtype)
	}
	r := st.Report()
	most := 0.7 // BF16's exponents; MXFP4's codes are near-random, its scales not
	if preset == "gpt-oss-tiny-mxfp4" {
		most = 0.97
	}
	if r.Total.OriginalBytes != m.ExpertBytes() || len(r.Kinds) != 4 || r.Kinds[0].Name != "w13" || r.Total.Ratio() > most {
		t.Errorf("report: original %d of %d, kinds %+v, ratio %.4f", r.Total.OriginalBytes, m.ExpertBytes(), r.Kinds, r.Total.Ratio())
	}
	if otherID, err := ModelIdentity(dirs[1]); err != nil || otherID == id {
		t.Fatalf("another seed's identity: %v, same %v", err, otherID == id)
	}
	d, err := checkpointDigests(dirs[0], m, mustSet(t, dirs[0]))
	if err != nil {
		t.Fatal(err)
	}
	if d[0] == d[1] {
		t.Error("two experts of a layer have the same digest: the stacked tensors are hashed whole")
	}

	raw, err := os.ReadFile(filepath.Join(out, IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		at   int
		b    byte
		says string
	}{{indexHeaderLen, 9, "unknown expert form"}, {indexHeaderLen + 1, 1, "unknown expert form"}, {indexHeaderLen + 7, 0x80, "limit"}} {
		b := append([]byte(nil), raw...)
		b[bad.at] = bad.b
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc(b[:len(b)-4]))
		if _, err := parseIndex(b); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("byte %d set to %#x: %v, want ErrCorrupt saying %s", bad.at, bad.b, err, bad.says)
		}
	}
}

func mustSet(t *testing.T, dir string) *safetensors.Set {
	t.Helper()
	set, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return set
}

// TestAnFP8StoreHoldsItsExpertsAsTheyAre: deepseek-v3-tiny-fp8's experts
// (F8_E4M3 codes and float32 block scales, as DeepSeek publishes them)
// convert into a version 3 store that reads back byte for byte, scales
// included, verifies, and keeps each matrix's scales in a shard of its
// own.
func TestAnFP8StoreHoldsItsExpertsAsTheyAre(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ds")
	if err := synth.Generate(dir, synth.Options{Preset: "deepseek-v3-tiny-fp8", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "store")
	if err := Convert(context.Background(), dir, out, ConvertOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, err := Open(out, Options{VerifyDecoded: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.ix.version != 3 || st.Form() != FormSwiGLU {
		t.Fatalf("version %d form %v, want 3 and SwiGLU", st.ix.version, st.Form())
	}
	readsBackEveryExpert(t, st, m, func(l, e int, got model.Expert) {
		if got.Gate.DType != kernels.F8E4M3 || got.Up.DType != kernels.F8E4M3 || got.Down.DType != kernels.F8E4M3 {
			t.Fatalf("layer %d expert %d is %v, %v, %v", l, e, got.Gate.DType, got.Up.DType, got.Down.DType)
		}
	})
	if err := st.Verify(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	w1, _ := st.ix.find(st.Layers()[0], 0, W1)
	if lo, hi := w1.shardRange(len(w1.shards) - 1); lo != w1.rows*w1.cols || hi != lo+kernels.ScalesBytes(kernels.F8E4M3, w1.rows, w1.cols) {
		t.Errorf("w1's last shard is [%d, %d); want its scales after %d code bytes", lo, hi, w1.rows*w1.cols)
	}
}

// readsBackEveryExpert reads every expert of st and fails unless each of
// its tensors (SwiGLU's or gpt-oss's, codes and scales) is the
// checkpoint's m holds byte for byte, its activation's limit and alpha
// included; each, if set, checks more of what was read.
func readsBackEveryExpert(t *testing.T, st *Store, m *model.Model, each func(l, e int, got model.Expert)) {
	t.Helper()
	for _, l := range st.Layers() {
		for e := range st.Experts() {
			n, _ := st.ExpertBytes(l, e)
			got, err := st.ReadExpert(context.Background(), l, e, make([]byte, n))
			if err != nil {
				t.Fatal(err)
			}
			want := m.Layers[l].MoE.Experts[e]
			if got.Limit != want.Limit || got.Alpha != want.Alpha {
				t.Fatalf("layer %d expert %d: limit %v alpha %v, want %v %v", l, e, got.Limit, got.Alpha, want.Limit, want.Alpha)
			}
			for i, pair := range [][2]kernels.Matrix{{got.Gate, want.Gate}, {got.Up, want.Up}, {got.Down, want.Down},
				{got.GateUp, want.GateUp}, {got.GateUpBias, want.GateUpBias}, {got.DownBias, want.DownBias}} {
				g, w := pair[0], pair[1]
				if g.Rows != w.Rows || g.Cols != w.Cols || g.DType != w.DType || !bytes.Equal(g.Data, w.Data) || !bytes.Equal(g.Scales, w.Scales) {
					t.Fatalf("layer %d expert %d tensor %d (%v %dx%d) differs from the checkpoint's (%v %dx%d)", l, e, i, g.DType, g.Rows, g.Cols, w.DType, w.Rows, w.Cols)
				}
			}
			if each != nil {
				each(l, e, got)
			}
		}
	}
}

// TestShardsHoldAtLeastTheirMinimum: a tensor is cut into K shards only
// where each holds minShardElems; a smaller one gets fewer, at least one;
// a scaled format's codes follow the same rule, its scales one more.
func TestShardsHoldAtLeastTheirMinimum(t *testing.T) {
	for _, c := range []struct {
		rows, cols, k int
		dtype         kernels.DType
		want          int
	}{
		{256, 128, 8, kernels.BF16, 1},     // a tiny expert's tensor: 32K elements
		{512, 512, 8, kernels.BF16, 4},     // 256K: four of 64K
		{3584, 1024, 8, kernels.BF16, 8},   // the small preset's: K
		{3584, 1024, 16, kernels.BF16, 16}, // K of 229K each
		{256, 64, 8, kernels.MXFP4, 2},     // 8K code bytes in one, the scales in another
		{2880, 5760, 8, kernels.MXFP4, 9},  // gpt-oss-120b's w13: K and the scales
	} {
		te := &tensorEntry{kind: W1, dtype: c.dtype, rows: c.rows, cols: c.cols}
		if got := shardCount(te, c.k); got != c.want {
			t.Errorf("%v %dx%d, K %d: %d shards, want %d", c.dtype, c.rows, c.cols, c.k, got, c.want)
		}
	}
}
