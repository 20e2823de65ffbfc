// Package fetch brings a node its share of a model's compressed expert
// store from nodes that hold it (issue 56): the index, then the chunks
// of the experts of the layers it serves, each checked against the
// index's CRC-32C before it is written, into a directory in the store's
// own format (store.Open reads it as any store). The chunk file is laid
// out as the source's, with holes where the share has no chunk, so the
// directory checks itself: a node started again keeps every chunk whose
// bytes pass their check and fetches only the others (an interrupted
// fetch resumes where it stopped; a damaged or other model's cache is
// repaired). A source that serves a bad chunk is named, and the chunk
// comes from the next. A stage's or shadow's part of the model's
// checkpoint comes the same way (Model): a manifest of SHA-256 digests,
// then the tensors the node binds, piece by piece.
//
// It does not know where sources are (the caller hands them over: a
// peer's connection, PeerSource; a directory, DirSource), which layers a
// node serves (the caller says), or the transport (wire).
package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/store"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
)

// Source is a node that holds the store: its index file and its chunks.
// It must be safe for concurrent use.
type Source interface {
	// Name names the source in logs and errors.
	Name() string
	// Index is the store's index file.
	Index(ctx context.Context) ([]byte, error)
	// ReadChunk fills dst (len(dst) == ref.Size) with the chunk at ref.
	ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error
}

// Options say what to fetch and how.
type Options struct {
	// Layers, if set, selects the layers whose experts are the share;
	// nil: every layer. Experts, if set, selects among those layers'
	// experts (a worker's share: sched.Layout.Holds); nil: all of them.
	Layers  func(layer int) bool
	Experts func(layer, expert int) bool
	// Parallel is how many chunks are fetched at once (default 4): a
	// source's round trip is hidden behind the others'. AheadBytes, if
	// set, makes it as many of the share's chunks as AheadBytes holds (4
	// to 16): where sources hold requests until they have the chunk (a
	// Filling, a filling peer's Local), a short window stalls behind its
	// slowest chunk.
	Parallel   int
	AheadBytes int64
	// Rate caps the bytes fetched a second (0: no cap), so that a
	// running swarm's traffic keeps the links it needs. Pacer, if set,
	// is used instead: one cap over fetches that run at once (a shadow's
	// checkpoint and its experts).
	Rate  float64
	Pacer *Pacer
	// Spread asks the sources in turn, chunk by chunk (the next one where
	// a source fails), so that every source serves a share of the load;
	// otherwise each chunk is asked of the sources in their order.
	Spread bool
	// Progress, if set, is told the share's bytes done (kept or fetched)
	// and its total, as chunks complete; it may be called concurrently.
	Progress func(done, total int64)
	// Backfill.Fill only: SourcesFor, if set, are the sources the k-th
	// chunk of expert of layer is asked of first, before the backfill's
	// own: nodes filling the same experts each fetch their part from a
	// holder and the rest from each other, and a node relaying the store
	// as it fills it (a shadow's Filling) is asked before the main node.
	SourcesFor func(layer, expert, k int) []Source
	// Share only: Filling, if set, serves the directory to other nodes
	// as Share fills it (the chunks written so far, and those to come
	// once written).
	Filling *Filling
	Log     zerolog.Logger
}

// Result is what a fetch did, in chunk bytes.
type Result struct {
	// Share is the bytes of the share's chunks; Kept those already on
	// disk that passed their check; Fetched those fetched, a bad chunk
	// (rejected) included, so Fetched can pass Share - Kept.
	Share, Kept, Fetched int64
	// Chunks is how many chunks the share has, Bad how many a source
	// served wrong, and BadSources who served them (each once).
	Chunks, Bad int
	BadSources  []string
}

// ErrNoSource is returned when no source could give a piece.
var ErrNoSource = errors.New("fetch: no source gave it")

// Share fetches into dir the share opt.Layers selects of the store the
// sources hold, trying them in order for each piece, and returns what it
// kept and fetched. dir is made if missing; a dir holding another store
// (another index) is started afresh.
func Share(ctx context.Context, dir string, sources []Source, opt Options) (Result, error) {
	if len(sources) == 0 {
		return Result{}, fmt.Errorf("fetch: no source")
	}
	defer opt.Filling.ended() // what was not written is not coming (nil: nothing)
	index, err := fetchIndex(ctx, sources)
	if err != nil {
		opt.Filling.fail(err)
		return Result{}, err
	}
	st, err := store.New(index, noChunks{}, store.Options{})
	if err != nil {
		err = fmt.Errorf("fetch: the index %s served: %w", sources[0].Name(), err)
		opt.Filling.fail(err)
		return Result{}, err
	}
	defer st.Close()
	f, err := prepare(dir, index, st, opt.Log)
	if err != nil {
		opt.Filling.fail(err)
		return Result{}, err
	}
	defer f.Close()

	var chunks []store.Chunk
	for _, l := range st.Layers() {
		if opt.Layers != nil && !opt.Layers(l) {
			continue
		}
		for e := range st.Experts() {
			if opt.Experts != nil && !opt.Experts(l, e) {
				continue
			}
			cs, err := st.ExpertChunks(l, e)
			if err != nil {
				opt.Filling.fail(err)
				return Result{}, err
			}
			chunks = append(chunks, cs...)
		}
	}
	refs := make([]store.ChunkRef, len(chunks))
	for i, c := range chunks {
		refs[i] = c.Ref
	}
	opt.Filling.begin(dir, index, refs)
	var fetched, bad atomic.Int64
	var mu sync.Mutex // badSources
	var badSources []string
	res, err := fill(ctx, f, chunks, opt, opt.Filling.arrived, func(ctx context.Context, i int, buf []byte) error {
		c, order := chunks[i], sources
		if opt.Spread {
			order = rotated(sources, i)
		}
		if err := fetchChunk(ctx, order, c, buf, &fetched, func(src string, err error) {
			bad.Add(1)
			opt.Log.Warn().Str("source", src).Int64("offset", c.Ref.Offset).Err(err).Msg("fetch: a source served a bad chunk; asking the next")
			mu.Lock()
			if !slices.Contains(badSources, src) {
				badSources = append(badSources, src)
			}
			mu.Unlock()
		}); err != nil {
			return err
		}
		if _, err := f.WriteAt(buf, c.Ref.Offset); err != nil {
			return fmt.Errorf("fetch: writing %s: %w", f.Name(), err)
		}
		opt.Filling.arrived(c.Ref)
		return nil
	})
	res.Fetched, res.Bad, res.BadSources = fetched.Load(), int(bad.Load()), badSources
	if err != nil {
		return res, err
	}
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	return res, nil
}

// fill is the walk Share and Backfill.Fill make over a share's chunks,
// in order, ahead(opt) of them at a time: a chunk whose bytes f holds
// already is kept (and kept told of it), any other fetched into buf by
// get at opt.Rate (get writes it into f); opt.Progress is told of each
// chunk done. It returns the share's chunks and bytes and what was kept.
func fill(ctx context.Context, f *os.File, chunks []store.Chunk, opt Options, kept func(store.ChunkRef), get func(ctx context.Context, i int, buf []byte) error) (Result, error) {
	res := Result{Chunks: len(chunks)}
	for _, c := range chunks {
		res.Share += int64(c.Ref.Size)
	}
	if opt.Parallel <= 0 {
		opt.Parallel = 4
	}
	pace := pacerOf(opt)
	var keptBytes, done atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(ahead(opt, res.Share, len(chunks)))
	for i, c := range chunks {
		g.Go(func() error {
			if err := gctx.Err(); err != nil { // failed, or ended: the rest is not looked at
				return err
			}
			bp := getBuffer(c.Ref.Size)
			defer putBuffer(bp)
			buf := *bp
			if alreadyThere(f, buf, c.Ref.Offset, c.Check) {
				keptBytes.Add(int64(c.Ref.Size))
				kept(c.Ref)
			} else {
				if err := pace.wait(gctx, c.Ref.Size); err != nil {
					return err
				}
				if err := get(gctx, i, buf); err != nil {
					return err
				}
			}
			if opt.Progress != nil {
				opt.Progress(done.Add(int64(c.Ref.Size)), res.Share)
			}
			return nil
		})
	}
	err := g.Wait()
	res.Kept = keptBytes.Load()
	return res, err
}

// HeldAheadBytes is the AheadBytes of a fill whose sources hold requests
// until they have the chunk (a worker asking its peers and the shadow,
// the shadow asking the main node ahead of the workers riding behind
// it): on the emulated rig four chunks in flight left the workers 2 s
// behind the shadow, sixteen of ~300 KB kept them with it.
const HeldAheadBytes = 16 << 20

// ahead is how many chunks of a share of n chunks and bytes are fetched
// at once (Options.Parallel, Options.AheadBytes).
func ahead(opt Options, bytes int64, n int) int {
	if opt.AheadBytes <= 0 || n == 0 {
		return opt.Parallel
	}
	return int(min(max(opt.AheadBytes/max(bytes/int64(n), 1), 4), 16))
}

// fetchChunk fills buf with chunk c from the first source whose bytes
// pass its check, counting what each sent in fetched and telling bad of
// each source whose bytes did not.
func fetchChunk(ctx context.Context, sources []Source, c store.Chunk, buf []byte, fetched *atomic.Int64, bad func(src string, err error)) error {
	what := fmt.Sprintf("the chunk at %d (%d bytes)", c.Ref.Offset, c.Ref.Size)
	return firstGood(ctx, sources, what, func(src Source) error {
		if err := src.ReadChunk(ctx, c.Ref, buf); err != nil {
			return err
		}
		fetched.Add(int64(c.Ref.Size))
		if err := c.Check(buf); err != nil {
			return fmt.Errorf("%w: %w", errBadPiece, err)
		}
		return nil
	}, bad)
}

// errBadPiece marks bytes a source sent that failed their check (the
// store's CRC, the manifest's SHA-256): the source is named for them.
var errBadPiece = errors.New("bad bytes")

// firstGood asks the sources in order until one's read succeeds: read
// fetches a piece (what, in errors) from a source and checks it, a failed
// check wrapped in errBadPiece, for which bad is told the source's name.
func firstGood[S interface{ Name() string }](ctx context.Context, sources []S, what string, read func(S) error, bad func(src string, err error)) error {
	if len(sources) == 0 {
		return fmt.Errorf("%w: %s: no source to ask", ErrNoSource, what)
	}
	var errs []error
	for _, src := range sources {
		err := read(src)
		if err == nil {
			return nil
		}
		if errors.Is(err, errBadPiece) {
			bad(src.Name(), err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		errs = append(errs, fmt.Errorf("%s: %w", src.Name(), err))
	}
	return fmt.Errorf("%w: %s: %w", ErrNoSource, what, errors.Join(errs...))
}

// rotated is s begun at its k-th element (k modulo its length): pieces
// asked of the sources in turn, so that each serves a share.
func rotated[S any](s []S, k int) []S {
	if len(s) < 2 {
		return s
	}
	k %= len(s)
	return append(slices.Clone(s[k:]), s[:k]...)
}

// fetchIndex is the index file from the first source that gives one.
func fetchIndex(ctx context.Context, sources []Source) ([]byte, error) {
	var errs []error
	for _, src := range sources {
		b, err := src.Index(ctx)
		if err == nil {
			return b, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", src.Name(), err))
	}
	return nil, fmt.Errorf("%w: the index: %w", ErrNoSource, errors.Join(errs...))
}

// prepare makes dir hold index (written anew, and the chunk file started
// afresh, when what it holds is another store's) and returns its chunk
// file open for reading and writing, at the store's full size with its
// header: the chunks already there stay where they are.
func prepare(dir string, index []byte, st *store.Store, log zerolog.Logger) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	indexPath, chunkPath := filepath.Join(dir, store.IndexFile), filepath.Join(dir, store.ChunkFile)
	if old, err := os.ReadFile(indexPath); err != nil || !bytes.Equal(old, index) {
		if err == nil {
			log.Info().Str("dir", dir).Msg("fetch: the directory holds another store's share: starting it afresh")
		}
		if err := os.Remove(chunkPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		if err := writeFileAtomic(indexPath, index); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(chunkPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("fetch: %w", err)
	}
	noReadahead(f)
	fi, err := f.Stat()
	if err == nil && fi.Size() != st.ChunkFileSize() {
		err = f.Truncate(st.ChunkFileSize()) // holes where no chunk is yet
	}
	if err == nil {
		hdr := st.ChunkFileHeader()
		have := make([]byte, len(hdr))
		if _, rerr := f.ReadAt(have, 0); rerr != nil || !bytes.Equal(have, hdr) {
			_, err = f.WriteAt(hdr, 0)
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fetch: %s: %w", chunkPath, err)
	}
	return f, nil
}

// writeFileAtomic writes b to path through a temporary file renamed
// over it, synced.
func writeFileAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("fetch: %w", err)
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("fetch: %w", err)
	}
	return nil
}

// noChunks is the source of a store parsed only for its index.
type noChunks struct{}

func (noChunks) ReadChunk(context.Context, store.ChunkRef, []byte) error {
	return errors.New("fetch: the index alone")
}

// Pacer spaces fetches so that their bytes keep to a rate: each waits
// until the bytes before it have had their time.
type Pacer struct {
	rate float64 // bytes a second; 0: no pacing
	mu   sync.Mutex
	next time.Time // when the link is free for the next bytes
}

// NewPacer is a cap of rate bytes a second (0: none) that fetches share
// (Options.Pacer).
func NewPacer(rate float64) *Pacer { return &Pacer{rate: rate} }

// pacerOf is opt's Pacer, or one of opt.Rate's own.
func pacerOf(opt Options) *Pacer {
	if opt.Pacer != nil {
		return opt.Pacer
	}
	return NewPacer(opt.Rate)
}

// wait returns once n more bytes keep within the rate (at once without
// one), or when ctx ends.
func (p *Pacer) wait(ctx context.Context, n int) error {
	if p.rate <= 0 {
		return nil
	}
	p.mu.Lock()
	now := time.Now()
	at := p.next
	if at.Before(now) {
		at = now
	}
	p.next = at.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	p.mu.Unlock()
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
