package worker

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// ErrOverBudget is returned (wrapped) when an allocation would take the
// worker past its device-memory budget. The worker refuses the load and
// reports it; it never exceeds the budget.
var ErrOverBudget = errors.New("device memory budget exceeded")

// arenaAlign keeps every block aligned for vector loads (and, on a GPU
// backend, for coalesced access).
const arenaAlign = 256

// Arena is the accounting allocator over a worker's device memory: one
// contiguous region of Budget bytes handed out as aligned blocks (first
// fit, adjacent free blocks merge). The CPU backend backs it with one
// anonymous memory mapping off the Go heap, so a worker's resident memory
// is what it touched of its budget plus the process's own; a CUDA backend
// keeps the same bookkeeping over one cudaMalloc'd region, so offsets,
// not pointers, are what it tracks. Close it when done.
type Arena struct {
	mu     sync.Mutex
	mem    []byte
	unmap  func() error
	free   []span // sorted by offset, non-adjacent
	inUse  int64
	peak   int64
	blocks map[int64]int64 // offset -> size of live blocks
}

type span struct{ off, size int64 }

// NewArena returns an arena of budget bytes. Host pages are only touched
// (and so only count against the process's resident memory) when used.
func NewArena(budget int64) (*Arena, error) {
	if budget <= 0 {
		return nil, fmt.Errorf("worker: device memory budget must be positive, got %d", budget)
	}
	mem, unmap, err := mapArena(budget)
	if err != nil {
		return nil, err
	}
	return newArenaOver(mem, unmap), nil
}

// newArenaOver is an arena over mem, which release gives back on Close:
// the CUDA device's page-locked mirror of its device memory, say.
func newArenaOver(mem []byte, release func() error) *Arena {
	return &Arena{mem: mem, unmap: release, free: []span{{0, int64(len(mem))}}, blocks: map[int64]int64{}}
}

// Offset is where b starts in the arena.
func (b Block) Offset() int64 { return b.off }

// Close gives the arena's memory back. No block may be used after: the
// worker closes it once its engine has stopped.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unmap == nil {
		return nil
	}
	err := a.unmap()
	a.unmap, a.mem, a.free = nil, nil, nil
	return err
}

// Budget is the arena's size.
func (a *Arena) Budget() int64 { return int64(len(a.mem)) }

// InUse is the bytes in live blocks (rounded up to the alignment).
func (a *Arena) InUse() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inUse
}

// Peak is the largest InUse seen since the arena was made.
func (a *Arena) Peak() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.peak
}

// Block is an allocation; Bytes aliases the arena.
type Block struct {
	Bytes []byte
	off   int64
}

// Alloc reserves n bytes, or fails with ErrOverBudget saying how much is
// free and in what largest piece.
func (a *Arena) Alloc(n int64) (Block, error) {
	if n <= 0 {
		return Block{}, fmt.Errorf("worker: allocation of %d bytes", n)
	}
	size := (n + arenaAlign - 1) / arenaAlign * arenaAlign
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.free {
		if s.size < size {
			continue
		}
		if s.size == size {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + size, s.size - size}
		}
		a.blocks[s.off] = size
		a.inUse += size
		a.peak = max(a.peak, a.inUse)
		return Block{Bytes: a.mem[s.off : s.off+n : s.off+n], off: s.off}, nil
	}
	var largest int64
	for _, s := range a.free {
		largest = max(largest, s.size)
	}
	return Block{}, fmt.Errorf("worker: %d bytes requested, %d of %d free (largest piece %d): %w",
		n, int64(len(a.mem))-a.inUse, len(a.mem), largest, ErrOverBudget)
}

// Free returns b to the arena. Freeing a block twice is a bug and panics.
func (a *Arena) Free(b Block) {
	a.mu.Lock()
	defer a.mu.Unlock()
	size, ok := a.blocks[b.off]
	if !ok || b.Bytes == nil {
		panic(fmt.Sprintf("worker: free of unknown block at offset %d", b.off))
	}
	delete(a.blocks, b.off)
	a.inUse -= size
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > b.off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{b.off, size}
	// merge with the next, then the previous neighbour
	if i+1 < len(a.free) && a.free[i].off+a.free[i].size == a.free[i+1].off {
		a.free[i].size += a.free[i+1].size
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].size == a.free[i].off {
		a.free[i-1].size += a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}
