package fetch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
)

// PeerSource fetches from a node that holds the store over a connection
// of its own (a peer dialed to fetch): each piece is a FetchRequest, its
// answer the FetchData with the same ID. Close it when done.
type PeerSource struct {
	p       *wire.Stream
	next    atomic.Uint64
	mu      sync.Mutex
	waiting map[uint64]*asked
	err     error // why the connection ended; set once
	stop    context.CancelFunc
	done    chan struct{}
}

// asked is a request waiting for its answer: the answer's data is read
// into dst where it has dst's length (wire.Stream.RecvInto), and a
// request given up while that read is under way waits for it to end
// (reading), so that dst is the caller's again when ask returns.
type asked struct {
	answer  chan *wire.FetchData // (room for one)
	dst     []byte
	reading sync.WaitGroup
	claimed bool
}

// NewPeerSource fetches over p, which it owns from now on.
func NewPeerSource(p *wire.Stream) *PeerSource {
	ctx, stop := context.WithCancel(context.Background())
	s := &PeerSource{p: p, waiting: map[uint64]*asked{}, stop: stop, done: make(chan struct{})}
	go s.receive(ctx)
	return s
}

// Name is the peer's.
func (s *PeerSource) Name() string { return s.p.Identity().Name }

// Close ends the connection; requests waiting fail.
func (s *PeerSource) Close() {
	s.stop()
	s.p.Close()
	<-s.done
}

// receive hands each FetchData to the request waiting for it (its data
// read into the request's buffer) until the connection ends, then fails
// those still waiting.
func (s *PeerSource) receive(ctx context.Context) {
	defer close(s.done)
	var claimed *asked // the request whose buffer the frame read now fills
	into := func(id uint64, n int) []byte {
		s.mu.Lock()
		defer s.mu.Unlock()
		a := s.waiting[id]
		if a == nil || len(a.dst) != n || n == 0 {
			return nil
		}
		a.claimed = true
		a.reading.Add(1)
		claimed = a
		return a.dst
	}
	for {
		m, err := s.p.RecvInto(ctx, into)
		if claimed != nil {
			claimed.reading.Done()
			claimed = nil
		}
		if err != nil {
			s.mu.Lock()
			s.err = err
			for id, a := range s.waiting {
				close(a.answer)
				delete(s.waiting, id)
			}
			s.mu.Unlock()
			return
		}
		d, ok := m.(*wire.FetchData)
		if !ok {
			continue // a node that holds the store says nothing else to a fetcher
		}
		s.mu.Lock()
		a := s.waiting[d.ID]
		delete(s.waiting, d.ID)
		s.mu.Unlock()
		if a != nil {
			a.answer <- d
		}
	}
}

// errConnGone is a request's error where its connection ended under it.
var errConnGone = errors.New("connection gone")

// ask sends r and waits for its answer; the answer's data is read into
// dst where it is as long (then the answer's Data is dst).
func (s *PeerSource) ask(ctx context.Context, r *wire.FetchRequest, dst []byte) ([]byte, error) {
	r.ID = s.next.Add(1)
	a := &asked{answer: make(chan *wire.FetchData, 1), dst: dst}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", errConnGone, s.err)
	}
	s.waiting[r.ID] = a
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.waiting, r.ID)
		claimed := a.claimed
		s.mu.Unlock()
		if claimed { // dst is being written: the stream goes (a holder stalled mid-frame would keep it for its idle timeout), and the caller gets dst back once nothing writes it
			s.p.Close()
			a.reading.Wait()
		}
	}
	if err := s.p.Send(ctx, r); err != nil {
		forget()
		return nil, err
	}
	select {
	case d, ok := <-a.answer:
		if !ok {
			s.mu.Lock()
			err := s.err
			s.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", errConnGone, err)
		}
		if d.Err != "" {
			return nil, errors.New(d.Err)
		}
		return d.Data, nil
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	}
}

// Index asks the peer for its store's index file.
func (s *PeerSource) Index(ctx context.Context) ([]byte, error) {
	return s.ask(ctx, &wire.FetchRequest{Index: true}, nil)
}

// ReadChunk asks the peer for the chunk at ref.
func (s *PeerSource) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	b, err := s.ask(ctx, &wire.FetchRequest{Offset: ref.Offset, Size: ref.Size}, dst)
	if err != nil {
		return err
	}
	if len(b) != len(dst) {
		return fmt.Errorf("%d bytes for a chunk of %d at %d", len(b), len(dst), ref.Offset)
	}
	if len(b) > 0 && &b[0] != &dst[0] { // (read into dst as it came, where it came directly)
		copy(dst, b)
	}
	return nil
}

// Manifest asks the peer for its model's manifest.
func (s *PeerSource) Manifest(ctx context.Context) ([]byte, error) {
	return s.ask(ctx, &wire.FetchRequest{Model: true, Index: true}, nil)
}

// ReadFile asks the peer for its checkpoint's small file name.
func (s *PeerSource) ReadFile(ctx context.Context, name string) ([]byte, error) {
	return s.ask(ctx, &wire.FetchRequest{Model: true, File: name}, nil)
}

// ReadTensor asks the peer for len(dst) bytes of tensor name at off.
func (s *PeerSource) ReadTensor(ctx context.Context, name string, off int64, dst []byte) error {
	b, err := s.ask(ctx, &wire.FetchRequest{Model: true, Tensor: name, Offset: off, Size: len(dst)}, dst)
	if err != nil {
		return err
	}
	if len(b) != len(dst) {
		return fmt.Errorf("%d bytes for %d of tensor %q at %d", len(b), len(dst), name, off)
	}
	if len(b) > 0 && &b[0] != &dst[0] {
		copy(dst, b)
	}
	return nil
}

// Served is what a node serves fetching nodes: its expert store (or its
// share of it) and the model's checkpoint (the main node's). Either may
// be nil: what a node does not serve is answered with why not.
type Served struct {
	Store Holder
	Model *Checkpoint
}

// Holder is a store a node serves from: its index file and chunks, the
// check a chunk's bytes must pass, and whether a place and size is one
// of its chunks. *store.Store is one (that of a node whose store reads
// through a Backfill is not: Backfill.Local is), and a Filling (whose
// IndexBytes is nil until its fill has the index).
type Holder interface {
	IndexBytes() []byte
	ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error
	CheckChunk(ref store.ChunkRef, data []byte) error
	IsChunk(ref store.ChunkRef) bool
}

// serveParallel bounds the requests a connection has answered at once.
const serveParallel = 4

// Serve answers p's FetchRequests from what h holds until the
// connection or ctx ends, a few at a time; anything else p sends is
// ignored. A request for bytes outside the store or the checkpoint, or
// for a chunk the store does not hold (its bytes fail their check), is
// answered with the reason, and the fetching node asks its next source.
//
// served, if set, count the chunk and tensor bytes sent (each of them
// all of them: the connection's own and a node's total, say).
func Serve(ctx context.Context, p *wire.Stream, h Served, served ...*atomic.Int64) error {
	sem := make(chan struct{}, serveParallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx) // the answers in flight end with the connection
	defer cancel()
	for {
		m, err := p.Recv(ctx)
		if err != nil {
			return err
		}
		r, ok := m.(*wire.FetchRequest)
		if !ok {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() {
			defer func() { <-sem }()
			d := &wire.FetchData{ID: r.ID}
			var err error
			switch {
			case r.Model:
				d.Data, err = h.model(r)
			case h.Store == nil:
				err = errors.New("no expert store here")
			case r.Index:
				if d.Data = h.Store.IndexBytes(); d.Data == nil {
					err = errNotYet // (a Filling's)
				}
			default:
				var buf *[]byte
				if buf, err = h.chunk(ctx, r); err == nil {
					defer putBuffer(buf) // once sent (Send copies it into its frame)
					d.Data = *buf
				}
			}
			if err != nil {
				d.Data, d.Err = nil, err.Error()
			}
			if p.Send(ctx, d) == nil && !r.Index && r.File == "" { // a failed send ends the connection: Recv says so
				for _, c := range served {
					if c != nil {
						c.Add(int64(len(d.Data)))
					}
				}
			}
		})
	}
}

// ServeStreams answers every stream ln accepts with Serve from h, each
// on its own goroutine, until ctx ends or ln is closed, then waits for
// them. served counts every connection's chunk and tensor bytes; each
// peer is told to came, if set, as it connects, and to gone, if set, as
// its connection ends, with what it was sent and why (a node's logs and
// counts; ctx has ended where the node is stopping).
func ServeStreams(ctx context.Context, ln *wire.StreamListener, h Served, served *atomic.Int64, came func(wire.Identity), gone func(id wire.Identity, sent int64, err error)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		wg.Go(func() {
			defer p.Close()
			if came != nil {
				came(p.Identity())
			}
			var sent atomic.Int64 // this peer's (others fetch at the same time)
			err := Serve(ctx, p, h, &sent, served)
			if gone != nil {
				gone(p.Identity(), sent.Load(), err)
			}
		})
	}
}

// chunk is the store's chunk r asks for, in a buffer of getBuffer's.
func (h Served) chunk(ctx context.Context, r *wire.FetchRequest) (*[]byte, error) {
	ref := store.ChunkRef{Offset: r.Offset, Size: r.Size}
	if w, ok := h.Store.(interface{ waitIndex(context.Context) error }); ok {
		if err := w.waitIndex(ctx); err != nil { // a store still coming: its index first
			return nil, err
		}
	}
	if !h.Store.IsChunk(ref) { // (nothing is allocated for what is not a chunk)
		return nil, fmt.Errorf("no chunk of the store is %d bytes at %d", r.Size, r.Offset)
	}
	b := getBuffer(r.Size)
	if err := h.Store.ReadChunk(ctx, ref, *b); err != nil {
		putBuffer(b)
		return nil, err
	}
	// a share holds some chunks only: one it lacks (a hole), or has
	// damaged, is not passed on
	if err := h.Store.CheckChunk(ref, *b); err != nil {
		putBuffer(b)
		return nil, fmt.Errorf("the chunk at %d is not held here: %w", r.Offset, err)
	}
	return b, nil
}

// model is the piece of the checkpoint r asks for.
func (h Served) model(r *wire.FetchRequest) ([]byte, error) {
	switch {
	case h.Model == nil:
		return nil, errors.New("no model checkpoint here")
	case r.Index:
		return h.Model.Manifest()
	case r.File != "":
		return h.Model.File(r.File)
	default:
		return h.Model.Tensor(r.Tensor, r.Offset, r.Size)
	}
}
