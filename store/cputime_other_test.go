//go:build !unix

package store

import "time"

// cpuTime is unavailable here; the GB/cpu-s metric reads 0.
func cpuTime() time.Duration { return 0 }
