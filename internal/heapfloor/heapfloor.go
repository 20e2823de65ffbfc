// Package heapfloor keeps a node's garbage collector from running every
// few megabytes of allocation.
//
// A node's Go heap is small: a worker's experts live in its arena, off
// the heap, and every node's weights are mapped or held outside it, so
// its live heap is 2-10 MB. The collector's goal is twice the live heap
// but never under 4 MB, so a fresh node collects after its first 1-2 MB
// of work: on the emulated rig every worker's first collection landed on
// the first prompt, all at once (their mark phases took 35-40% of the
// workers' CPU in the prompt's window). Floor counts n bytes the node
// never touches as live, so the goal starts at twice them: the collector
// runs after about n bytes of allocation instead, and a collection costs
// what it did (it does not scan them: they hold no pointers).
//
// The bytes are address space only: the runtime takes a fresh span from
// the OS already zeroed and never writes it, so they add nothing to the
// node's resident memory. That holds for memory the heap has not used
// before, which is why Floor takes effect once, at a node's start.
package heapfloor

import "sync"

// DefaultBytes is the floor the node roles set: a collection per ~16 MiB
// allocated (a worker's first requests allocate ~2 MB; on the small
// preset its decode ~80 KB a token), against a live heap of a few
// megabytes. Between collections the heap holds up to that much garbage
// more than it did, which a node's resident memory may show in a long
// run.
const DefaultBytes = 16 << 20

var (
	once sync.Once
	//lint:ignore U1000 held, never read: its bytes count as live while it is
	ballast []byte
)

// Floor makes the collector count n bytes more as live, for the rest of
// the process. Only the first call counts: call it at the start, before
// the heap has freed memory a later call's bytes could reuse (reused
// memory is zeroed, so resident).
func Floor(n int) {
	once.Do(func() {
		if n > 0 {
			ballast = make([]byte, n)
		}
	})
}
