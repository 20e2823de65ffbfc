package fetch

import (
	"math/bits"
	"sync"
)

// chunkBuffers are buffers for chunks on their way through a node (read
// to be served, fetched to be written), by size class (powers of two):
// a fill moves its whole share through them, and a fresh buffer a chunk
// cost a rig's nodes a fifth of their CPU in zeroing, allocation and
// collection.
var chunkBuffers [40]sync.Pool

// getBuffer is a buffer of n bytes (its contents undefined); putBuffer
// gives it back once nothing refers to it.
func getBuffer(n int) *[]byte {
	class := bits.Len(uint(max(n, 1) - 1))
	if b, ok := chunkBuffers[class].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<class)
	return &b
}

func putBuffer(b *[]byte) {
	class := bits.Len(uint(cap(*b) - 1))
	if cap(*b) != 1<<class || class >= len(chunkBuffers) {
		return // not one of getBuffer's
	}
	chunkBuffers[class].Put(b)
}
