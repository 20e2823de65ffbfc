//go:build cuda

package cuda

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// result is a CUresult.
type result uint32

// driver holds the CUDA driver entry points this package calls, bound
// from libcuda.so.1 by name (the _v2 names are the ones cuda.h maps the
// plain names to since CUDA 4).
var driver struct {
	cuInit                    func(flags uint32) result
	cuDeviceGetCount          func(n unsafe.Pointer) result
	cuDeviceGet               func(dev unsafe.Pointer, ordinal int32) result
	cuDeviceGetName           func(name unsafe.Pointer, n int32, dev int32) result
	cuDeviceGetAttribute      func(v unsafe.Pointer, attr int32, dev int32) result
	cuDevicePrimaryCtxRetain  func(ctx unsafe.Pointer, dev int32) result
	cuDevicePrimaryCtxRelease func(dev int32) result
	cuCtxSetCurrent           func(ctx uintptr) result
	cuMemGetInfo              func(free, total unsafe.Pointer) result
	cuMemAlloc                func(ptr unsafe.Pointer, bytes uint64) result
	cuMemFree                 func(ptr uint64) result
	cuMemHostAlloc            func(p unsafe.Pointer, bytes uint64, flags uint32) result
	cuMemFreeHost             func(p uintptr) result
	cuMemcpyHtoDAsync         func(dst uint64, src unsafe.Pointer, bytes uint64, stream uintptr) result
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src uint64, bytes uint64, stream uintptr) result
	cuMemsetD8                func(dst uint64, v uint8, n uint64) result
	cuStreamCreate            func(s unsafe.Pointer, flags uint32) result
	cuStreamDestroy           func(s uintptr) result
	cuStreamSynchronize       func(s uintptr) result
	cuEventCreate             func(e unsafe.Pointer, flags uint32) result
	cuEventRecord             func(e, s uintptr) result
	cuEventSynchronize        func(e uintptr) result
	cuEventElapsedTime        func(ms unsafe.Pointer, start, end uintptr) result
	cuEventDestroy            func(e uintptr) result
	cuModuleLoadDataEx        func(mod unsafe.Pointer, image unsafe.Pointer, n uint32, opts, vals unsafe.Pointer) result
	cuModuleGetFunction       func(f unsafe.Pointer, mod uintptr, name unsafe.Pointer) result
	cuModuleUnload            func(mod uintptr) result
	cuLaunchKernel            func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, stream uintptr, params, extra unsafe.Pointer) result
	cuGetErrorName            func(r result, s unsafe.Pointer) result
}

// symbols names each entry point of driver as libcuda exports it.
var symbols = []struct {
	fn   any
	name string
}{
	{&driver.cuInit, "cuInit"},
	{&driver.cuDeviceGetCount, "cuDeviceGetCount"},
	{&driver.cuDeviceGet, "cuDeviceGet"},
	{&driver.cuDeviceGetName, "cuDeviceGetName"},
	{&driver.cuDeviceGetAttribute, "cuDeviceGetAttribute"},
	{&driver.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
	{&driver.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
	{&driver.cuCtxSetCurrent, "cuCtxSetCurrent"},
	{&driver.cuMemGetInfo, "cuMemGetInfo_v2"},
	{&driver.cuMemAlloc, "cuMemAlloc_v2"},
	{&driver.cuMemFree, "cuMemFree_v2"},
	{&driver.cuMemHostAlloc, "cuMemHostAlloc"},
	{&driver.cuMemFreeHost, "cuMemFreeHost"},
	{&driver.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
	{&driver.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
	{&driver.cuMemsetD8, "cuMemsetD8_v2"},
	{&driver.cuStreamCreate, "cuStreamCreate"},
	{&driver.cuStreamDestroy, "cuStreamDestroy_v2"},
	{&driver.cuStreamSynchronize, "cuStreamSynchronize"},
	{&driver.cuEventCreate, "cuEventCreate"},
	{&driver.cuEventRecord, "cuEventRecord"},
	{&driver.cuEventSynchronize, "cuEventSynchronize"},
	{&driver.cuEventElapsedTime, "cuEventElapsedTime"},
	{&driver.cuEventDestroy, "cuEventDestroy_v2"},
	{&driver.cuModuleLoadDataEx, "cuModuleLoadDataEx"},
	{&driver.cuModuleGetFunction, "cuModuleGetFunction"},
	{&driver.cuModuleUnload, "cuModuleUnload"},
	{&driver.cuLaunchKernel, "cuLaunchKernel"},
	{&driver.cuGetErrorName, "cuGetErrorName"},
}

var (
	loadOnce sync.Once
	loadErr  error
)

// load binds the driver and initialises it, once per process. A machine
// without the NVIDIA driver gets an error saying so, never an exit.
func load() error {
	loadOnce.Do(func() {
		lib, err := purego.Dlopen("libcuda.so.1", purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			loadErr = fmt.Errorf("cuda: no NVIDIA driver on this machine (libcuda.so.1: %v)", err)
			return
		}
		for _, s := range symbols {
			addr, err := purego.Dlsym(lib, s.name)
			if err != nil {
				loadErr = fmt.Errorf("cuda: libcuda.so.1 lacks %s: %v", s.name, err)
				return
			}
			purego.RegisterFunc(s.fn, addr)
		}
		loadErr = check("cuInit", driver.cuInit(0))
	})
	return loadErr
}

// Error is a failed driver call.
type Error struct {
	Call string
	Code uint32
	Name string // CUDA_ERROR_..., as the driver names it
}

func (e *Error) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, e.Name, e.Code)
}

// check turns a driver result into an error naming the call.
func check(call string, r result) error {
	if r == 0 {
		return nil
	}
	name := "unknown error"
	var s *byte
	if driver.cuGetErrorName != nil && driver.cuGetErrorName(r, unsafe.Pointer(&s)) == 0 && s != nil {
		name = cString(s)
	}
	return &Error{Call: call, Code: uint32(r), Name: name}
}

// cString copies a NUL-terminated C string.
func cString(p *byte) string {
	var n int
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// Driver constants (cuda.h).
const (
	memHostAllocPortable       = 0x01 // CU_MEMHOSTALLOC_PORTABLE
	streamNonBlocking          = 0x1  // CU_STREAM_NON_BLOCKING
	eventDefault               = 0x0  // CU_EVENT_DEFAULT
	attrMultiprocessorCount    = 16   // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
	attrComputeCapabilityMajor = 75   // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeCapabilityMinor = 76   // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
	jitErrorLogBuffer          = 5    // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSize      = 6    // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)
