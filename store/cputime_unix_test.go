//go:build unix

package store

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) this process has used: on a
// shared machine, bytes per CPU-second measure a core's speed where wall
// time also measures the neighbours.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
