// Package anonmem hands out anonymous memory of the process's own,
// outside the Go heap (which would count it in its GC goal), in regions
// aligned to 2 MiB with transparent huge pages asked for: what a model's
// weights are copied into (model.WeightsInMemory). A file mapping streams
// as fast only where the page cache holds the file in large folios: on
// the Zen 4 VM of docs/benchmarks/2026-11-29.md, local decode of the
// small preset from a file the page cache had read 4 KiB at a time ran
// 47 tok/s at one thread and 66 at two, from a copy here 60 and 72; from
// a file read in order, 59 and 70 mapped, 59 and 72 copied.
package anonmem

import (
	"errors"
	"unsafe"
)

// align is the alignment of each region: a huge page.
const align = 2 << 20

// chunk is the size of the regions allocations are packed into; one of
// more than chunk/2 gets a region of its own. Large regions keep a big
// model's weights in few mappings (vm.max_map_count is ~65,000).
const chunk = 256 << 20

// Arena hands out memory until Close. It is not safe for concurrent use.
type Arena struct {
	regions [][]byte // the regions mapped, for Close
	free    []byte   // the rest of the current region
	held    int64
	closed  bool
}

// ErrClosed is returned by Alloc after Close.
var ErrClosed = errors.New("anonmem: arena closed")

// Alloc returns n bytes of the arena (64-byte aligned; at a huge page's
// boundary where n is more than half a region), zero, valid until Close.
func (a *Arena) Alloc(n int) ([]byte, error) {
	if a.closed {
		return nil, ErrClosed
	}
	if n == 0 {
		return []byte{}, nil
	}
	var dst []byte
	if n > chunk/2 {
		r, err := a.region(n)
		if err != nil {
			return nil, err
		}
		dst = r[:n:n]
	} else {
		pad := (64 - int(addr(a.free))%64) % 64
		if len(a.free) < pad+n {
			r, err := a.region(chunk)
			if err != nil {
				return nil, err
			}
			a.free, pad = r, 0
		}
		dst = a.free[pad : pad+n : pad+n]
		a.free = a.free[pad+n:]
	}
	a.held += int64(n)
	return dst, nil
}

// Held is the bytes allocated.
func (a *Arena) Held() int64 { return a.held }

// region maps an aligned region of at least n bytes.
func (a *Arena) region(n int) ([]byte, error) {
	r, err := mapAligned(n)
	if err != nil {
		return nil, err
	}
	a.regions = append(a.regions, r)
	return r, nil
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Close unmaps every region: nothing Alloc returned may be used after.
func (a *Arena) Close() error {
	var errs []error
	for _, r := range a.regions {
		errs = append(errs, unmap(r))
	}
	a.regions, a.free, a.held, a.closed = nil, nil, 0, true
	return errors.Join(errs...)
}
