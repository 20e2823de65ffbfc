package store

import (
	"context"
	"fmt"
)

// Chunk is one chunk of the chunk file and the CRC-32C its bytes must
// have.
type Chunk struct {
	Ref ChunkRef
	CRC uint32
}

// Check reports whether data (the chunk's bytes) has the chunk's CRC.
func (c Chunk) Check(data []byte) error {
	if len(data) != c.Ref.Size {
		return fmt.Errorf("chunk at %d: %d bytes, the index says %d: %w", c.Ref.Offset, len(data), c.Ref.Size, ErrCorrupt)
	}
	if got := crc(data); got != c.CRC {
		return fmt.Errorf("chunk at %d (%d bytes): CRC-32C %08x, the index says %08x: %w", c.Ref.Offset, c.Ref.Size, got, c.CRC, ErrChecksum)
	}
	return nil
}

// ExpertChunks lists the chunks expert (layer, expert) is stored in,
// every tensor's shards' exponent and sign-mantissa chunks, in the chunk
// file's order: a node that serves or fetches a share of the store
// handles these.
func (s *Store) ExpertChunks(layer, expert int) ([]Chunk, error) {
	var out []Chunk
	for _, k := range s.ix.form.kinds() {
		t, err := s.ix.find(layer, expert, k)
		if err != nil {
			return nil, err
		}
		for _, e := range t.shards {
			out = append(out, Chunk{e.exp, e.expCRC}, Chunk{e.sm, e.smCRC})
		}
	}
	return out, nil
}

// ChunkFileSize is the chunk file's size in bytes, its header included.
func (s *Store) ChunkFileSize() int64 { return s.ix.chunkBytes }

// ChunkFileHeader is the chunk file's first bytes (its magic, format
// version and the model's identity), which a node writing the file
// chunk by chunk writes first.
func (s *Store) ChunkFileHeader() []byte { return chunkHeader(s.ix.identity, s.ix.version) }

// ReadChunk fills dst (len(dst) == ref.Size) with the chunk file's bytes
// at ref, unchecked, from the store's source: what a node serving its
// store to a peer sends (the peer checks each chunk against its index).
// A ref outside the chunk file is refused.
func (s *Store) ReadChunk(ctx context.Context, ref ChunkRef, dst []byte) error {
	if !within(ref, s.ix.chunkBytes) || len(dst) != ref.Size {
		return fmt.Errorf("store: %d bytes at %d, outside the %d-byte chunk file: %w", ref.Size, ref.Offset, s.ix.chunkBytes, ErrCorrupt)
	}
	return s.src.ReadChunk(ctx, ref, dst)
}

// IsChunk reports whether ref is one of the store's chunks (its place
// and size).
func (s *Store) IsChunk(ref ChunkRef) bool {
	_, ok := s.chunkCRCs()[ref]
	return ok
}

// chunkCRCs are each chunk's CRC by place and size (an empty chunk
// starts where the next does), made on first use.
func (s *Store) chunkCRCs() map[ChunkRef]uint32 {
	s.crcsOnce.Do(func() {
		s.crcs = map[ChunkRef]uint32{}
		for i := range s.ix.tensors {
			for _, e := range s.ix.tensors[i].shards {
				s.crcs[e.exp], s.crcs[e.sm] = e.expCRC, e.smCRC
			}
		}
	})
	return s.crcs
}

// CheckChunk checks data, read at ref, against the CRC the index gives
// the chunk there: a node serving a share of the store answers only
// with chunks it holds (a hole in its chunk file fails).
func (s *Store) CheckChunk(ref ChunkRef, data []byte) error {
	crc, ok := s.chunkCRCs()[ref]
	if !ok {
		return fmt.Errorf("no chunk of the index is %d bytes at %d: %w", ref.Size, ref.Offset, ErrCorrupt)
	}
	return Chunk{Ref: ref, CRC: crc}.Check(data)
}
