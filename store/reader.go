package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// ChunkSource delivers the bytes of stored chunks: the local chunk file
// (Open), or a peer holding the same store (New with that peer's index).
// ReadChunk fills dst, len(dst) == ref.Size, with the chunk at ref; the
// store checks every chunk's CRC-32C itself, so a source need not.
// It must be safe for concurrent use.
type ChunkSource interface {
	ReadChunk(ctx context.Context, ref ChunkRef, dst []byte) error
}

// Options configure a Store.
type Options struct {
	// Identity, when set, is the model the caller serves: a store built
	// from another model is refused with ErrModelMismatch.
	Identity Identity
	// Parallelism bounds the goroutines decoding at once, summed over all
	// concurrent reads (default GOMAXPROCS).
	Parallelism int
	// VerifyDecoded also checks the decoded bytes of every shard against
	// the CRC-32C of the original weights (costs a CRC pass over the
	// output; the chunk checksums are always checked).
	VerifyDecoded bool
	// Chunks, if set, keeps the chunks read in host memory (the compressed
	// tier): a chunk found there is decoded without reading the source.
	Chunks *ChunkCache
}

// Store reads experts from a compressed store. Safe for concurrent use.
type Store struct {
	ix        *index
	raw       []byte // the index file, for peers
	src       ChunkSource
	dir       string      // Open's: Check opens its chunk file again
	file      *fileSource // the chunk file when Open opened it, else nil
	verify    bool
	chunks    *ChunkCache   // nil: none
	slots     chan *decoder // a decoder (nil until first used) per goroutine allowed to decode
	nslots    int
	maxExp    int // the largest exponent chunk: each decoder's buffer
	closeOnce sync.Once
	// crcs are each chunk's CRC by its offset, made on first use
	// (CheckChunk)
	crcsOnce sync.Once
	crcs     map[ChunkRef]uint32
}

// Open opens the store in dir and checks it: the index checksum, the
// format version, the model identity (if opt.Identity is set) and that the
// chunk file holds every chunk the index names. Chunks themselves are
// checked as they are read.
func Open(dir string, opt Options) (*Store, error) {
	raw, err := os.ReadFile(filepath.Join(dir, IndexFile))
	if err != nil {
		if _, cerr := os.Stat(filepath.Join(dir, "config.json")); errors.Is(err, fs.ErrNotExist) && cerr == nil {
			return nil, fmt.Errorf("store: %s is a model directory (config.json), not an expert store: make one with odmoe convert -model %s -out STORE, and give STORE", dir, dir)
		}
		return nil, fmt.Errorf("store: %w (a store is made by odmoe convert)", err)
	}
	f, err := os.Open(filepath.Join(dir, ChunkFile))
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	src := &fileSource{}
	src.f.Store(f)
	s, err := newStore(raw, src, opt)
	if err == nil {
		err = s.checkChunkFile(f)
	}
	if err != nil {
		f.Close()
		if te := (*TensorError)(nil); errors.As(err, &te) {
			return nil, fmt.Errorf("%w (store %s)", err, dir)
		}
		return nil, fmt.Errorf("store: %s: %w", dir, err)
	}
	s.dir, s.file = dir, src
	return s, nil
}

// Check tells whether the store can still be read as a whole: its chunk
// file, opened again by its path (so that a file replaced since is the
// one checked), has the header and the size the index names. A chunk
// file cut short, overwritten or gone under a running reader fails it;
// one put back (a good copy renamed over it) passes, and chunks are read
// from it from then on. Single chunks are checked as they are read, not
// here. A store made with New has no file of its own to check: nil.
func (s *Store) Check() error {
	if s.file == nil {
		return nil
	}
	f, err := os.Open(filepath.Join(s.dir, ChunkFile))
	if err == nil {
		err = s.checkChunkFile(f)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		if te := (*TensorError)(nil); errors.As(err, &te) {
			return fmt.Errorf("%w (store %s)", err, s.dir)
		}
		return fmt.Errorf("store: %s: %w", s.dir, err)
	}
	s.file.swap(f)
	return nil
}

// New opens a store from its index bytes (Store.IndexBytes of a peer) and
// a source of its chunks, such as a connection to that peer. The store
// keeps index; the caller must not modify it.
func New(index []byte, src ChunkSource, opt Options) (*Store, error) {
	s, err := newStore(index, src, opt)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}

func newStore(raw []byte, src ChunkSource, opt Options) (*Store, error) {
	ix, err := parseIndex(raw)
	if err != nil {
		return nil, err
	}
	if !opt.Identity.IsZero() && opt.Identity != ix.identity {
		return nil, fmt.Errorf("store model %s, serving model %s: %w", ix.identity.Short(), opt.Identity.Short(), ErrModelMismatch)
	}
	p := opt.Parallelism
	if p <= 0 {
		p = runtime.GOMAXPROCS(0)
	}
	s := &Store{ix: ix, raw: raw, src: src, verify: opt.VerifyDecoded, chunks: opt.Chunks, nslots: p}
	for i := range ix.tensors {
		for _, sh := range ix.tensors[i].shards {
			s.maxExp = max(s.maxExp, sh.exp.Size)
		}
	}
	s.slots = make(chan *decoder, p)
	for range p {
		s.slots <- nil // decoders are allocated on first use
	}
	return s, nil
}

// checkChunkFile compares the chunk file with the index: its header, and
// its size. A short file names the first tensor it cuts off.
func (s *Store) checkChunkFile(f *os.File) error {
	hdr := make([]byte, chunkHeaderLen)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return fmt.Errorf("%s: header: %v: %w", ChunkFile, err, ErrTruncated)
	}
	want := chunkHeader(s.ix.identity, s.ix.version)
	switch {
	case string(hdr[:8]) != chunkMagic:
		return fmt.Errorf("%s: not an odmoe chunk file: %w", ChunkFile, ErrCorrupt)
	case string(hdr[8:12]) != string(want[8:12]):
		return fmt.Errorf("%s: format version differs from the index: %w", ChunkFile, ErrVersion)
	case string(hdr) != string(want):
		return fmt.Errorf("%s: belongs to another store (model identity differs from the index): %w", ChunkFile, ErrCorrupt)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if size := st.Size(); size < s.ix.chunkBytes {
		for i := range s.ix.tensors {
			t := &s.ix.tensors[i]
			for sh, e := range t.shards {
				for _, c := range []ChunkRef{e.exp, e.sm} {
					if c.Offset+int64(c.Size) > size {
						return &TensorError{Layer: t.layer, Expert: t.expert, Kind: t.kind, Shard: sh,
							Err: fmt.Errorf("%s is %d bytes, the index needs %d (this and later chunks are missing): %w", ChunkFile, size, s.ix.chunkBytes, ErrTruncated)}
					}
				}
			}
		}
	} else if size > s.ix.chunkBytes {
		return fmt.Errorf("%s is %d bytes, the index says %d: %w", ChunkFile, size, s.ix.chunkBytes, ErrCorrupt)
	}
	return nil
}

// Close releases the chunk file. Reads must have returned.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.file != nil {
			err = s.file.close()
		}
	})
	return err
}

// Identity is the model the store was built from.
func (s *Store) Identity() Identity { return s.ix.identity }

// Layers lists the model layers whose experts the store holds, ascending:
// every layer but a model's dense ones. The caller must not modify it.
func (s *Store) Layers() []int { return s.ix.layers }

// Experts is the number of experts per layer.
func (s *Store) Experts() int { return s.ix.experts }

// IndexBytes returns the index file, for a peer to call New with. The
// caller must not modify it.
func (s *Store) IndexBytes() []byte { return s.raw }

// Form is the kind of expert the store holds.
func (s *Store) Form() Form { return s.ix.form }

// ExpertShape returns the hidden and intermediate sizes of expert (layer,
// expert), read off its w1 (gate) tensor, or half of its w13's rows.
func (s *Store) ExpertShape(layer, expert int) (hidden, intermediate int, err error) {
	if s.ix.form == FormClampedSwiGLU {
		t, err := s.ix.find(layer, expert, W13)
		if err != nil {
			return 0, 0, err
		}
		return t.cols, t.rows / 2, nil
	}
	t, err := s.ix.find(layer, expert, W1)
	if err != nil {
		return 0, 0, err
	}
	return t.cols, t.rows, nil
}

// ExpertBytes is the size of the buffer ReadExpert needs for (layer,
// expert): the original bytes of its tensors.
func (s *Store) ExpertBytes(layer, expert int) (int, error) {
	n := 0
	for _, k := range s.ix.form.kinds() {
		t, err := s.ix.find(layer, expert, k)
		if err != nil {
			return 0, err
		}
		n += t.bytes()
	}
	return n, nil
}

// ReadExpert decompresses expert (layer, expert) into dst, which must be
// ExpertBytes long, laid out as w1 (gate), w3 (up), w2 (down), or for
// FormClampedSwiGLU w13, w2, b13, b2, and returns the expert, its
// matrices aliasing dst. Its shards decode in parallel on the store's
// bounded pool. On error dst holds no valid weights.
func (s *Store) ReadExpert(ctx context.Context, layer, expert int, dst []byte) (model.Expert, error) {
	order := s.ix.form.readOrder()
	ts := make([]*tensorEntry, len(order))
	need, shards := 0, 0
	for i, k := range order {
		t, err := s.ix.find(layer, expert, k)
		if err != nil {
			return model.Expert{}, err
		}
		ts[i] = t
		need += t.bytes()
		shards += len(t.shards)
	}
	if len(dst) != need {
		return model.Expert{}, fmt.Errorf("store: layer %d expert %d: buffer of %d bytes, need %d", layer, expert, len(dst), need)
	}
	ms := make([]kernels.Matrix, len(order))
	tasks := make([]task, 0, shards)
	off := 0
	for i, t := range ts {
		out := dst[off : off+t.bytes()]
		off += t.bytes()
		ms[i] = t.matrix(out)
		tasks = appendTasks(tasks, t, out)
	}
	if err := s.run(ctx, tasks, s.verify, false); err != nil {
		return model.Expert{}, err
	}
	if s.ix.form == FormClampedSwiGLU {
		return model.Expert{GateUp: ms[0], Down: ms[1], GateUpBias: ms[2], DownBias: ms[3], Limit: s.ix.limit, Alpha: s.ix.alpha}, nil
	}
	return model.Expert{Gate: ms[0], Up: ms[1], Down: ms[2]}, nil
}

// ReadTensor decompresses one tensor into dst (exactly its original size).
func (s *Store) ReadTensor(ctx context.Context, layer, expert int, kind Kind, dst []byte) (kernels.Matrix, error) {
	t, err := s.ix.find(layer, expert, kind)
	if err != nil {
		return kernels.Matrix{}, err
	}
	if len(dst) != t.bytes() {
		return kernels.Matrix{}, fmt.Errorf("store: layer %d expert %d %v: buffer of %d bytes, need %d", layer, expert, kind, len(dst), t.bytes())
	}
	if err := s.run(ctx, appendTasks(nil, t, dst), s.verify, false); err != nil {
		return kernels.Matrix{}, err
	}
	return t.matrix(dst), nil
}

// task is one shard to decode into out (the shard's part of the tensor).
type task struct {
	t     *tensorEntry
	shard int
	out   []byte
}

func appendTasks(tasks []task, t *tensorEntry, out []byte) []task {
	es := elemSize(t.dtype)
	for i := range t.shards {
		lo, hi := t.shardRange(i)
		tasks = append(tasks, task{t: t, shard: i, out: out[lo*es : hi*es]})
	}
	return tasks
}

// run decodes tasks on up to Parallelism goroutines (the caller's among
// them), each holding one of the store's decoders while it works. It
// returns the error of the first failing task in task order; with all set
// it runs every task and joins every failure, in task order.
func (s *Store) run(ctx context.Context, tasks []task, verify, all bool) error {
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		errs   map[int]error
	)
	fail := func(i int, err error) {
		if !all {
			failed.Store(true)
		}
		mu.Lock()
		if errs == nil {
			errs = map[int]error{}
		}
		errs[i] = err
		mu.Unlock()
	}
	work := func() {
		for !failed.Load() {
			i := int(next.Add(1) - 1)
			if i >= len(tasks) {
				return
			}
			var d *decoder
			select {
			case d = <-s.slots:
			case <-ctx.Done():
				fail(i, ctx.Err())
				failed.Store(true)
				return
			}
			if d == nil {
				d = &decoder{}
			}
			err := s.decodeTask(ctx, d, &tasks[i], verify)
			s.slots <- d
			if err != nil {
				fail(i, err)
			}
		}
	}
	var wg sync.WaitGroup
	for range min(s.nslots, len(tasks)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if len(errs) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(errs))
	if !all {
		return errs[keys[0]]
	}
	list := make([]error, len(keys))
	for i, k := range keys {
		list[i] = errs[k]
	}
	return errors.Join(list...)
}

// decodeTask reads and checks a shard's two chunks and decodes them:
// the sign-mantissa chunk straight into the tail of the shard's output,
// the exponent chunk into the decoder's buffer.
func (s *Store) decodeTask(ctx context.Context, d *decoder, tk *task, verify bool) error {
	t, sh := tk.t, &tk.t.shards[tk.shard]
	fail := func(part string, err error) error {
		return &TensorError{Layer: t.layer, Expert: t.expert, Kind: t.kind, Shard: tk.shard, Part: part, Err: err}
	}
	if err := ctx.Err(); err != nil {
		return fail("", err)
	}
	n := len(tk.out) / elemSize(t.dtype)
	sm := tk.out[n:]
	if err := s.readChunk(ctx, sh.sm, sm, sh.smCRC); err != nil {
		return fail("sign-mantissa", err)
	}
	d.chunk = grow(d.chunk, s.maxExp)
	exp := d.chunk[:sh.exp.Size]
	if err := s.readChunk(ctx, sh.exp, exp, sh.expCRC); err != nil {
		return fail("exponent", err)
	}
	if err := d.decodeShard(t.dtype, exp, tk.out, n, s.ix.blockElems); err != nil {
		return fail("exponent", err)
	}
	if verify {
		if got := crc(tk.out); got != sh.rawCRC {
			return fail("decoded", fmt.Errorf("decoded bytes have CRC-32C %08x, the original had %08x: %w", got, sh.rawCRC, ErrChecksum))
		}
	}
	return nil
}

// readChunk fills dst with the chunk at ref, from the chunk cache if it
// holds it, else from the source (and keeps a copy in the cache), and
// checks its CRC-32C either way: a cached copy that no longer matches
// (memory that flipped a bit) is dropped and the chunk read again.
func (s *Store) readChunk(ctx context.Context, ref ChunkRef, dst []byte, want uint32) error {
	if s.chunks != nil && s.chunks.get(ref, dst) {
		if crc(dst) == want {
			return nil
		}
		s.chunks.drop(ref)
	}
	if err := s.src.ReadChunk(ctx, ref, dst); err != nil {
		return err
	}
	if got := crc(dst); got != want {
		return fmt.Errorf("CRC-32C %08x, index says %08x (%d bytes at offset %d): %w", got, want, ref.Size, ref.Offset, ErrChecksum)
	}
	if s.chunks != nil {
		s.chunks.put(ref, dst)
	}
	return nil
}

// fileSource reads chunks from the local chunk file with pread. Check may
// swap in the file found at its path; the files it replaced stay open
// (reads in flight may use them) until close.
type fileSource struct {
	f   atomic.Pointer[os.File]
	mu  sync.Mutex
	old []*os.File
}

// swap reads from f from now on, unless it is the file read already
// (then f is closed).
func (fs *fileSource) swap(f *os.File) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	cur := fs.f.Load()
	a, errA := cur.Stat()
	b, errB := f.Stat()
	if errA == nil && errB == nil && os.SameFile(a, b) {
		f.Close()
		return
	}
	fs.old = append(fs.old, cur)
	fs.f.Store(f)
}

func (fs *fileSource) close() error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range fs.old {
		f.Close()
	}
	return fs.f.Load().Close()
}

func (fs *fileSource) ReadChunk(_ context.Context, ref ChunkRef, dst []byte) error {
	n, err := fs.f.Load().ReadAt(dst[:ref.Size], ref.Offset)
	if n == ref.Size {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s ends inside this chunk (%d of %d bytes at offset %d): %w", ChunkFile, n, ref.Size, ref.Offset, ErrTruncated)
	}
	return fmt.Errorf("%s: %w", ChunkFile, err)
}
