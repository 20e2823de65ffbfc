package kernels

import (
	"sync/atomic"
	"syscall"
	"unsafe"
)

// parker holds one goroutine asleep until another wakes it, the goroutine
// on its own thread in the kernel (a futex): the wake-up runs it where
// its thread wakes. Go's own parking (a channel, a sync.Cond) queues the
// woken goroutine behind its waker, on the waker's P, and the P that
// wakes to take it from there first sleeps 3 us (runqgrab, so as not to
// take a goroutine its P is about to run); on Linux that sleep lasts the
// timer slack, 50 us, 80 us in the Zen 4 VM (Go's execution tracer,
// 2026-11-30), while the waker runs the region's chunks alone.
//
// A wake before the sleep is kept (token): the next sleep returns at
// once, as a channel of capacity 1 would.
//
// While the member sleeps its P is in a system call until sysmon takes it
// back (20 us to 10 ms); woken, the member takes that P or an idle one.
// Where every P is busy (a server's goroutines beside the decode) it
// waits in the global run queue, as a goroutine woken from a channel
// waits in its waker's.
type parker struct{ token atomic.Uint32 }

const (
	futexWaitPrivate = 0 | 128 // FUTEX_WAIT | FUTEX_PRIVATE_FLAG
	futexWakePrivate = 1 | 128 // FUTEX_WAKE | FUTEX_PRIVATE_FLAG
)

// init readies the parker before its first use: nothing to do here.
func (p *parker) init() {}

// sleep returns once a wake is (or was) given, consuming it.
func (p *parker) sleep() {
	for !p.token.CompareAndSwap(1, 0) {
		// returns at once (EAGAIN) if the token is no longer 0, or on a
		// signal (EINTR): either way, look again
		syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(&p.token)), futexWaitPrivate, 0, 0, 0, 0)
	}
}

// wake gives the token and wakes the sleeper, if it sleeps. FUTEX_WAKE
// never blocks, so the caller's goroutine keeps its P (RawSyscall6, no
// trip through the scheduler on the region's path).
func (p *parker) wake() {
	p.token.Store(1)
	syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(&p.token)), futexWakePrivate, 1, 0, 0, 0)
}
