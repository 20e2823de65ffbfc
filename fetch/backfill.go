package fetch

import (
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
	experts []expertChunks            // every expert's chunks, for Fill
	sources []Source
	log     zerolog.Logger
	fetched atomic.Int64
	// inflight are the chunks being fetched: one fetch a chunk, however
	// many ask for it at once (a read and Fill)
	mu       sync.Mutex
	inflight map[store.ChunkRef]*flight
	// coming are the chunks a Fill in progress will write: Local holds a
	// request for one until it has
	coming arrivals
}

type expertChunks struct {
	layer, expert int
	chunks        []store.Chunk
}

// flight is one fetch of a chunk, which others asking for it wait for.
type flight struct {
	done chan struct{}
	err  error
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
	b := &Backfill{f: f, index: index, crcs: map[store.ChunkRef]uint32{}, sources: sources, log: log, inflight: map[store.ChunkRef]*flight{}}
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
			b.experts = append(b.experts, expertChunks{l, e, cs})
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
	if !known { // not a chunk of the index: the store says so
		_, err := b.f.ReadAt(dst, ref.Offset)
		return err
	}
	c := store.Chunk{Ref: ref, CRC: crc}
	if alreadyThere(b.f, dst, ref.Offset, c.Check) {
		return nil
	}
	_, err := b.fetch(ctx, c, dst, b.sources)
	return err
}

// fetch brings chunk c into dst from sources (in that order) and keeps
// it in the directory, once however many ask for it at the same time:
// the others wait for that fetch, then read the chunk from the directory.
// It reports whether this call fetched it.
func (b *Backfill) fetch(ctx context.Context, c store.Chunk, dst []byte, sources []Source) (bool, error) {
	b.mu.Lock()
	if f, ok := b.inflight[c.Ref]; ok {
		b.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if f.err != nil {
			return false, f.err
		}
		_, err := b.f.ReadAt(dst, c.Ref.Offset)
		if err == nil {
			err = c.Check(dst)
		}
		return false, err
	}
	f := &flight{done: make(chan struct{})}
	b.inflight[c.Ref] = f
	b.mu.Unlock()
	// a fetch that ended since this caller looked has written it (a
	// hole, as most are while a share fills, is not read: see
	// alreadyThere)
	if alreadyThere(b.f, dst, c.Ref.Offset, c.Check) {
		b.mu.Lock()
		delete(b.inflight, c.Ref)
		b.mu.Unlock()
		close(f.done)
		return false, nil
	}
	err := fetchChunk(ctx, sources, c, dst, &b.fetched, func(src string, err error) {
		b.log.Warn().Str("source", src).Int64("offset", c.Ref.Offset).Err(err).Msg("fetch: a source served a bad chunk; asking the next")
	})
	if err == nil {
		if _, werr := b.f.WriteAt(dst, c.Ref.Offset); werr != nil {
			b.log.Warn().Err(werr).Str("file", b.f.Name()).Msg("fetch: a chunk fetched could not be kept; it is fetched again next time")
		} else {
			b.coming.arrived(c.Ref)
		}
	}
	f.err = err
	b.mu.Lock()
	delete(b.inflight, c.Ref)
	b.mu.Unlock()
	close(f.done)
	return err == nil, err
}

// Fill brings the directory every chunk it lacks of the experts selected
// (a worker's share: sched.Layout.Holds), in the store's order,
// opt.Parallel at a time at opt.Rate, the sources asked in turn with
// opt.Spread (after opt.SourcesFor's), each chunk fetched once even while
// the node's own reads ask for it too; it says what it kept and fetched
// (Fetched: the fill's own fetches). While it runs, Local holds a request
// for a chunk it will bring until it has.
func (b *Backfill) Fill(ctx context.Context, experts func(layer, expert int) bool, opt Options) (Result, error) {
	type place struct{ layer, expert, k int } // a chunk's expert, and which of its chunks
	var chunks []store.Chunk
	var places []place
	var refs []store.ChunkRef
	for _, ec := range b.experts {
		if experts == nil || experts(ec.layer, ec.expert) {
			for k, c := range ec.chunks {
				chunks, places, refs = append(chunks, c), append(places, place{ec.layer, ec.expert, k}), append(refs, c.Ref)
			}
		}
	}
	b.coming.expect(refs)
	defer b.coming.ended() // what was not written is not coming
	var fetched atomic.Int64
	res, err := fill(ctx, b.f, chunks, opt, b.coming.arrived, func(ctx context.Context, i int, buf []byte) error {
		order := b.sources
		if opt.Spread {
			order = rotated(order, i)
		}
		if opt.SourcesFor != nil {
			at := places[i]
			order = slices.Concat(opt.SourcesFor(at.layer, at.expert, at.k), order) // (a new slice: neither is written)
		}
		here, err := b.fetch(ctx, chunks[i], buf, order)
		if here { // (not a wait on a read's fetch)
			fetched.Add(int64(chunks[i].Ref.Size))
		}
		return err
	})
	res.Fetched = fetched.Load()
	return res, err
}

// IndexWait is how long a node started on an empty directory asks its
// sources for the store's index before it gives up: they may start
// after it.
const IndexWait = 5 * time.Minute

// Local is what the node serves others from: the chunks its directory
// holds, never fetched on their behalf (two nodes fetching from each
// other would ask each other for a chunk neither holds, for ever); one a
// Fill in progress will bring is served once it has (up to holdWait).
func (b *Backfill) Local() Holder { return local{b} }

type local struct{ b *Backfill }

func (l local) IndexBytes() []byte { return l.b.index }

func (l local) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	return l.b.coming.readHeld(ctx, l.b.f, ref, dst[:ref.Size], func(b []byte) error { return l.CheckChunk(ref, b) })
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

// HoldsExpert reports whether every chunk of expert of layer is in the
// directory (its bytes pass their check): what the node can read without
// fetching.
func (b *Backfill) HoldsExpert(layer, expert int) bool {
	for _, ec := range b.experts {
		if ec.layer != layer || ec.expert != expert {
			continue
		}
		for _, c := range ec.chunks {
			bp := getBuffer(c.Ref.Size)
			there := alreadyThere(b.f, *bp, c.Ref.Offset, c.Check)
			putBuffer(bp)
			if !there {
				return false
			}
		}
		return true
	}
	return false
}

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
	// a failed dial is not tried again before retryAt, later each time
	// it fails again (backoff): a source that is down costs one dial a
	// while, not one a chunk. While a dial is under way (dialing, closed
	// when it ends) other askers wait for it, unless the last one failed:
	// then they are told so at once and ask their next source
	retryAt time.Time
	backoff time.Duration
	failed  error
	dialing chan struct{}
	closed  bool
}

// redialAfter is how long a source whose dial failed is passed over at
// first; maxRedialAfter the most, the wait doubling with each failure.
const (
	redialAfter    = 2 * time.Second
	maxRedialAfter = 30 * time.Second
)

// errDialing is an asker's error while another's dial is under way.
var errDialing = errors.New("being dialled")

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

// peer is the connection, dialed now if there is none: one dial at a
// time, outside the lock, the others waiting for it unless the last dial
// failed, so a host that does not answer costs its dial timeout once,
// not once a chunk.
func (d *Dialed) peer(ctx context.Context) (*PeerSource, error) {
	d.mu.Lock()
	for d.dialing != nil && d.failed == nil && !d.closed {
		wait := d.dialing
		d.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		d.mu.Lock()
	}
	switch {
	case d.closed:
		d.mu.Unlock()
		return nil, fmt.Errorf("source %s closed", d.addr)
	case d.src != nil:
		select {
		case <-d.src.done: // gone: dial again
			d.src.Close()
			d.src = nil
		default:
			src := d.src
			d.mu.Unlock()
			return src, nil
		}
	}
	switch failed := d.failed; {
	case d.dialing != nil:
		d.mu.Unlock()
		return nil, fmt.Errorf("%s: %w (its last dial failed: %w)", d.addr, errDialing, failed)
	case time.Now().Before(d.retryAt):
		d.mu.Unlock()
		return nil, fmt.Errorf("%s did not answer lately: %w", d.addr, failed)
	}
	done := make(chan struct{})
	d.dialing = done
	d.mu.Unlock()
	p, err := wire.DialStream(ctx, d.addr, d.cfg)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialing = nil
	close(done)
	switch {
	case err != nil:
		d.backoff = min(max(2*d.backoff, redialAfter), maxRedialAfter)
		d.retryAt, d.failed = time.Now().Add(d.backoff), err
		return nil, err
	case d.closed:
		p.Close()
		return nil, fmt.Errorf("source %s closed", d.addr)
	}
	d.backoff, d.failed = 0, nil
	d.src = NewPeerSource(p)
	return d.src, nil
}

// ask runs f on the connection, and once more on a new one where the
// connection ended under it: a holder drops a stream nothing moved on
// for its idle timeout (a fetcher pacing itself), and a request sent as
// it did is lost, not refused.
func (d *Dialed) ask(ctx context.Context, f func(*PeerSource) error) error {
	for attempt := 0; ; attempt++ {
		s, err := d.peer(ctx)
		if err != nil {
			return err
		}
		if err = f(s); attempt > 0 || !errors.Is(err, errConnGone) || ctx.Err() != nil {
			return err
		}
	}
}

func (d *Dialed) Index(ctx context.Context) (b []byte, err error) {
	err = d.ask(ctx, func(s *PeerSource) (err error) { b, err = s.Index(ctx); return err })
	return b, err
}

func (d *Dialed) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	return d.ask(ctx, func(s *PeerSource) error { return s.ReadChunk(ctx, ref, dst) })
}

func (d *Dialed) Manifest(ctx context.Context) (b []byte, err error) {
	err = d.ask(ctx, func(s *PeerSource) (err error) { b, err = s.Manifest(ctx); return err })
	return b, err
}

func (d *Dialed) ReadFile(ctx context.Context, name string) (b []byte, err error) {
	err = d.ask(ctx, func(s *PeerSource) (err error) { b, err = s.ReadFile(ctx, name); return err })
	return b, err
}

func (d *Dialed) ReadTensor(ctx context.Context, name string, off int64, dst []byte) error {
	return d.ask(ctx, func(s *PeerSource) error { return s.ReadTensor(ctx, name, off, dst) })
}

// Timed is src with each chunk it is asked for bounded by d: a source
// that stalls (a peer that hangs) costs d, then the next is asked.
func Timed(src Source, d time.Duration) Source { return timed{src, d} }

type timed struct {
	Source
	d time.Duration
}

func (t timed) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	ctx, cancel := context.WithTimeout(ctx, t.d)
	defer cancel()
	return t.Source.ReadChunk(ctx, ref, dst)
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
