package fetch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// checkpoint is a generated model served as a Checkpoint, and its
// identity.
func checkpoint(t *testing.T, preset string) (inproc.Files, *fetch.Checkpoint, store.Identity) {
	t.Helper()
	f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 7, 2)
	if err != nil {
		t.Fatal(err)
	}
	id, err := store.ModelIdentity(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := fetch.OpenCheckpoint(f.Model, id, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c, id
}

// fixed is a need that does not depend on the config.
func fixed(n fetch.Need) func(model.Config) (fetch.Need, error) {
	return func(model.Config) (fetch.Need, error) { return n, nil }
}

// sameTensors fails unless every tensor of dir's checkpoint is byte for
// byte the source's, and returns their names.
func sameTensors(t *testing.T, dir, src string) []string {
	t.Helper()
	got, err := safetensors.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	want, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	for _, n := range got.Names() {
		gi, _ := got.Info(n)
		wi, ok := want.Info(n)
		if !ok || gi.DType != wi.DType || !slices.Equal(gi.Shape, wi.Shape) {
			t.Fatalf("tensor %q: fetched %s%v, the source's %s%v (%v)", n, gi.DType, gi.Shape, wi.DType, wi.Shape, ok)
		}
		g, _ := got.Raw(n, gi.DType, gi.Shape...)
		w, _ := want.Raw(n, wi.DType, wi.Shape...)
		if !bytes.Equal(g, w) {
			t.Fatalf("tensor %q differs from the source's", n)
		}
	}
	return got.Names()
}

// TestAStageFetchesItsLayersAndNoMore: a stage's layers (no experts, no
// embedding or head) fetched into an empty directory load as the stage
// loads them, every tensor the source's, the model's identity kept;
// nothing of another layer or of an expert is fetched, and a second
// fetch keeps everything.
func TestAStageFetchesItsLayersAndNoMore(t *testing.T) {
	for _, preset := range []string{"qwen3-moe-tiny", "gpt-oss-tiny-mxfp4", "deepseek-v3-tiny-fp8"} {
		t.Run(preset, func(t *testing.T) {
			f, c, id := checkpoint(t, preset)
			cfg, err := model.LoadConfig(f.Model)
			if err != nil {
				t.Fatal(err)
			}
			r := model.LayerRange{First: 1, End: cfg.NumLayers}
			dir := filepath.Join(t.TempDir(), "stage")
			var last atomic.Int64
			res, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, fixed(fetch.Need{Layers: r}),
				fetch.Options{Log: zerolog.Nop(), Progress: func(done, total int64) { storeMax(&last, done) }})
			if err != nil {
				t.Fatal(err)
			}
			if res.Kept != 0 || res.Fetched != res.Share || last.Load() != res.Share || res.Bad != 0 {
				t.Fatalf("first fetch %+v (progress said %d): want the share fetched, nothing kept", res, last.Load())
			}
			m, err := model.Load(dir, model.LoadOptions{SkipExperts: true, Layers: &r, SkipHead: true})
			if err != nil {
				t.Fatalf("the stage's load of what it fetched: %v", err)
			}
			m.Close()
			for _, n := range sameTensors(t, dir, f.Model) {
				if l := fetch.LayerOf(n); l < r.First || strings.Contains(n, ".experts.") {
					t.Errorf("tensor %q (layer %d) fetched for a stage of layers %s without experts", n, l, r)
				}
			}
			if got, err := store.ModelIdentity(dir); err != nil || got != id {
				t.Fatalf("the fetched directory's identity %v (%v), the model's %v", got, err, id)
			}
			again, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, fixed(fetch.Need{Layers: r}), fetch.Options{Log: zerolog.Nop()})
			if err != nil || again.Fetched != 0 || again.Kept != res.Share || again.Share != res.Share {
				t.Fatalf("second fetch %+v, %v: want everything kept", again, err)
			}
		})
	}
}

// TestAShadowFetchesTheWholeModelAndRunsIt: a shadow's need (every
// layer with its experts, the trunk) fetched loads as the whole model,
// and its logits are the source's bit for bit.
func TestAShadowFetchesTheWholeModelAndRunsIt(t *testing.T) {
	f, c, _ := checkpoint(t, "qwen3-moe-tiny")
	dir := filepath.Join(t.TempDir(), "shadow")
	need := func(cfg model.Config) (fetch.Need, error) {
		return fetch.Need{Layers: model.AllLayers(cfg.NumLayers), Experts: true, Embedding: true, Head: true}, nil
	}
	if _, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, need, fetch.Options{Log: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	src, err := safetensors.Open(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if got := sameTensors(t, dir, f.Model); !slices.Equal(got, src.Names()) {
		t.Fatalf("fetched %d tensors, the checkpoint has %d", len(got), len(src.Names()))
	}
	logits := func(dir string) []float32 {
		m, err := model.Load(dir, model.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		var all []float32
		sess := model.NewSession(m, model.NewResidentExperts(m), 16)
		_, _, err = model.Generate(context.Background(), sess, []int{1, 2, 3}, model.GenerateOptions{MaxTokens: 4,
			OnToken: func(_, _ int, l []float32) error { all = append(all, l...); return nil }})
		if err != nil {
			t.Fatal(err)
		}
		return all
	}
	if !slices.Equal(logits(dir), logits(f.Model)) {
		t.Fatal("the fetched model's logits differ from the source's")
	}
}

// flakyModel serves a checkpoint, flipping a byte of every piece of tensor
// bad it serves, and ending ctx (cancel) after stopAfter pieces.
type flakyModel struct {
	fetch.ModelSource
	name      string
	bad       string
	served    atomic.Int64
	stopAfter int64
	cancel    context.CancelFunc
}

func (f *flakyModel) Name() string { return f.name }

func (f *flakyModel) ReadTensor(ctx context.Context, name string, off int64, dst []byte) error {
	if f.stopAfter > 0 && f.served.Add(1) > f.stopAfter {
		f.cancel()
		return ctx.Err()
	}
	if err := f.ModelSource.ReadTensor(ctx, name, off, dst); err != nil {
		return err
	}
	if name == f.bad {
		dst[len(dst)/2] ^= 0x10
	}
	return nil
}

// TestAModelFetchResumesRepairsAndNamesABadSource: tensors cut into
// many pieces; a fetch interrupted partway is resumed by a rerun that
// fetches only what is not yet in (the pieces in flight at most again);
// a piece damaged on disk is fetched again alone; a source that serves
// a flipped piece is named, and the piece comes from the next source.
func TestAModelFetchResumesRepairsAndNamesABadSource(t *testing.T) {
	defer fetch.SetPieceBytes(1 << 10)()
	f, c, _ := checkpoint(t, "qwen3-moe-tiny")
	cfg, err := model.LoadConfig(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	need := fixed(fetch.Need{Layers: model.AllLayers(cfg.NumLayers), Embedding: true, Head: true})
	dir := filepath.Join(t.TempDir(), "node")

	ctx, cancel := context.WithCancel(context.Background())
	cut := &flakyModel{ModelSource: c.Source(), name: "cut", stopAfter: 40, cancel: cancel}
	const parallel = 4
	first, err := fetch.Model(ctx, dir, []fetch.ModelSource{cut}, need, fetch.Options{Parallel: parallel, Log: zerolog.Nop()})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the interrupted fetch: %+v, %v; want it cancelled", first, err)
	}
	rest, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, need, fetch.Options{Parallel: parallel, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if rest.Kept+rest.Fetched != rest.Share || rest.Kept < first.Fetched-parallel<<10 || rest.Fetched > rest.Share-first.Fetched+parallel<<10 {
		t.Fatalf("resumed: %+v after the first fetched %d: want only what the first did not finish fetched", rest, first.Fetched)
	}
	sameTensors(t, dir, f.Model)

	// damage one piece of one shard
	shard := filepath.Join(dir, "layer-000.safetensors")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-100] ^= 1
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	repair, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, need, fetch.Options{Log: zerolog.Nop()})
	if err != nil || repair.Fetched <= 0 || repair.Fetched > 1<<10 {
		t.Fatalf("repair: %+v, %v: want the one damaged piece fetched", repair, err)
	}
	sameTensors(t, dir, f.Model)

	// a bad source first, a good one after
	bad := &flakyModel{ModelSource: c.Source(), name: "liar", bad: "model.layers.0.self_attn.q_proj.weight"}
	fresh := filepath.Join(t.TempDir(), "fresh")
	res, err := fetch.Model(context.Background(), fresh, []fetch.ModelSource{bad, c.Source()}, need, fetch.Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Bad == 0 || !slices.Equal(res.BadSources, []string{"liar"}) {
		t.Fatalf("%+v: want the liar named for its flipped pieces", res)
	}
	sameTensors(t, fresh, f.Model)
}

// TestAModelComesOverTheWire: a stage node fetches its layers from the
// main node's Checkpoint over a real TCP connection with mutual TLS (a wire.Stream);
// the main node serving no store says so when asked for one.
func TestAModelComesOverTheWire(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, c, id := checkpoint(t, "tiny")
	if err := inproc.EnsureNodes(f.Certs, "stage1"); err != nil {
		t.Fatal(err)
	}
	certs := func(name string) *wire.Config {
		cs, err := wire.LoadCerts(f.Certs, name)
		if err != nil {
			t.Fatal(err)
		}
		return &wire.Config{Certs: cs, PeerRoles: []wire.Role{wire.RoleMain}, Log: zerolog.Nop()}
	}
	ln, err := wire.ListenStream(ctx, "127.0.0.1:0", certs("main"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			go func() { fetch.Serve(ctx, p, fetch.Served{Model: c}, nil); p.Close() }()
		}
	}()
	src := fetch.Dial(ln.Addr().String(), certs("stage1"))
	defer src.Close()
	dir := filepath.Join(t.TempDir(), "stage1")
	r := model.LayerRange{First: 1, End: 2}
	res, err := fetch.Model(ctx, dir, []fetch.ModelSource{src}, fixed(fetch.Need{Layers: r}), fetch.Options{Log: zerolog.Nop()})
	if err != nil || res.Fetched != res.Share || res.Share == 0 {
		t.Fatalf("over the wire: %+v, %v", res, err)
	}
	sameTensors(t, dir, f.Model)
	if got, err := store.ModelIdentity(dir); err != nil || got != id {
		t.Fatalf("identity %v (%v), want %v", got, err, id)
	}
	if _, err := src.Index(ctx); err == nil || !strings.Contains(err.Error(), "no expert store here") {
		t.Fatalf("the store's index from a node serving the model alone: %v", err)
	}
}

// down is a source that never answers.
type down struct{}

func (down) Name() string { return "down" }
func (down) Manifest(context.Context) ([]byte, error) {
	return nil, errors.New("connection refused")
}
func (down) ReadFile(context.Context, string) ([]byte, error) {
	return nil, errors.New("connection refused")
}
func (down) ReadTensor(context.Context, string, int64, []byte) error {
	return errors.New("connection refused")
}

// TestACompleteDirectoryIsCheckedOfflineWhenNoSourceAnswers: with no
// source, a directory a fetch completed is checked against the manifest
// it kept and used (nothing fetched); a damaged piece, or a need past
// what it holds, is refused by name; an interrupted fetch leaves no
// record that the directory is whole.
func TestACompleteDirectoryIsCheckedOfflineWhenNoSourceAnswers(t *testing.T) {
	defer fetch.SetOfflineWait(100 * time.Millisecond)()
	_, c, id := checkpoint(t, "qwen3-moe-tiny")
	dir := filepath.Join(t.TempDir(), "stage")
	r := model.LayerRange{First: 1, End: 2}
	need := fixed(fetch.Need{Layers: r})
	full, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{c.Source()}, need, fetch.Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	res, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{down{}}, need, fetch.Options{Log: zerolog.Nop()})
	if err != nil || !res.Offline || res.Fetched != 0 || res.Kept != full.Share {
		t.Fatalf("offline: %+v, %v: want the whole share kept, checked", res, err)
	}
	if got, err := store.ModelIdentity(dir); err != nil || got != id {
		t.Fatalf("identity after an offline check %v (%v), want %v", got, err, id)
	}
	if _, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{down{}}, fixed(fetch.Need{Layers: model.LayerRange{First: 0, End: 2}}), fetch.Options{Log: zerolog.Nop()}); err == nil ||
		!strings.Contains(err.Error(), "does not hold the node's part whole (layers 0-1") {
		t.Fatalf("offline with a layer the directory lacks: %v; want it said", err)
	}
	shard := filepath.Join(dir, "layer-001.safetensors")
	b, err := os.ReadFile(shard)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(shard, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fetch.Model(context.Background(), dir, []fetch.ModelSource{down{}}, need, fetch.Options{Log: zerolog.Nop()}); !errors.Is(err, fetch.ErrNoSource) {
		t.Fatalf("offline with a damaged piece: %v; want ErrNoSource", err)
	}

	// another model's manifest: the record goes before anything changes,
	// and an interrupted fetch leaves none
	_, other, _ := checkpoint(t, "tiny")
	ctx, cancel := context.WithCancel(context.Background())
	cut := &flakyModel{ModelSource: other.Source(), name: "cut", stopAfter: 1, cancel: cancel}
	if _, err := fetch.Model(ctx, dir, []fetch.ModelSource{cut}, need, fetch.Options{Parallel: 1, Log: zerolog.Nop()}); err == nil {
		t.Fatal("the interrupted fetch of another model succeeded")
	}
	for _, rec := range []string{fetch.FetchedManifestFile, store.FetchedIdentityFile} {
		if _, err := os.Stat(filepath.Join(dir, rec)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survives an interrupted fetch of another model: %v", rec, err)
		}
	}
}

// liar serves a fixed manifest.
type liar struct {
	down
	manifest string
}

func (l liar) Manifest(context.Context) ([]byte, error) { return []byte(l.manifest), nil }

// TestABadManifestOrRequestIsRefusedByName: a manifest of a negative or
// overflowing shape, of pieces past a request's bound or of a file name
// with a path is refused naming what is wrong; a request for bytes past
// a tensor's end, even one whose end overflows, is answered with why.
func TestABadManifestOrRequestIsRefusedByName(t *testing.T) {
	_, c, id := checkpoint(t, "tiny")
	for _, bad := range []struct{ manifest, want string }{
		{`{"identity":"` + id.String() + `","piece_bytes":1024,"tensors":[{"name":"x","dtype":"F32","shape":[-1,4],"size":16,"layer":-1,"pieces":["00"]}]}`, `tensor "x": shape [-1 4]`},
		{`{"identity":"` + id.String() + `","piece_bytes":1024,"tensors":[{"name":"x","dtype":"F32","shape":[4611686018427387904,4],"size":0,"layer":-1,"pieces":[]}]}`, `tensor "x": shape`},
		{`{"identity":"` + id.String() + `","piece_bytes":1073741824}`, "pieces of 1073741824 bytes"},
		{`{"identity":"` + id.String() + `","piece_bytes":1024,"files":[{"name":"../etc/passwd","size":3,"sha256":"00"}]}`, `file "../etc/passwd"`},
		{`{"identity":"nope","piece_bytes":1024}`, "identity"},
	} {
		_, err := fetch.Model(context.Background(), t.TempDir(), []fetch.ModelSource{liar{manifest: bad.manifest}}, fixed(fetch.Need{}), fetch.Options{Log: zerolog.Nop()})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("manifest %s: %v; want an error naming %q", bad.manifest, err, bad.want)
		}
	}
	for _, off := range []int64{1 << 40, math.MaxInt64 - 10} {
		if _, err := c.Tensor("model.norm.weight", off, 100); err == nil || !strings.Contains(err.Error(), "holds") {
			t.Errorf("100 bytes at %d: %v; want why not", off, err)
		}
	}
}

// TestTheManifestIsCachedBesideTheCheckpoint: the manifest a Checkpoint
// made is kept beside the checkpoint and served again from there by the
// next Checkpoint of it (a cache edited in place shows it is read), until
// a safetensors file changes.
func TestTheManifestIsCachedBesideTheCheckpoint(t *testing.T) {
	f, c, id := checkpoint(t, "tiny")
	want, err := c.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	cachePath := filepath.Join(f.Model, ".odmoe-manifest-cache.json")
	b, err := os.ReadFile(cachePath)
	if err != nil {
		t.Fatalf("no cache beside the checkpoint: %v", err)
	}
	var mc struct {
		Key      string          `json:"key"`
		Manifest json.RawMessage `json:"manifest"`
	}
	if err := json.Unmarshal(b, &mc); err != nil || !bytes.Equal(mc.Manifest, want) {
		t.Fatalf("the cache holds another manifest (%v)", err)
	}
	edited := append([]byte(`{"edited":true,`), want[1:]...)
	mc.Manifest = edited
	b, _ = json.Marshal(mc)
	if err := os.WriteFile(cachePath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	open := func() []byte {
		m, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := fetch.OpenCheckpoint(f.Model, id, m)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		got, err := c.Manifest()
		for err != nil && strings.Contains(err.Error(), fetch.ManifestBuilding) {
			got, err = c.Manifest()
		}
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := open(); !bytes.Equal(got, edited) {
		t.Fatal("a second Checkpoint did not serve the cached manifest")
	}
	files, _ := filepath.Glob(filepath.Join(f.Model, "*.safetensors"))
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(files[0], later, later); err != nil {
		t.Fatal(err)
	}
	if got := open(); !bytes.Equal(got, want) {
		t.Fatal("a Checkpoint of a changed checkpoint served the old cache")
	}
}
