package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

// IndexFile is the name of the shard index Hugging Face writes beside
// sharded checkpoints.
const IndexFile = "model.safetensors.index.json"

// Set is the tensors of one checkpoint, possibly spread over shards.
type Set struct {
	files  []*File
	byName map[string]*File
}

// Open opens a checkpoint: a .safetensors file, or a directory holding
// either model.safetensors.index.json and its shards, or .safetensors files
// (all of them are opened; a tensor name may appear only once).
func Open(path string) (*Set, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.IsDir() {
		return openFiles([]string{path}, nil)
	}
	idx := filepath.Join(path, IndexFile)
	if b, err := os.ReadFile(idx); err == nil {
		var index struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &index); err != nil {
			return nil, fmt.Errorf("safetensors: %s: bad index JSON: %w", idx, err)
		}
		if len(index.WeightMap) == 0 {
			return nil, fmt.Errorf("safetensors: %s: weight_map is empty", idx)
		}
		var shards []string
		for _, shard := range index.WeightMap {
			if filepath.Base(shard) != shard {
				return nil, fmt.Errorf("safetensors: %s: shard name %q must be a plain file name", idx, shard)
			}
			shards = append(shards, filepath.Join(path, shard))
		}
		sort.Strings(shards)
		return openFiles(slices.Compact(shards), index.WeightMap)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(path, "*.safetensors"))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("safetensors: %s: no *.safetensors file and no %s", path, IndexFile)
	}
	sort.Strings(files)
	return openFiles(files, nil)
}

// openFiles opens every file; weightMap, when given, must agree with the
// shards' headers.
func openFiles(paths []string, weightMap map[string]string) (*Set, error) {
	s := &Set{byName: map[string]*File{}}
	for _, p := range paths {
		f, err := OpenFile(p)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.files = append(s.files, f)
		for name := range f.infos {
			if other, dup := s.byName[name]; dup {
				s.Close()
				return nil, fmt.Errorf("safetensors: tensor %q is in both %s and %s", name, other.path, p)
			}
			s.byName[name] = f
		}
	}
	for name, shard := range weightMap {
		f, ok := s.byName[name]
		if !ok || filepath.Base(f.path) != shard {
			s.Close()
			return nil, fmt.Errorf("safetensors: index maps %q to %s but that shard does not hold it", name, shard)
		}
	}
	return s, nil
}

// Names returns every tensor name in sorted order.
func (s *Set) Names() []string {
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Info returns the header entry of name.
func (s *Set) Info(name string) (Info, bool) {
	f, ok := s.byName[name]
	if !ok {
		return Info{}, false
	}
	return f.Info(name)
}

// Tensor returns name; errors.Is(err, ErrNotFound) when absent.
func (s *Set) Tensor(name string) (Tensor, error) {
	f, ok := s.byName[name]
	if !ok {
		return Tensor{}, fmt.Errorf("safetensors: %q: %w", name, ErrNotFound)
	}
	return f.Tensor(name)
}

// TensorShape returns name after checking that its shape is exactly shape.
func (s *Set) TensorShape(name string, shape ...int) (Tensor, error) {
	t, err := s.Tensor(name)
	if err != nil {
		return Tensor{}, err
	}
	if !slices.Equal(t.Shape, shape) {
		return Tensor{}, fmt.Errorf("safetensors: %q has shape %v, want %v", name, t.Shape, shape)
	}
	return t, nil
}

// Raw returns the bytes of name, a tensor of any dtype, after checking
// that its dtype (as the file spells it) and shape are exactly these: the
// parts of a format kernels reads as a whole (MXFP4's U8 blocks and
// scales).
func (s *Set) Raw(name, dtype string, shape ...int) ([]byte, error) {
	f, ok := s.byName[name]
	if !ok {
		return nil, fmt.Errorf("safetensors: %q: %w", name, ErrNotFound)
	}
	info, _ := f.Info(name)
	if info.DType != dtype || !slices.Equal(info.Shape, shape) {
		return nil, fmt.Errorf("safetensors: %q is %s%v, want %s%v", name, info.DType, info.Shape, dtype, shape)
	}
	lo, hi := f.dataOff+info.Begin, f.dataOff+info.End
	return f.data[lo:hi:hi], nil
}

// Bytes returns the total data bytes of the named tensors.
func (s *Set) Bytes(names ...string) int64 {
	var n int64
	for _, name := range names {
		if i, ok := s.Info(name); ok {
			n += i.End - i.Begin
		}
	}
	return n
}

// ReadInto fills dst with the bytes of src, a piece of one of the set's
// mappings (a Tensor's Data, or part of it), reading them from its file:
// nothing of src is mapped in (a copy of a weight that does not leave
// the file's pages in the process's resident set).
func (s *Set) ReadInto(dst, src []byte) error {
	if len(dst) != len(src) {
		return fmt.Errorf("safetensors: reading %d bytes into %d", len(src), len(dst))
	}
	if len(src) == 0 {
		return nil
	}
	for _, f := range s.files {
		if off, ok := f.offsetOf(src); ok {
			return f.readAt(dst, off)
		}
	}
	return fmt.Errorf("safetensors: %d bytes that are none of the checkpoint's", len(src))
}

// Close unmaps every shard.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	s.files, s.byName = nil, nil
	return errors.Join(errs...)
}
