package fetch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// ModelSource is a node that holds a model's checkpoint (a Checkpoint
// serves it): its manifest, its small files and its tensors' bytes. It
// must be safe for concurrent use.
type ModelSource interface {
	Name() string
	// Manifest is the checkpoint's manifest (Manifest's JSON).
	Manifest(ctx context.Context) ([]byte, error)
	// ReadFile is the small file name.
	ReadFile(ctx context.Context, name string) ([]byte, error)
	// ReadTensor fills dst with the bytes of tensor name at off.
	ReadTensor(ctx context.Context, name string, off int64, dst []byte) error
}

// Need is the part of a checkpoint a node binds: the non-expert tensors
// of Layers, their experts' too with Experts (a shadow, which quantizes
// them), the token embedding with Embedding (a node that begins at the
// first layer, or whose output head is tied to it) and the final norm
// and output head with Head (a node that samples).
type Need struct {
	Layers    model.LayerRange
	Experts   bool
	Embedding bool
	Head      bool
}

// needs reports whether n binds t.
func (n Need) needs(t ManifestTensor) bool {
	switch {
	case t.Layer >= 0:
		return n.Layers.Contains(t.Layer) && (n.Experts || !t.Expert)
	case t.Embedding:
		return n.Embedding
	}
	return n.Head
}

// String says what n binds, as the directory's record of it does.
func (n Need) String() string {
	return fmt.Sprintf("layers %s experts %v embedding %v head %v", n.Layers, n.Experts, n.Embedding, n.Head)
}

// shardOf is the file of a fetched checkpoint that holds t: one for the
// token embedding, one for the other tensors outside the layers (the
// final norm and output head), one for each layer's non-expert tensors
// and one for its experts', so that what a file holds does not depend
// on which node fetched it (a node given other layers later adds files).
func shardOf(t ManifestTensor) string {
	switch {
	case t.Layer < 0 && t.Embedding:
		return "embedding.safetensors"
	case t.Layer < 0:
		return "head.safetensors"
	case t.Expert:
		return fmt.Sprintf("layer-%03d-experts.safetensors", t.Layer)
	default:
		return fmt.Sprintf("layer-%03d.safetensors", t.Layer)
	}
}

// FetchedManifestFile is where a directory a fetch completed keeps the
// manifest it was checked against (and FetchedIdentityFile the model's
// identity): both are removed before the fetch changes anything, and
// written once it is complete, so a directory that has them is whole. A
// node that finds no source starts on such a directory after checking
// it against this manifest.
const FetchedManifestFile = "odmoe-manifest.json"

// partialSuffix marks a fetched checkpoint file whose pieces are not
// all in yet: it becomes its shard once every piece passes.
const partialSuffix = ".partial"

// ModelResult is what a Model fetch did, in bytes.
type ModelResult struct {
	// Share is the bytes of the node's tensors and files; Kept those
	// already on disk that passed their check; Fetched those fetched, bad
	// ones included.
	Share, Kept, Fetched int64
	// Pieces is how many pieces (tensor pieces and files) the share has,
	// Bad how many a source served wrong, and BadSources who did.
	Pieces, Bad int
	BadSources  []string
	// Offline says no source gave a manifest, and the directory, which
	// a fetch completed before, was checked against the manifest kept
	// there (FetchedManifestFile) instead: nothing was fetched.
	Offline bool
}

// offlineWait is how long a node whose directory a fetch completed
// before asks its sources for the manifest before it checks what the
// directory holds against the manifest kept there. (A variable: tests
// shorten it.)
var offlineWait = 10 * time.Second

// Model fetches into dir the part of a model's checkpoint need says, as
// a checkpoint directory model.Load reads (config.json and the other
// small files, the tensors in safetensors shards with their index) and
// the model's identity (store.FetchedIdentityFile). The manifest comes
// from the first source that gives one; every piece is checked against
// it before it is written, and what dir already holds that passes is
// kept, so a rerun resumes an interrupted fetch and repairs a damaged
// one. need is asked, once config.json is in, what the node binds of
// the model it describes. The sources may start after this node: the
// manifest is asked for again, each second, for up to IndexWait.
// opt.Layers and opt.Experts are not used.
func Model(ctx context.Context, dir string, sources []ModelSource, need func(model.Config) (Need, error), opt Options) (ModelResult, error) {
	var res ModelResult
	if len(sources) == 0 {
		return res, fmt.Errorf("fetch: no source")
	}
	if opt.Parallel <= 0 {
		opt.Parallel = 4
	}
	// a directory a fetch completed before is checked against the
	// manifest it kept when no source answers soon: a node restarted
	// while the main node is down starts on it
	kept, kerr := os.ReadFile(filepath.Join(dir, FetchedManifestFile))
	wait := IndexWait
	if kerr == nil {
		wait = offlineWait
	}
	raw, from, err := fetchManifest(ctx, sources, wait, opt.Log)
	if err != nil {
		if kerr != nil || ctx.Err() != nil {
			return res, err
		}
		opt.Log.Warn().Err(err).Str("dir", dir).Msg("fetch: no source gave the model's manifest; checking what the directory holds against the one it kept")
		raw, from, sources, res.Offline = kept, dir, nil, true
	}
	man := new(Manifest)
	if err := json.Unmarshal(raw, man); err != nil {
		return res, fmt.Errorf("fetch: the manifest %s gave: %w", from, err)
	}
	if err := man.check(); err != nil {
		return res, fmt.Errorf("fetch: the manifest %s gave: %w", from, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	var n Need // what the node binds, once config.json is in
	// before anything changes, the directory stops saying it is whole;
	// checked offline, nothing changes
	dirty := sync.OnceValue(func() error {
		if res.Offline {
			return fmt.Errorf("%w: no source answered, and %s does not hold the node's part whole (%s)", ErrNoSource, dir, n)
		}
		for _, f := range []string{FetchedManifestFile, store.FetchedIdentityFile} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("fetch: %w", err)
			}
		}
		return nil
	})
	if !bytes.Equal(raw, kept) {
		if err := dirty(); err != nil { // another manifest's record
			return res, err
		}
	}
	var mu sync.Mutex // res's lists
	badSource := func(what string) func(src string, err error) {
		return func(src string, err error) {
			opt.Log.Warn().Str("source", src).Str("piece", what).Err(err).Msg("fetch: a source served a bad piece; asking the next")
			mu.Lock()
			defer mu.Unlock()
			res.Bad++
			if !slices.Contains(res.BadSources, src) {
				res.BadSources = append(res.BadSources, src)
			}
		}
	}
	var keptBytes, fetched, done atomic.Int64
	var total int64 // the share's, once the shards are planned: progress is told nothing before
	progress := func(n int64) {
		d := done.Add(n)
		if opt.Progress != nil && total > 0 {
			opt.Progress(d, total)
		}
	}
	end := func(err error) (ModelResult, error) {
		res.Kept, res.Fetched = keptBytes.Load(), fetched.Load()
		return res, err
	}
	for _, f := range man.Files {
		res.Share += f.Size
		path := filepath.Join(dir, f.Name)
		if b, err := os.ReadFile(path); err == nil && checkDigest(b, f.Digest) == nil {
			keptBytes.Add(f.Size)
			progress(f.Size)
			continue
		}
		var b []byte
		err := firstGood(ctx, sources, f.Name, func(src ModelSource) error {
			var err error
			b, err = src.ReadFile(ctx, f.Name)
			fetched.Add(int64(len(b)))
			if err == nil {
				err = checkDigest(b, f.Digest)
			}
			return err
		}, badSource(f.Name))
		if err == nil {
			err = dirty()
		}
		if err == nil {
			err = writeFileAtomic(path, b)
		}
		if err != nil {
			return end(err)
		}
		progress(f.Size)
	}

	// config.json is in: what the node binds of the model it describes
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return end(fmt.Errorf("fetch: %w", err))
	}
	if n, err = need(cfg); err != nil {
		return end(err)
	}
	shards, err := planShards(dir, man, n, dirty)
	defer func() {
		for _, s := range shards {
			s.close()
		}
	}()
	if err != nil {
		return end(fmt.Errorf("fetch: the manifest %s gave: %w", from, err))
	}
	var pieces []piece
	for _, s := range shards {
		pieces = append(pieces, s.pieces...)
		for _, p := range s.pieces {
			res.Share += p.size
		}
	}
	res.Pieces = len(pieces) + len(man.Files)
	total = res.Share
	progress(0)
	pace := pacerOf(opt)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opt.Parallel)
	for i, p := range pieces {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			buf := make([]byte, p.size)
			if alreadyThere(p.file, buf, p.at, func(b []byte) error { return checkDigest(b, p.digest) }) {
				keptBytes.Add(p.size)
				progress(p.size)
				return nil
			}
			if err := pace.wait(gctx, int(p.size)); err != nil {
				return err
			}
			what := fmt.Sprintf("%s at %d", p.tensor, p.off)
			order := sources
			if opt.Spread {
				order = rotated(sources, i)
			}
			err := firstGood(gctx, order, what, func(src ModelSource) error {
				err := src.ReadTensor(gctx, p.tensor, p.off, buf)
				if err == nil {
					fetched.Add(p.size)
					err = checkDigest(buf, p.digest)
				}
				return err
			}, badSource(what))
			if err == nil {
				err = dirty()
			}
			if err != nil {
				return err
			}
			if _, err := p.file.WriteAt(buf, p.at); err != nil {
				return fmt.Errorf("fetch: writing %s: %w", p.file.Name(), err)
			}
			progress(p.size)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return end(err)
	}
	for _, s := range shards {
		if err := s.complete(); err != nil {
			return end(err)
		}
	}
	if err := writeIndex(dir, shards); err != nil {
		return end(err)
	}
	// whole: the record last
	if err := writeFileAtomic(filepath.Join(dir, store.FetchedIdentityFile), []byte(man.Identity+"\n")); err != nil {
		return end(err)
	}
	return end(writeFileAtomic(filepath.Join(dir, FetchedManifestFile), raw))
}

// checkDigest checks b against the manifest's SHA-256 want.
func checkDigest(b []byte, want string) error {
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != want {
		return fmt.Errorf("%w: %d bytes whose SHA-256 differs from the manifest's", errBadPiece, len(b))
	}
	return nil
}

// fetchManifest is the manifest's JSON from the first source that gives
// one, and its name, asked for again each second for up to wait while
// none does (they may start after this node).
func fetchManifest(ctx context.Context, sources []ModelSource, wait time.Duration, log zerolog.Logger) ([]byte, string, error) {
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		var errs []error
		for _, src := range sources {
			at := deadline
			if soon := time.Now().Add(time.Second); at.Before(soon) {
				at = soon
			}
			actx, cancel := context.WithDeadline(ctx, at) // a dial that waits long ends with the wait
			b, err := src.Manifest(actx)
			cancel()
			if err == nil {
				return b, src.Name(), nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", src.Name(), err))
		}
		err := fmt.Errorf("%w: the model's manifest: %w", ErrNoSource, errors.Join(errs...))
		if strings.Contains(err.Error(), ManifestBuilding) {
			deadline = time.Now().Add(max(wait, IndexWait)) // a source is hashing its checkpoint: however long that takes
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, "", err
		}
		if attempt&(attempt-1) == 0 {
			log.Info().Err(err).Int("attempt", attempt).Msg("fetch: no source gave the model's manifest yet; asking again")
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
}

// check refuses a manifest this node cannot follow safely: no identity,
// pieces of no size or past a request's bound, a file name that is not
// a plain one, a tensor of negative or overflowing shape or whose
// pieces do not cover its bytes.
func (man *Manifest) check() error {
	if _, err := store.ParseIdentity(man.Identity); err != nil {
		return err
	}
	if man.PieceBytes <= 0 || man.PieceBytes > wire.MaxFetchBytes {
		return fmt.Errorf("pieces of %d bytes (1 to %d)", man.PieceBytes, wire.MaxFetchBytes)
	}
	for _, f := range man.Files {
		if !smallFileName(f.Name) || f.Size < 0 || f.Size > maxManifestFile {
			return fmt.Errorf("file %q of %d bytes: not a checkpoint's small file", f.Name, f.Size)
		}
	}
	for _, t := range man.Tensors {
		n := int64(1)
		for _, d := range t.Shape {
			if d < 0 || d > 0 && n > math.MaxInt64/8/int64(d) {
				return fmt.Errorf("tensor %q: shape %v", t.Name, t.Shape)
			}
			n *= int64(d)
		}
		if t.Size < 0 || t.Size > 8*n {
			return fmt.Errorf("tensor %q: %d bytes for shape %v", t.Name, t.Size, t.Shape)
		}
		if want := (t.Size + man.PieceBytes - 1) / man.PieceBytes; int64(len(t.Pieces)) != want {
			return fmt.Errorf("tensor %q: %d pieces for %d bytes", t.Name, len(t.Pieces), t.Size)
		}
	}
	return nil
}

// piece is one pieceBytes piece of a tensor: where it is in the tensor
// (off) and in its shard's file (at).
type piece struct {
	tensor  string
	off, at int64
	size    int64
	digest  string
	file    *os.File
}

// shard is one file of the fetched checkpoint being filled: its specs
// in file order, and the file (its final name, or the partial one while
// pieces are missing).
type shard struct {
	name   string
	specs  []safetensors.Spec
	path   string // where the file is now
	final  string
	file   *os.File
	pieces []piece
}

func (s *shard) close() {
	if s.file != nil {
		s.file.Close()
		s.file = nil
	}
}

// complete makes a partial shard whose pieces all passed its final file.
func (s *shard) complete() error {
	if err := s.file.Sync(); err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	s.close()
	if s.path != s.final {
		if err := os.Rename(s.path, s.final); err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		s.path = s.final
	}
	return nil
}

// planShards groups the manifest's tensors need binds into their shards
// and opens each: its file if it has the shard's header (pieces there are
// checked, not trusted), its partial file if that does, else a new
// partial file, sparse, with the header. It checks the manifest as it
// goes: names, sizes and piece counts must agree.
func planShards(dir string, man *Manifest, need Need, dirty func() error) ([]*shard, error) {
	by := map[string]*shard{}
	tensors := map[string]ManifestTensor{}
	for _, t := range man.Tensors {
		if !need.needs(t) {
			continue
		}
		if _, dup := tensors[t.Name]; dup {
			return nil, fmt.Errorf("tensor %q listed twice", t.Name)
		}
		tensors[t.Name] = t
		name := shardOf(t)
		s := by[name]
		if s == nil {
			s = &shard{name: name, final: filepath.Join(dir, name)}
			by[name] = s
		}
		s.specs = append(s.specs, safetensors.Spec{Name: t.Name, DType: t.DType, Shape: t.Shape})
	}
	var shards []*shard
	for _, s := range by {
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i].name < shards[j].name })
	for _, s := range shards {
		sort.Slice(s.specs, func(i, j int) bool { return s.specs[i].Name < s.specs[j].Name })
		prefix, offsets, size, err := safetensors.Layout(s.specs, nil)
		if err != nil {
			return shards, err
		}
		if err := s.open(prefix, size, dirty); err != nil {
			return shards, err
		}
		for i, sp := range s.specs {
			t := tensors[sp.Name]
			end := size
			if i+1 < len(offsets) {
				end = offsets[i+1]
			}
			if end-offsets[i] != t.Size {
				return shards, fmt.Errorf("tensor %q: %s%v is %d bytes, not %d", t.Name, t.DType, t.Shape, end-offsets[i], t.Size)
			}
			for k, d := range t.Pieces {
				off := int64(k) * man.PieceBytes
				s.pieces = append(s.pieces, piece{tensor: t.Name, off: off, at: offsets[i] + off, size: min(man.PieceBytes, t.Size-off), digest: d, file: s.file})
			}
		}
	}
	return shards, nil
}

// open opens the shard's file as planShards says, telling dirty first
// where it changes the directory.
func (s *shard) open(prefix []byte, size int64, dirty func() error) error {
	for _, path := range []string{s.final, s.final + partialSuffix} {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		have := make([]byte, len(prefix))
		fi, err := f.Stat()
		if err == nil && fi.Size() == size {
			if _, err := f.ReadAt(have, 0); err == nil && bytes.Equal(have, prefix) {
				s.file, s.path = f, path
				if path == s.final {
					os.Remove(s.final + partialSuffix) // an older try's
				}
				return nil
			}
		}
		f.Close()
	}
	if err := dirty(); err != nil {
		return err
	}
	path := s.final + partialSuffix
	f, err := os.Create(path)
	if err == nil {
		if _, err = f.Write(prefix); err == nil {
			err = f.Truncate(size) // holes until the pieces come
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	os.Remove(s.final) // another model's or another layout's
	s.file, s.path = f, path
	return nil
}

// writeIndex writes the safetensors index of shards, the node's whole
// checkpoint (a file left by an earlier fetch of other layers stays on
// disk, unlisted).
func writeIndex(dir string, shards []*shard) error {
	wm := map[string]string{}
	for _, s := range shards {
		for _, sp := range s.specs {
			wm[sp.Name] = s.name
		}
	}
	if len(wm) == 0 {
		return fmt.Errorf("fetch: the node's part of the checkpoint holds no tensor")
	}
	b, err := json.MarshalIndent(map[string]any{"metadata": map[string]string{"fetched_by": "odmoe"}, "weight_map": wm}, "", "  ")
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, safetensors.IndexFile), b)
}
