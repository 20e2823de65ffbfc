package worker

import (
	"fmt"
	"sync"
)

// ArenaChunks lends a store.ChunkCache (the compressed host tier) memory
// from an Arena of its own, off the Go heap, as the host cache's is. Close
// it once the cache and its store are closed.
type ArenaChunks struct {
	arena *Arena

	mu     sync.Mutex
	blocks map[*byte]Block // by first byte: what Free gets back
}

// NewArenaChunks returns chunk memory of budget bytes.
func NewArenaChunks(budget int64) (*ArenaChunks, error) {
	a, err := NewArena(budget)
	if err != nil {
		return nil, err
	}
	return &ArenaChunks{arena: a, blocks: map[*byte]Block{}}, nil
}

// Alloc implements store.ChunkMemory.
func (m *ArenaChunks) Alloc(n int) ([]byte, error) {
	b, err := m.arena.Alloc(int64(n))
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.blocks[&b.Bytes[0]] = b
	m.mu.Unlock()
	return b.Bytes, nil
}

// Free implements store.ChunkMemory.
func (m *ArenaChunks) Free(p []byte) {
	m.mu.Lock()
	b, ok := m.blocks[&p[0]]
	delete(m.blocks, &p[0])
	m.mu.Unlock()
	if !ok {
		panic(fmt.Sprintf("worker: free of chunk memory this arena did not lend (%d bytes)", len(p)))
	}
	m.arena.Free(b)
}

// InUse is the bytes lent out.
func (m *ArenaChunks) InUse() int64 { return m.arena.InUse() }

// Close gives the memory back; nothing may use it after.
func (m *ArenaChunks) Close() error { return m.arena.Close() }
