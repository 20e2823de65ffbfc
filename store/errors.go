package store

import (
	"errors"
	"fmt"
)

// Errors a caller may need to tell apart (errors.Is). Every error from
// reading a tensor is a *TensorError naming the layer, expert and tensor;
// store-wide problems found by Open name the store directory.
var (
	// ErrChecksum: a chunk's bytes do not match its CRC-32C, or decoded
	// bytes do not match the original's (Options.VerifyDecoded).
	ErrChecksum = errors.New("checksum mismatch")
	// ErrTruncated: the chunk file ends before a chunk the index names.
	ErrTruncated = errors.New("store truncated")
	// ErrVersion: the store was written in a format version this build
	// does not read.
	ErrVersion = errors.New("unsupported store format version")
	// ErrModelMismatch: the store was built from another model than the
	// one the caller serves.
	ErrModelMismatch = errors.New("store built from another model")
	// ErrCorrupt: the index or a chunk is malformed in a way no checksum
	// caught (or the index checksum itself failed).
	ErrCorrupt = errors.New("store corrupt")
	// ErrNotFound: no such layer or expert in the store.
	ErrNotFound = errors.New("no such expert")
	// ErrExist: Convert's output directory exists and -force was not given.
	ErrExist = errors.New("output exists")
)

// TensorError is a failure reading one tensor of one expert. Shard and
// Part say which chunk, when the failure is about one chunk (Shard -1
// otherwise).
type TensorError struct {
	Layer, Expert int
	Kind          Kind
	Shard         int
	Part          string // "exponent", "sign-mantissa", "decoded" or ""
	Err           error
}

func (e *TensorError) Error() string {
	s := fmt.Sprintf("store: layer %d expert %d %s", e.Layer, e.Expert, e.Kind)
	if e.Shard >= 0 {
		s += fmt.Sprintf(" shard %d", e.Shard)
	}
	if e.Part != "" {
		s += " " + e.Part + " chunk"
	}
	return s + ": " + e.Err.Error()
}

func (e *TensorError) Unwrap() error { return e.Err }
