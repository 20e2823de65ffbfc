package fetch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Backfill is the chunk source of a node running on a share of the
// store (store.ChunkSource): a chunk read from its directory whose bytes
// fail their check (outside the share, never fetched, or damaged) comes
// from the sources instead, checked, and is written into the directory
// for next time. A worker whose work moves outside its share (a lost
// peer's experts) runs it from here, and a worker started on an empty
// directory fills it with what it runs, as it runs it.
type Backfill struct {
	f       *os.File
	index   []byte
	crcs    map[store.ChunkRef]uint32 // each chunk's CRC (by place and size: an empty chunk starts where the next does)
	sources []Source
	log     zerolog.Logger
	fetched atomic.Int64
}

// OpenBackfill opens the store in dir through a Backfill from sources:
// dir holds a share (odmoe fetch), or nothing (then the index comes from
// the sources first). opt are the store's options.
func OpenBackfill(ctx context.Context, dir string, sources []Source, opt store.Options, log zerolog.Logger) (*store.Store, *Backfill, error) {
	index, err := os.ReadFile(filepath.Join(dir, store.IndexFile))
	deadline := time.Now().Add(IndexWait)
	for attempt := 1; errors.Is(err, os.ErrNotExist) || err != nil && attempt > 1 && time.Now().Before(deadline); attempt++ {
		// nothing here yet: the index from a source, which may start
		// after this node (its dial waits a while; then it is asked again)
		if index, err = fetchIndex(ctx, sources); err == nil || ctx.Err() != nil {
			break
		}
		if attempt&(attempt-1) == 0 {
			log.Info().Err(err).Int("attempt", attempt).Msg("fetch: no source gave the store's index yet; asking again")
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fetch: %w", err)
	}
	parsed, err := store.New(index, noChunks{}, store.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("fetch: %s: %w", dir, err)
	}
	defer parsed.Close()
	f, err := prepare(dir, index, parsed, log)
	if err != nil {
		return nil, nil, err
	}
	b := &Backfill{f: f, index: index, crcs: map[store.ChunkRef]uint32{}, sources: sources, log: log}
	for _, l := range parsed.Layers() {
		for e := range parsed.Experts() {
			cs, err := parsed.ExpertChunks(l, e)
			if err != nil {
				f.Close()
				return nil, nil, err
			}
			for _, c := range cs {
				b.crcs[c.Ref] = c.CRC
			}
		}
	}
	st, err := store.New(index, b, opt)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("fetch: %s: %w", dir, err)
	}
	return st, b, nil
}

// ReadChunk reads the chunk at ref from the directory, or, where its
// bytes fail their check, from the sources (then keeps it there).
func (b *Backfill) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	crc, known := b.crcs[ref]
	c := store.Chunk{Ref: ref, CRC: crc}
	_, err := b.f.ReadAt(dst, ref.Offset)
	if !known || err == nil && c.Check(dst) == nil {
		return err // (not a chunk of the index: the store says so)
	}
	if err := fetchChunk(ctx, b.sources, c, dst, &b.fetched, func(src string, err error) {
		b.log.Warn().Str("source", src).Int64("offset", ref.Offset).Err(err).Msg("fetch: a source served a bad chunk; asking the next")
	}); err != nil {
		return err
	}
	if _, err := b.f.WriteAt(dst, ref.Offset); err != nil {
		b.log.Warn().Err(err).Str("file", b.f.Name()).Msg("fetch: a chunk fetched could not be kept; it is fetched again next time")
	}
	return nil
}

// IndexWait is how long a node started on an empty directory asks its
// sources for the store's index before it gives up: they may start
// after it.
const IndexWait = 5 * time.Minute

// Local is what the node serves others from: the chunks its directory
// holds, never fetched on their behalf (two nodes fetching from each
// other would ask each other for a chunk neither holds, for ever).
func (b *Backfill) Local() Holder { return local{b} }

type local struct{ b *Backfill }

func (l local) IndexBytes() []byte { return l.b.index }

func (l local) ReadChunk(_ context.Context, ref store.ChunkRef, dst []byte) error {
	_, err := l.b.f.ReadAt(dst[:ref.Size], ref.Offset)
	return err
}

func (l local) CheckChunk(ref store.ChunkRef, data []byte) error {
	crc, ok := l.b.crcs[ref]
	if !ok {
		return fmt.Errorf("no chunk of the index is %d bytes at %d: %w", ref.Size, ref.Offset, store.ErrCorrupt)
	}
	return store.Chunk{Ref: ref, CRC: crc}.Check(data)
}

func (l local) IsChunk(ref store.ChunkRef) bool {
	_, ok := l.b.crcs[ref]
	return ok
}

// Dir is the directory the store is in; Sources what it fetches from.
func (b *Backfill) Dir() string       { return filepath.Dir(b.f.Name()) }
func (b *Backfill) Sources() []Source { return b.sources }

// Count counts n bytes fetched into the directory by other means (a
// Share filling it in the background) with the rest.
func (b *Backfill) Count(n int64) { b.fetched.Add(n) }

// Fetched is the chunk bytes fetched so far.
func (b *Backfill) Fetched() int64 { return b.fetched.Load() }

// Close closes the directory's chunk file (after the store).
func (b *Backfill) Close() error { return b.f.Close() }

// Dialed is a source dialed when first asked, and again after its
// connection ends: a node that holds the store, which may start after
// the node asking it.
type Dialed struct {
	addr string
	cfg  *wire.Config
	mu   sync.Mutex
	src  *PeerSource
	// a failed dial is not tried again before retryAt: a source that
	// is down costs one dial a while, not one a chunk
	retryAt time.Time
	failed  error
	closed  bool
}

// redialAfter is how long a source whose dial failed is passed over.
const redialAfter = 2 * time.Second

// Dial is a source at addr, dialed with cfg (this node's identity) when
// first asked.
func Dial(addr string, cfg *wire.Config) *Dialed { return &Dialed{addr: addr, cfg: cfg} }

func (d *Dialed) Name() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.src != nil {
		return d.src.Name()
	}
	return d.addr
}

// peer is the connection, dialed now if there is none.
func (d *Dialed) peer(ctx context.Context) (*PeerSource, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.closed:
		return nil, fmt.Errorf("source %s closed", d.addr)
	case d.src != nil:
		select {
		case <-d.src.done: // gone: dial again
			d.src.Close()
			d.src = nil
		default:
			return d.src, nil
		}
	}
	if time.Now().Before(d.retryAt) {
		return nil, fmt.Errorf("%s did not answer lately: %w", d.addr, d.failed)
	}
	p, err := wire.Dial(ctx, d.addr, d.cfg)
	if err != nil {
		d.retryAt, d.failed = time.Now().Add(redialAfter), err
		return nil, err
	}
	d.src = NewPeerSource(p)
	return d.src, nil
}

func (d *Dialed) Index(ctx context.Context) ([]byte, error) {
	s, err := d.peer(ctx)
	if err != nil {
		return nil, err
	}
	return s.Index(ctx)
}

func (d *Dialed) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	s, err := d.peer(ctx)
	if err != nil {
		return err
	}
	return s.ReadChunk(ctx, ref, dst)
}

// Close ends the connection, if any.
func (d *Dialed) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.src != nil {
		d.src.Close()
		d.src = nil
	}
}
