package fetch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/odmoe/odmoe/store"
)

// holdWait bounds how long a node serving its directory while it fills
// it holds a request for a chunk the fill will bring before answering
// that it does not hold it (the asker then asks its next source): under
// a stream's idle timeout and a filling worker's bound on a chunk.
var holdWait = 20 * time.Second

// arrivals are the chunks a fill in progress will write, so that a node
// serving its directory as it fills (the shadow relaying the store to the
// workers, a worker the chunks it owns to the others holding them) answers a request for one of them once
// it is written, rather than refusing it and sending the asker to the
// main node for bytes already on their way here.
type arrivals struct {
	mu     sync.Mutex
	coming map[store.ChunkRef]chan struct{} // each closed as its chunk is written
}

// expect says the chunks of refs will be written.
func (a *arrivals) expect(refs []store.ChunkRef) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.coming == nil {
		a.coming = map[store.ChunkRef]chan struct{}{}
	}
	for _, r := range refs {
		if _, ok := a.coming[r]; !ok {
			a.coming[r] = make(chan struct{})
		}
	}
}

// arrived says the chunk at ref is written (or was there already).
func (a *arrivals) arrived(ref store.ChunkRef) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ch, ok := a.coming[ref]; ok {
		close(ch)
		delete(a.coming, ref)
	}
}

// ended says the fill is over: what it did not write is not coming.
func (a *arrivals) ended() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for r, ch := range a.coming {
		close(ch)
		delete(a.coming, r)
	}
}

// wait returns once the chunk at ref is written, at once where it is not
// coming, or after holdWait or ctx's end, whichever is first.
func (a *arrivals) wait(ctx context.Context, ref store.ChunkRef) {
	a.mu.Lock()
	ch := a.coming[ref]
	a.mu.Unlock()
	if ch == nil {
		return
	}
	t := time.NewTimer(holdWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
}

// readHeld fills dst with the chunk at ref from f where its bytes pass
// check, waiting for it (a.wait) where the fill will bring it: what a
// node serves of its directory as it fills it.
func (a *arrivals) readHeld(ctx context.Context, f *os.File, ref store.ChunkRef, dst []byte, check func([]byte) error) error {
	if alreadyThere(f, dst, ref.Offset, check) {
		return nil
	}
	a.wait(ctx, ref)
	if _, err := f.ReadAt(dst, ref.Offset); err != nil {
		return err
	}
	return check(dst)
}

// Filling is a store directory that Share fills (Options.Filling), served
// to other nodes while it fills: a Holder whose index is the one Share
// fetched, a chunk of the share it holds served at once, one it will hold
// once Share has written it (up to holdWait), any other refused. A
// shadow fetching its experts relays them so to the workers, which then
// need not take them all from the main node. Close it after Share.
type Filling struct {
	arrivals
	begun chan struct{} // closed once Share has the index and the directory, or failed
	mu    sync.Mutex
	st    *store.Store // the index alone
	f     *os.File     // the chunk file, read only
	err   error        // why there is no index, once begun
}

// NewFilling is a directory Share has yet to begin filling.
func NewFilling() *Filling { return &Filling{begun: make(chan struct{})} }

// begin is called by Share once dir holds index, with the chunks it will
// fetch or keep (refs); Open calls it too, after a fill that failed.
// Like fail, arrived and ended, it does nothing on a nil Filling (Share
// without one).
func (f *Filling) begin(dir string, index []byte, refs []store.ChunkRef) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st != nil {
		return nil // (begun already)
	}
	f.expect(refs)
	st, err := store.New(index, noChunks{}, store.Options{})
	if err == nil {
		if f.f, err = os.Open(filepath.Join(dir, store.ChunkFile)); err != nil {
			st.Close()
		} else {
			noReadahead(f.f)
			f.st = st
		}
	}
	f.err = err
	f.markBegun()
	return err
}

// fail says the fill ended before it had the index, with err (requests
// are refused with it, until an Open).
func (f *Filling) fail(err error) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st == nil {
		f.err = err
		f.markBegun()
	}
}

// markBegun closes begun once. Call with mu held.
func (f *Filling) markBegun() {
	select {
	case <-f.begun:
	default:
		close(f.begun)
	}
}

func (f *Filling) arrived(ref store.ChunkRef) {
	if f != nil {
		f.arrivals.arrived(ref)
	}
}

func (f *Filling) ended() {
	if f != nil {
		f.arrivals.ended()
	}
}

// Open serves the store in dir as it is, with no fill to come (a node
// that holds its store, or found no source to fill it from).
func (f *Filling) Open(dir string) error {
	index, err := os.ReadFile(filepath.Join(dir, store.IndexFile))
	if err != nil {
		f.fail(err)
		return fmt.Errorf("fetch: %w", err)
	}
	return f.begin(dir, index, nil)
}

// index is the parsed index and the chunk file, waiting for Share to
// have them (up to holdWait or ctx's end).
func (f *Filling) index(ctx context.Context) (*store.Store, *os.File, error) {
	t := time.NewTimer(holdWait)
	defer t.Stop()
	select {
	case <-f.begun:
	case <-t.C:
		return nil, nil, errNotYet
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.st == nil {
		return nil, nil, fmt.Errorf("no store here: %w", f.err)
	}
	return f.st, f.f, nil
}

// errNotYet is a Filling's answer before its fill has the index.
var errNotYet = errors.New("the store is not here yet: its index is still coming")

// IndexBytes is the index, nil before Share has it.
func (f *Filling) IndexBytes() []byte {
	if st := f.parsed(); st != nil {
		return st.IndexBytes()
	}
	return nil
}

// IsChunk reports whether ref is a chunk of the index (false before
// Share has it: waitIndex waits for that first).
func (f *Filling) IsChunk(ref store.ChunkRef) bool {
	st := f.parsed()
	return st != nil && st.IsChunk(ref)
}

// CheckChunk checks data against the index's CRC for ref.
func (f *Filling) CheckChunk(ref store.ChunkRef, data []byte) error {
	st := f.parsed()
	if st == nil {
		return errNotYet
	}
	return st.CheckChunk(ref, data)
}

// ReadChunk reads the chunk at ref, waiting for it where Share will
// write it.
func (f *Filling) ReadChunk(ctx context.Context, ref store.ChunkRef, dst []byte) error {
	st, file, err := f.index(ctx)
	if err != nil {
		return err
	}
	return f.readHeld(ctx, file, ref, dst[:ref.Size], func(b []byte) error { return st.CheckChunk(ref, b) })
}

// waitIndex holds a request until Share has the index (Served.chunk asks
// before it checks the request against it), and says why not where it
// does not.
func (f *Filling) waitIndex(ctx context.Context) error {
	_, _, err := f.index(ctx)
	return err
}

// parsed is the index once begun, or nil.
func (f *Filling) parsed() *store.Store {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// Close closes the chunk file; a Filling never begun says so to anyone
// still waiting.
func (f *Filling) Close() error {
	f.fail(errors.New("closed before its fill began"))
	f.ended()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f != nil {
		return f.f.Close()
	}
	return nil
}
