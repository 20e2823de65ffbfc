//go:build !unix

package worker

// mapArena allocates the arena on the Go heap where there is no mmap.
func mapArena(n int64) ([]byte, func() error, error) {
	return make([]byte, n), func() error { return nil }, nil
}
