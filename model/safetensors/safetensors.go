// Package safetensors reads and writes Hugging Face safetensors files: a
// single file or a sharded set described by model.safetensors.index.json.
// Files are memory-mapped; a Tensor's Data aliases the mapping, so nothing
// is copied and the bytes stay valid until the File or Set is closed.
//
// It owns the container format only; what the tensors mean is the model
// package's business.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"unsafe"

	"github.com/odmoe/odmoe/kernels"
)

// maxHeaderBytes bounds the JSON header; the format's reference
// implementation uses the same 100 MB limit.
const maxHeaderBytes = 100 << 20

// ErrNotFound is returned (wrapped) when a tensor name is absent.
var ErrNotFound = errors.New("tensor not found")

// Info describes one tensor as the header declares it.
type Info struct {
	Name  string
	DType string // as spelled in the file: "BF16", "F16", "F32", "I64", ...
	Shape []int
	// Begin and End are byte offsets of the data relative to the start of
	// the data section.
	Begin, End int64
}

// Tensor is a tensor whose dtype odmoe computes with. Data aliases the
// file mapping.
type Tensor struct {
	Name  string
	DType kernels.DType
	Shape []int
	Data  []byte
}

// Elements returns the number of elements the shape describes.
func (t Tensor) Elements() int { return elements(t.Shape) }

// Matrix views a 2-D tensor as a kernels.Matrix; a 1-D tensor is one row.
func (t Tensor) Matrix() (kernels.Matrix, error) {
	switch len(t.Shape) {
	case 1:
		return kernels.Matrix{DType: t.DType, Rows: 1, Cols: t.Shape[0], Data: t.Data}, nil
	case 2:
		return kernels.Matrix{DType: t.DType, Rows: t.Shape[0], Cols: t.Shape[1], Data: t.Data}, nil
	}
	return kernels.Matrix{}, fmt.Errorf("safetensors: %s: shape %v is not a matrix", t.Name, t.Shape)
}

func elements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// File is one memory-mapped safetensors file.
type File struct {
	path     string
	data     []byte   // the whole mapping
	reader   *os.File // the file mapped, open until Close (readAt)
	dataOff  int64    // start of the data section
	infos    map[string]Info
	metadata map[string]string
}

type headerEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// OpenFile maps path and validates its header: every tensor's byte range
// must lie inside the file and match its dtype and shape.
func OpenFile(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	size := st.Size()
	if size < 8 {
		f.Close()
		return nil, fmt.Errorf("safetensors: %s: file of %d bytes is too short for the 8-byte header length", path, size)
	}
	data, err := mapFile(f, size)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	file, err := parse(path, data)
	if err != nil {
		unmap(data)
		f.Close()
		return nil, err
	}
	file.reader = f // the file mapped, for ReadInto: not one put at its path since
	return file, nil
}

func parse(path string, data []byte) (*File, error) {
	size := int64(len(data))
	hlen := binary.LittleEndian.Uint64(data[:8])
	if hlen > maxHeaderBytes || int64(hlen) > size-8 {
		return nil, fmt.Errorf("safetensors: %s: header length %d exceeds the file (%d bytes) or the %d-byte limit", path, hlen, size, maxHeaderBytes)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+hlen], &raw); err != nil {
		return nil, fmt.Errorf("safetensors: %s: bad header JSON: %w", path, err)
	}
	file := &File{path: path, data: data, dataOff: 8 + int64(hlen), infos: make(map[string]Info, len(raw))}
	dataLen := size - file.dataOff
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &file.metadata); err != nil {
				return nil, fmt.Errorf("safetensors: %s: bad __metadata__: %w", path, err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: bad header entry: %w", path, name, err)
		}
		if len(e.DataOffsets) != 2 {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: data_offsets has %d values, want 2", path, name, len(e.DataOffsets))
		}
		begin, end := e.DataOffsets[0], e.DataOffsets[1]
		if begin < 0 || end < begin || end > dataLen {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: data_offsets [%d, %d] outside the %d data bytes (truncated file?)", path, name, begin, end, dataLen)
		}
		for _, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("safetensors: %s: tensor %q: negative dimension in shape %v", path, name, e.Shape)
			}
		}
		if es := dtypeSize(e.DType); es > 0 && int64(elements(e.Shape))*int64(es) != end-begin {
			return nil, fmt.Errorf("safetensors: %s: tensor %q: %s%v needs %d bytes but data_offsets give %d", path, name, e.DType, e.Shape, int64(elements(e.Shape))*int64(es), end-begin)
		}
		file.infos[name] = Info{Name: name, DType: e.DType, Shape: e.Shape, Begin: begin, End: end}
	}
	return file, nil
}

// dtypeSize returns the element size of a safetensors dtype, 0 if unknown.
func dtypeSize(dt string) int {
	switch dt {
	case "F64", "I64", "U64":
		return 8
	case "F32", "I32", "U32":
		return 4
	case "F16", "BF16", "I16", "U16":
		return 2
	case "I8", "U8", "BOOL", "F8_E4M3", "F8_E5M2":
		return 1
	}
	return 0
}

// Path returns the file's path.
func (f *File) Path() string { return f.path }

// Metadata returns the header's __metadata__ map (may be nil).
func (f *File) Metadata() map[string]string { return f.metadata }

// Names returns the tensor names in sorted order.
func (f *File) Names() []string {
	names := make([]string, 0, len(f.infos))
	for n := range f.infos {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Info returns the header entry of name.
func (f *File) Info(name string) (Info, bool) {
	i, ok := f.infos[name]
	return i, ok
}

// Tensor returns name with its data aliasing the mapping.
func (f *File) Tensor(name string) (Tensor, error) {
	info, ok := f.infos[name]
	if !ok {
		return Tensor{}, fmt.Errorf("safetensors: %s: %q: %w", f.path, name, ErrNotFound)
	}
	dt, err := kernels.ParseDType(info.DType)
	if err != nil {
		return Tensor{}, fmt.Errorf("safetensors: %s: tensor %q: %w", f.path, name, err)
	}
	lo, hi := f.dataOff+info.Begin, f.dataOff+info.End
	return Tensor{Name: name, DType: dt, Shape: slices.Clone(info.Shape), Data: f.data[lo:hi:hi]}, nil
}

// offsetOf is where in the file b, a piece of its mapping, lies.
func (f *File) offsetOf(b []byte) (int64, bool) {
	if len(f.data) == 0 || len(b) == 0 {
		return 0, false
	}
	base, p := uintptr(unsafe.Pointer(unsafe.SliceData(f.data))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(f.data)) {
		return 0, false
	}
	return int64(p - base), true
}

// readAt reads len(dst) bytes of the file at off.
func (f *File) readAt(dst []byte, off int64) error {
	if f.reader == nil {
		return fmt.Errorf("safetensors: %s: not opened for reading", f.path)
	}
	if _, err := f.reader.ReadAt(dst, off); err != nil {
		return fmt.Errorf("safetensors: %s: %d bytes at %d: %w", f.path, len(dst), off, err)
	}
	return nil
}

// Close unmaps the file; Tensors obtained from it must not be used after.
func (f *File) Close() error {
	d := f.data
	f.data = nil
	var err error
	if f.reader != nil {
		err, f.reader = f.reader.Close(), nil
	}
	return errors.Join(unmap(d), err)
}
