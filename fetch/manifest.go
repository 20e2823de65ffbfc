package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
)

// pieceBytes is the size of a tensor's pieces: each has its digest in
// the manifest and is fetched with one request, so a fetch interrupted
// or served wrong costs at most one piece again. (A variable: tests cut
// small models into many pieces.)
var pieceBytes int64 = 16 << 20

// Manifest is what a node holding a model's checkpoint offers a node
// fetching it (Model): the checkpoint's small files (config.json, the
// tokenizer's) and its tensors, each with the SHA-256 of its whole
// (files) or of each pieceBytes piece (tensors), and the model's
// identity (store.Identity), which the fetching node then names in its
// hellos. The node that serves the manifest is the authority: a node
// fetches it from its first source (the main node), over the cluster's
// mutual TLS, and every byte from any source is checked against it.
type Manifest struct {
	Identity string `json:"identity"`
	// PieceBytes is the size of the tensors' pieces (the last of a
	// tensor's may be shorter).
	PieceBytes int64            `json:"piece_bytes"`
	Files      []ManifestFile   `json:"files"`
	Tensors    []ManifestTensor `json:"tensors"`
}

// ManifestFile is one of the checkpoint's small files.
type ManifestFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	Digest string `json:"sha256"`
}

// ManifestTensor is one of the checkpoint's tensors: Layer is the layer
// it belongs to (-1: none: the token embedding, Embedding, or the final
// norm and output head), Expert whether it is (part of) a routed
// expert's weights, Pieces the SHA-256 of each PieceBytes piece of its
// bytes, in order.
type ManifestTensor struct {
	Name      string   `json:"name"`
	DType     string   `json:"dtype"`
	Shape     []int    `json:"shape"`
	Size      int64    `json:"size"`
	Layer     int      `json:"layer"`
	Expert    bool     `json:"expert,omitempty"`
	Embedding bool     `json:"embedding,omitempty"`
	Pieces    []string `json:"pieces"`
}

// maxManifestFile bounds the small files a manifest lists: each is sent
// in one answer.
const maxManifestFile = wire.MaxFetchBytes

// Checkpoint serves a model's checkpoint directory to fetching nodes
// (Serve): its manifest, made in the background from the start (every
// tensor's bytes hashed once, on every core; cached beside the
// checkpoint, or in the user cache directory, keyed by its files' names,
// sizes and times), its small files, and pieces of its tensors.
type Checkpoint struct {
	dir   string
	set   *safetensors.Set
	files map[string]bool
	built chan struct{} // closed once manifest (or err) is set
	stop  atomic.Bool   // Close: the hashing ends
	// hashed and total are the bytes hashed so far and to hash
	hashed, total atomic.Int64
	manifest      []byte
	err           error
}

// ManifestBuilding begins the answer of a node still hashing its
// checkpoint for the manifest: a fetching node keeps asking.
const ManifestBuilding = "the manifest is being made"

// OpenCheckpoint serves the checkpoint in dir, whose identity is id and
// whose expert tensors m names (m may hold any of its layers: only its
// config is read), and starts making its manifest. Close it when done.
func OpenCheckpoint(dir string, id store.Identity, m *model.Model) (*Checkpoint, error) {
	set, err := safetensors.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	c := &Checkpoint{dir: dir, set: set, files: map[string]bool{}, built: make(chan struct{})}
	files, err := smallFiles(dir)
	if err != nil {
		set.Close()
		return nil, err
	}
	for _, f := range files {
		c.files[f] = true
	}
	experts := map[string]bool{}
	for _, l := range m.Config.ExpertLayers() {
		for e := range m.Config.NumExperts {
			names, _ := m.ExpertTensors(l, e)
			for _, n := range names {
				experts[n], experts[n+"_scale_inv"] = true, true // FP8 experts' scales go with them
			}
		}
	}
	embedding := m.EmbeddingTensor()
	go func() {
		defer close(c.built)
		key, err := c.cacheKey(id)
		if err == nil {
			if b, ok := readManifestCache(dir, key); ok {
				c.manifest = b
				return
			}
		}
		man, err := c.build(id, files, experts, embedding)
		if err == nil {
			c.manifest, err = json.Marshal(man)
		}
		if c.err = err; err == nil && key != "" {
			writeManifestCache(dir, key, c.manifest)
		}
	}()
	return c, nil
}

// manifestWait is how long a request for the manifest waits for it
// before it is answered with ManifestBuilding.
const manifestWait = 2 * time.Second

// Close ends the hashing, if it still runs, and unmaps the checkpoint.
func (c *Checkpoint) Close() error {
	c.stop.Store(true)
	<-c.built
	return c.set.Close()
}

// Manifest is the manifest's JSON, once made.
func (c *Checkpoint) Manifest() ([]byte, error) {
	select {
	case <-c.built:
		return c.manifest, c.err
	case <-time.After(manifestWait):
		return nil, fmt.Errorf("%s: %s of %s hashed", ManifestBuilding, progress.Bytes(c.hashed.Load()), progress.Bytes(c.total.Load()))
	}
}

// cacheKey names the checkpoint's state and the manifest's form: its
// identity, the piece size, and its files' names, sizes and times.
func (c *Checkpoint) cacheKey(id store.Identity) (string, error) {
	ents, err := os.ReadDir(c.dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "odmoe manifest v1 %s %d\n", id, pieceBytes)
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".safetensors") || c.files[n] {
			fi, err := e.Info()
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "%s %d %d\n", n, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return b.String(), nil
}

// manifestCachePaths are where dir's manifest may be cached: beside the
// checkpoint, then in the user cache directory.
func manifestCachePaths(dir string) []string {
	paths := []string{filepath.Join(dir, ".odmoe-manifest-cache.json")}
	abs, err := filepath.Abs(dir)
	if c, cerr := os.UserCacheDir(); err == nil && cerr == nil {
		sum := sha256.Sum256([]byte(abs))
		paths = append(paths, filepath.Join(c, "odmoe", "manifests", hex.EncodeToString(sum[:8])+".json"))
	}
	return paths
}

type manifestCache struct {
	Key      string          `json:"key"`
	Manifest json.RawMessage `json:"manifest"`
}

func readManifestCache(dir, key string) ([]byte, bool) {
	for _, p := range manifestCachePaths(dir) {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var mc manifestCache
		if json.Unmarshal(b, &mc) == nil && mc.Key == key && json.Valid(mc.Manifest) {
			return mc.Manifest, true
		}
	}
	return nil, false
}

// writeManifestCache keeps the manifest where it can (a checkpoint's
// directory may be read-only); a cache not written is made again.
func writeManifestCache(dir, key string, manifest []byte) {
	b, err := json.Marshal(manifestCache{Key: key, Manifest: manifest})
	if err != nil {
		return
	}
	for _, p := range manifestCachePaths(dir) {
		if os.MkdirAll(filepath.Dir(p), 0o755) == nil && writeFileAtomic(p, b) == nil {
			return
		}
	}
}

// Source is c as a source on this node (a checkpoint directory it can
// read: a mounted share, a copy on another disk).
func (c *Checkpoint) Source() ModelSource { return checkpointSource{c} }

type checkpointSource struct{ c *Checkpoint }

func (s checkpointSource) Name() string { return s.c.dir }
func (s checkpointSource) Manifest(context.Context) ([]byte, error) {
	return s.c.Manifest()
}
func (s checkpointSource) ReadFile(_ context.Context, name string) ([]byte, error) {
	return s.c.File(name)
}
func (s checkpointSource) ReadTensor(_ context.Context, name string, off int64, dst []byte) error {
	b, err := s.c.Tensor(name, off, len(dst))
	copy(dst, b)
	return err
}

// File is the small file name, one the manifest lists.
func (c *Checkpoint) File(name string) ([]byte, error) {
	if !c.files[name] {
		return nil, fmt.Errorf("no file %q in the manifest", name)
	}
	return os.ReadFile(filepath.Join(c.dir, name))
}

// Tensor is size bytes of tensor name at off, a copy.
func (c *Checkpoint) Tensor(name string, off int64, size int) ([]byte, error) {
	info, ok := c.set.Info(name)
	if !ok {
		return nil, fmt.Errorf("no tensor %q in the checkpoint", name)
	}
	b, err := c.set.Raw(name, info.DType, info.Shape...)
	if err != nil {
		return nil, err
	}
	if off < 0 || size < 0 || off > int64(len(b)) || int64(size) > int64(len(b))-off { // (off+size may pass MaxInt64)
		return nil, fmt.Errorf("tensor %q holds %d bytes, not %d at %d", name, len(b), size, off)
	}
	return slices.Clone(b[off : off+int64(size)]), nil
}

// smallFiles are the plain files of a checkpoint directory a node
// fetches beside its tensors: config.json, the tokenizer's and the
// generation config, not the safetensors files, their index, hidden
// files (the digest caches) or anything past maxManifestFile.
func smallFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() || !smallFileName(n) {
			continue
		}
		if fi, err := e.Info(); err != nil || fi.Size() > maxManifestFile {
			continue
		}
		names = append(names, n)
	}
	return names, nil
}

// smallFileName reports whether name can be one of the small files a
// manifest lists: a plain name, not hidden, no checkpoint shard or index
// and none of what Model writes itself.
func smallFileName(n string) bool {
	return n != "" && filepath.Base(n) == n && !strings.HasPrefix(n, ".") && !strings.HasSuffix(n, ".safetensors") &&
		n != safetensors.IndexFile && n != store.FetchedIdentityFile && n != FetchedManifestFile && !strings.HasSuffix(n, partialSuffix) && !strings.Contains(n, ".tmp-")
}

// build hashes the files and every tensor's pieces, on every core,
// counting the bytes in c.hashed, until done or c.stop.
func (c *Checkpoint) build(id store.Identity, files []string, experts map[string]bool, embedding string) (*Manifest, error) {
	dir, set := c.dir, c.set
	man := &Manifest{Identity: id.String(), PieceBytes: pieceBytes}
	for _, n := range files {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		sum := sha256.Sum256(b)
		man.Files = append(man.Files, ManifestFile{Name: n, Size: int64(len(b)), Digest: hex.EncodeToString(sum[:])})
	}
	names := set.Names()
	man.Tensors = make([]ManifestTensor, len(names))
	type job struct{ t, p int }
	var jobs []job
	for i, n := range names {
		info, _ := set.Info(n)
		size := info.End - info.Begin
		pieces := int((size + pieceBytes - 1) / pieceBytes)
		man.Tensors[i] = ManifestTensor{Name: n, DType: info.DType, Shape: info.Shape, Size: size, Layer: LayerOf(n), Expert: experts[n], Embedding: n == embedding,
			Pieces: make([]string, pieces)}
		c.total.Add(size)
		for p := range pieces {
			jobs = append(jobs, job{i, p})
		}
	}
	next := make(chan job)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range next {
				if c.stop.Load() {
					continue
				}
				t := &man.Tensors[j.t]
				info, _ := set.Info(t.Name)
				b, err := set.Raw(t.Name, info.DType, info.Shape...)
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					continue
				}
				lo := int64(j.p) * pieceBytes
				hi := min(lo+pieceBytes, int64(len(b)))
				sum := sha256.Sum256(b[lo:hi])
				t.Pieces[j.p] = hex.EncodeToString(sum[:])
				c.hashed.Add(hi - lo)
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, fmt.Errorf("fetch: hashing %s: %w", dir, err)
	default:
	}
	if c.stop.Load() {
		return nil, fmt.Errorf("fetch: %s: closed while its manifest was made", dir)
	}
	return man, nil
}

// LayerOf is the layer a tensor's name puts it in ("model.layers.12.
// self_attn.q_proj.weight": 12), or -1 for one outside the layers.
func LayerOf(name string) int {
	for _, part := range strings.SplitAfter(name, "layers.")[1:] {
		if j := strings.IndexByte(part, '.'); j > 0 {
			if l, err := strconv.Atoi(part[:j]); err == nil && l >= 0 && strings.Trim(part[:j], "0123456789") == "" {
				return l
			}
		}
	}
	return -1
}
