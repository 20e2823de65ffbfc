package fetch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/odmoe/odmoe/store"
)

// DirSource is a store directory this node can read (a mounted share, a
// copy on another disk): its index and chunk files.
type DirSource struct{ Dir string }

func (d DirSource) Name() string { return d.Dir }

func (d DirSource) Index(context.Context) ([]byte, error) {
	return os.ReadFile(filepath.Join(d.Dir, store.IndexFile))
}

func (d DirSource) ReadChunk(_ context.Context, ref store.ChunkRef, dst []byte) error {
	f, err := os.Open(filepath.Join(d.Dir, store.ChunkFile))
	if err != nil {
		return err
	}
	defer f.Close()
	if n, err := f.ReadAt(dst[:ref.Size], ref.Offset); err != nil {
		return fmt.Errorf("chunk at %d: %d of %d bytes: %w", ref.Offset, n, ref.Size, err)
	}
	return nil
}
