//go:build cuda

package cuda

import (
	_ "embed"
	"fmt"
	"runtime"
	"strings"
	"time"
	"unsafe"
)

//go:embed expert.ptx
var expertPTX string

// Ptr is a device address.
type Ptr uint64

// Device is one GPU, through its primary context, with the expert
// kernels loaded. Its methods may be called from any goroutine.
type Device struct {
	Ordinal int
	Name    string // as the driver names it, e.g. "NVIDIA H100 80GB HBM3"
	// Major, Minor are the compute capability; SMs its multiprocessors.
	Major, Minor, SMs int

	dev int32
	ctx uintptr
	mod uintptr
	fn  kernelFuncs
}

// kernelFuncs are expert.cu's entry points, by weight format (kernels.F32,
// F16, BF16 index them) and tokens a pass (tiles).
type kernelFuncs struct {
	gateUp, matMul [3][len(tiles)]uintptr
	matMulMXFP4    [len(tiles)]uintptr
	addBias        [3]uintptr
	swiglu         uintptr
	clampedSwiGLU  uintptr
}

// tiles are the tokens a pass of expert.cu's products computes per weight
// loaded: one kernel each.
var tiles = [...]int{1, 4, 8}

// tileFor is the index in tiles of the kernel for n tokens: the smallest
// tile that holds them all, or the largest.
func tileFor(n int) int {
	for i, t := range tiles {
		if n <= t {
			return i
		}
	}
	return len(tiles) - 1
}

// Open opens GPU ordinal: it retains the device's primary context and
// loads the expert kernels (the driver compiles the PTX for this GPU).
func Open(ordinal int) (*Device, error) {
	if err := load(); err != nil {
		return nil, err
	}
	var count int32
	if err := check("cuDeviceGetCount", driver.cuDeviceGetCount(unsafe.Pointer(&count))); err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= int(count) {
		return nil, fmt.Errorf("cuda: device %d: this machine has %d CUDA device(s)", ordinal, count)
	}
	d := &Device{Ordinal: ordinal}
	if err := check("cuDeviceGet", driver.cuDeviceGet(unsafe.Pointer(&d.dev), int32(ordinal))); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	if err := check("cuDeviceGetName", driver.cuDeviceGetName(unsafe.Pointer(&name[0]), int32(len(name)), d.dev)); err != nil {
		return nil, err
	}
	d.Name = cString(&name[0])
	for _, a := range []struct {
		v    *int
		attr int32
	}{{&d.Major, attrComputeCapabilityMajor}, {&d.Minor, attrComputeCapabilityMinor}, {&d.SMs, attrMultiprocessorCount}} {
		var v int32
		if err := check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(unsafe.Pointer(&v), a.attr, d.dev)); err != nil {
			return nil, err
		}
		*a.v = int(v)
	}
	if err := check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(unsafe.Pointer(&d.ctx), d.dev)); err != nil {
		return nil, err
	}
	if err := d.loadKernels(); err != nil {
		driver.cuDevicePrimaryCtxRelease(d.dev)
		return nil, err
	}
	return d, nil
}

// String names the device as a worker reports it.
func (d *Device) String() string {
	return fmt.Sprintf("cuda:%d %s (sm_%d%d, %d SMs)", d.Ordinal, d.Name, d.Major, d.Minor, d.SMs)
}

// bind makes the device's context current on this goroutine's thread,
// which stays locked to it until the returned func runs.
func (d *Device) bind() func() {
	runtime.LockOSThread()
	if err := check("cuCtxSetCurrent", driver.cuCtxSetCurrent(d.ctx)); err != nil {
		// a retained primary context is always valid: this is a broken driver
		panic(err)
	}
	return runtime.UnlockOSThread
}

func (d *Device) loadKernels() error {
	defer d.bind()()
	image := expertPTX + "\x00"
	errLog := make([]byte, 8192)
	opts := []int32{jitErrorLogBuffer, jitErrorLogBufferSize}
	vals := []uintptr{uintptr(unsafe.Pointer(&errLog[0])), uintptr(len(errLog))}
	r := driver.cuModuleLoadDataEx(unsafe.Pointer(&d.mod), unsafe.Pointer(unsafe.StringData(image)), uint32(len(opts)),
		unsafe.Pointer(&opts[0]), unsafe.Pointer(&vals[0]))
	runtime.KeepAlive(image)
	if err := check("cuModuleLoadDataEx", r); err != nil {
		return fmt.Errorf("%w: loading the expert kernels' PTX: %s", err, strings.TrimSpace(cString(&errLog[0])))
	}
	get := func(name string) (uintptr, error) {
		var f uintptr
		cname := append([]byte(name), 0)
		err := check("cuModuleGetFunction "+name, driver.cuModuleGetFunction(unsafe.Pointer(&f), d.mod, unsafe.Pointer(&cname[0])))
		return f, err
	}
	var err error
	for i, dt := range []string{"f32", "f16", "bf16"} {
		if d.fn.addBias[i], err = get("odmoe_add_bias_" + dt); err != nil {
			return err
		}
		for j, t := range tiles {
			if d.fn.gateUp[i][j], err = get(fmt.Sprintf("odmoe_gate_up_%s_t%d", dt, t)); err != nil {
				return err
			}
			if d.fn.matMul[i][j], err = get(fmt.Sprintf("odmoe_mat_mul_%s_t%d", dt, t)); err != nil {
				return err
			}
		}
	}
	for j, t := range tiles {
		if d.fn.matMulMXFP4[j], err = get(fmt.Sprintf("odmoe_mat_mul_mxfp4_t%d", t)); err != nil {
			return err
		}
	}
	if d.fn.clampedSwiGLU, err = get("odmoe_clamped_swiglu"); err != nil {
		return err
	}
	d.fn.swiglu, err = get("odmoe_swiglu")
	return err
}

// Close unloads the kernels and releases the primary context. Nothing
// may use the device after.
func (d *Device) Close() error {
	unbind := d.bind()
	err := check("cuModuleUnload", driver.cuModuleUnload(d.mod))
	unbind()
	if e := check("cuDevicePrimaryCtxRelease", driver.cuDevicePrimaryCtxRelease(d.dev)); err == nil {
		err = e
	}
	return err
}

// MemInfo is the device's free and total memory, as the driver sees it
// (every process's allocations count).
func (d *Device) MemInfo() (free, total int64, err error) {
	defer d.bind()()
	var f, t uint64
	err = check("cuMemGetInfo", driver.cuMemGetInfo(unsafe.Pointer(&f), unsafe.Pointer(&t)))
	return int64(f), int64(t), err
}

// Alloc takes n bytes of device memory.
func (d *Device) Alloc(n int64) (Ptr, error) {
	defer d.bind()()
	var p Ptr
	err := check("cuMemAlloc", driver.cuMemAlloc(unsafe.Pointer(&p), uint64(n)))
	return p, err
}

// Free gives back device memory from Alloc.
func (d *Device) Free(p Ptr) error {
	defer d.bind()()
	return check("cuMemFree", driver.cuMemFree(uint64(p)))
}

// HostAlloc takes n bytes of page-locked host memory, which transfers
// to and from the device read and write directly (and asynchronously).
func (d *Device) HostAlloc(n int64) ([]byte, error) {
	defer d.bind()()
	var p unsafe.Pointer
	if err := check("cuMemHostAlloc", driver.cuMemHostAlloc(unsafe.Pointer(&p), uint64(n), memHostAllocPortable)); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// FreeHost gives back host memory from HostAlloc.
func (d *Device) FreeHost(b []byte) error {
	defer d.bind()()
	return check("cuMemFreeHost", driver.cuMemFreeHost(uintptr(unsafe.Pointer(unsafe.SliceData(b)))))
}

// Memset sets n bytes at p to v (synchronously): the tests poison
// outputs with it.
func (d *Device) Memset(p Ptr, v byte, n int64) error {
	defer d.bind()()
	return check("cuMemsetD8", driver.cuMemsetD8(uint64(p), v, uint64(n)))
}

// Stream is a queue of device work: copies and kernels run in the order
// they were issued on it, concurrently with other streams'. One
// goroutine uses a stream at a time.
type Stream struct {
	d    *Device
	s    uintptr
	args *launchArgs
}

// launchArgs is a kernel launch's argument block: the values and the
// pointers to them that cuLaunchKernel reads (and copies) during the call.
type launchArgs struct {
	vals [8]uint64
	ptrs [8]unsafe.Pointer
}

// NewStream returns a stream that does not wait for the legacy default
// stream.
func (d *Device) NewStream() (*Stream, error) {
	defer d.bind()()
	s := &Stream{d: d, args: new(launchArgs)}
	if err := check("cuStreamCreate", driver.cuStreamCreate(unsafe.Pointer(&s.s), streamNonBlocking)); err != nil {
		return nil, err
	}
	return s, nil
}

// Close destroys the stream once its work is done.
func (s *Stream) Close() error {
	defer s.d.bind()()
	return check("cuStreamDestroy", driver.cuStreamDestroy(s.s))
}

// CopyToDevice queues a copy of src to dst. src must stay untouched until
// the stream has synchronized; page-locked memory (HostAlloc) is copied
// asynchronously, other memory through the driver's staging.
func (s *Stream) CopyToDevice(dst Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	defer s.d.bind()()
	return check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(uint64(dst), unsafe.Pointer(&src[0]), uint64(len(src)), s.s))
}

// CopyToHost queues a copy of len(dst) bytes at src into dst.
func (s *Stream) CopyToHost(dst []byte, src Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	defer s.d.bind()()
	return check("cuMemcpyDtoHAsync", driver.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), uint64(src), uint64(len(dst)), s.s))
}

// Sync waits until everything queued on the stream has run; a kernel's
// failure surfaces here.
func (s *Stream) Sync() error {
	defer s.d.bind()()
	return check("cuStreamSynchronize", driver.cuStreamSynchronize(s.s))
}

// launch queues kernel f on a grid of blocks of threads threads with
// args (device pointers and int32s, each in a uint64).
func (s *Stream) launch(name string, f uintptr, blocks, threads int, args ...uint64) error {
	a := s.args
	for i, v := range args {
		a.vals[i] = v
		a.ptrs[i] = unsafe.Pointer(&a.vals[i])
	}
	defer s.d.bind()()
	if r := driver.cuLaunchKernel(f, uint32(blocks), 1, 1, uint32(threads), 1, 1, 0, s.s, unsafe.Pointer(&a.ptrs[0]), nil); r != 0 {
		return check("cuLaunchKernel "+name, r) // the name is built only for the error
	}
	return nil
}

// Event marks a point in a stream's work, for timing it.
type Event struct {
	d *Device
	e uintptr
}

// NewEvent returns a timing event.
func (d *Device) NewEvent() (*Event, error) {
	defer d.bind()()
	e := &Event{d: d}
	return e, check("cuEventCreate", driver.cuEventCreate(unsafe.Pointer(&e.e), eventDefault))
}

// Record queues e on s: it completes when the work queued before it has.
func (s *Stream) Record(e *Event) error {
	defer s.d.bind()()
	return check("cuEventRecord", driver.cuEventRecord(e.e, s.s))
}

// Since waits for e and returns the device time between start and e.
func (e *Event) Since(start *Event) (time.Duration, error) {
	defer e.d.bind()()
	if err := check("cuEventSynchronize", driver.cuEventSynchronize(e.e)); err != nil {
		return 0, err
	}
	var ms float32
	err := check("cuEventElapsedTime", driver.cuEventElapsedTime(unsafe.Pointer(&ms), start.e, e.e))
	return time.Duration(float64(ms) * 1e6), err
}

// Close destroys the event.
func (e *Event) Close() error {
	defer e.d.bind()()
	return check("cuEventDestroy", driver.cuEventDestroy(e.e))
}
