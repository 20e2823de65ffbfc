//go:build !unix

package safetensors

import (
	"io"
	"os"
)

// mapFile reads the file into memory on platforms without mmap support in
// the standard library.
func mapFile(f *os.File, size int64) ([]byte, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, err
	}
	return data, nil
}

func unmap([]byte) error { return nil }
