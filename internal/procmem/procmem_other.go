//go:build !linux

package procmem

import "time"

// PeakRSS is unknown on this platform: 0.
func PeakRSS() int64 { return 0 }

// Available is unknown on this platform: 0.
func Available() int64 { return 0 }

// RSS is unknown on this platform: 0.
func RSS() int64 { return 0 }

// PeakRSSOf is unknown on this platform: 0.
func PeakRSSOf(pid int) int64 { return 0 }

// RSSOf is unknown on this platform: 0.
func RSSOf(pid int) int64 { return 0 }

// CPUTime is unknown on this platform: 0.
func CPUTime() time.Duration { return 0 }

// CPUTimeOf is unknown on this platform: false.
func CPUTimeOf(pid int) (time.Duration, bool) { return 0, false }

// RunningThreads is unknown on this platform: false.
func RunningThreads(pid int) (int, bool) { return 0, false }

// PageFaults are unknown on this platform: 0.
func PageFaults() (minor, major int64) { return 0, 0 }
