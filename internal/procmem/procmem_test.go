//go:build linux

package procmem

import (
	"testing"
	"time"
)

func TestPeakRSSGrowsWithTouchedMemory(t *testing.T) {
	before := PeakRSS()
	if before <= 0 {
		t.Fatalf("PeakRSS = %d", before)
	}
	b := make([]byte, 64<<20)
	for i := range b {
		if i%4096 == 0 {
			b[i] = 1
		}
	}
	if after := PeakRSS(); after < before+32<<20 {
		t.Fatalf("peak RSS %d after touching 64 MiB, was %d", after, before)
	}
	_ = b[len(b)-1]
}

func TestRSSCountsTouchedMemoryAndStaysUnderThePeak(t *testing.T) {
	before := RSS()
	if before <= 0 {
		t.Fatalf("RSS = %d", before)
	}
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	now, peak := RSS(), PeakRSS()
	if now < before+32<<20 {
		t.Fatalf("RSS %d after touching 64 MiB, was %d", now, before)
	}
	if now > peak {
		t.Fatalf("RSS %d above the peak %d", now, peak)
	}
	_ = b[len(b)-1]
}

func TestCPUTimeCountsBusyThreads(t *testing.T) {
	before := CPUTime()
	deadline := time.Now().Add(50 * time.Millisecond)
	x := 0
	for time.Now().Before(deadline) {
		x++
	}
	if got := CPUTime() - before; got < 20*time.Millisecond {
		t.Fatalf("CPU time grew by %v over 50 ms of spinning (%d loops)", got, x)
	}
}
