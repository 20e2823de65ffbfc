package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Spec declares one tensor to write.
type Spec struct {
	Name  string
	DType string // "BF16", "F16", "F32", ...
	Shape []int
}

// Write streams a safetensors file to path: fill is called once per spec,
// in order, with a buffer of exactly the tensor's byte size to fill, so a
// large checkpoint never has to sit in memory whole. The file appears
// atomically (written to a temporary name, then renamed).
func Write(path string, specs []Spec, metadata map[string]string, fill func(i int, buf []byte) error) error {
	hjson, sizes, err := header(specs, metadata)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	w := bufio.NewWriterSize(tmp, 1<<20)
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(len(hjson)))
	w.Write(lenBuf[:])
	w.Write(hjson)
	var buf []byte
	for i, sp := range specs {
		if int64(cap(buf)) < sizes[i] {
			buf = make([]byte, sizes[i])
		}
		b := buf[:sizes[i]]
		clear(b)
		if err := fill(i, b); err != nil {
			tmp.Close()
			return fmt.Errorf("safetensors: filling %s: %w", sp.Name, err)
		}
		if _, err := w.Write(b); err != nil {
			tmp.Close()
			return fmt.Errorf("safetensors: %w", err)
		}
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// header is the safetensors header of specs (its JSON, padded so the
// data begin 8-byte aligned, as the reference writer does) and each
// tensor's byte size.
func header(specs []Spec, metadata map[string]string) ([]byte, []int64, error) {
	h := map[string]any{}
	if len(metadata) > 0 {
		h["__metadata__"] = metadata
	}
	var off int64
	sizes := make([]int64, len(specs))
	for i, sp := range specs {
		es := dtypeSize(sp.DType)
		if es == 0 {
			return nil, nil, fmt.Errorf("safetensors: %s: unknown dtype %q", sp.Name, sp.DType)
		}
		if _, dup := h[sp.Name]; dup {
			return nil, nil, fmt.Errorf("safetensors: tensor %q declared twice", sp.Name)
		}
		sizes[i] = int64(elements(sp.Shape)) * int64(es)
		h[sp.Name] = headerEntry{DType: sp.DType, Shape: sp.Shape, DataOffsets: []int64{off, off + sizes[i]}}
		off += sizes[i]
	}
	hjson, err := json.Marshal(h)
	if err != nil {
		return nil, nil, fmt.Errorf("safetensors: %w", err)
	}
	for (8+len(hjson))%8 != 0 {
		hjson = append(hjson, ' ')
	}
	return hjson, sizes, nil
}

// Layout is where Write would put specs: the file's first bytes (the
// header's length and the header), each tensor's offset in the file,
// and the file's size. A writer that fills tensors out of order (a node
// fetching a checkpoint piece by piece) writes the prefix, then each
// tensor's bytes at its offset.
func Layout(specs []Spec, metadata map[string]string) (prefix []byte, offsets []int64, size int64, err error) {
	hjson, sizes, err := header(specs, metadata)
	if err != nil {
		return nil, nil, 0, err
	}
	prefix = binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(hjson)), uint64(len(hjson)))
	prefix = append(prefix, hjson...)
	size = int64(len(prefix))
	offsets = make([]int64, len(specs))
	for i, n := range sizes {
		offsets[i] = size
		size += n
	}
	return prefix, offsets, size, nil
}

// WriteShapes writes a safetensors file of specs whose data are never
// written: the header, then the file extended to its full size, a
// sparse file whose tensors read as zeros and take no disk. It is a
// checkpoint's shape (odmoe plan binds a model to it to count what each
// node would hold) without its weights.
func WriteShapes(path string, specs []Spec, metadata map[string]string) error {
	prefix, _, size, err := Layout(specs, metadata)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	if _, err := f.Write(prefix); err != nil {
		f.Close()
		return fmt.Errorf("safetensors: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("safetensors: a sparse file of %d bytes: %w", size, err)
	}
	return f.Close()
}
