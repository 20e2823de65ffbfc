//go:build linux

package procmem

import (
	"os"
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
	if of := RSSOf(os.Getpid()); of < before+32<<20 || of > PeakRSS() {
		t.Fatalf("RSSOf(this process) %d after touching 64 MiB: want over %d and at most the peak since", of, before+32<<20)
	}
	if now > peak {
		t.Fatalf("RSS %d above the peak %d", now, peak)
	}
	_ = b[len(b)-1]
}

// TestCPUTimeCountsBusyThreads: spinning shows in the process's CPU
// time, read both ways (getrusage, /proc/PID/stat), within 5 s of wall
// time however loaded the machine.
func TestCPUTimeCountsBusyThreads(t *testing.T) {
	before := CPUTime()
	beforeOf, ok := CPUTimeOf(os.Getpid())
	if !ok {
		t.Fatal("this process's /proc/PID/stat is unreadable")
	}
	for deadline := time.Now().Add(5 * time.Second); CPUTime()-before < 50*time.Millisecond && time.Now().Before(deadline); {
	}
	if got := CPUTime() - before; got < 50*time.Millisecond {
		t.Fatalf("getrusage: CPU time grew by %v over up to 5 s of spinning", got)
	}
	// /proc counts in 10 ms ticks
	if got, _ := CPUTimeOf(os.Getpid()); got-beforeOf < 30*time.Millisecond {
		t.Fatalf("/proc/PID/stat: CPU time grew by %v while getrusage saw %v", got-beforeOf, CPUTime()-before)
	}
}

// Available is what /proc/meminfo says, within the machine's total.
func TestAvailableIsWithinTheMachinesMemory(t *testing.T) {
	avail, total := Available(), fieldOf("/proc/meminfo", "MemTotal:")
	if avail <= 0 || total <= 0 || avail > total {
		t.Fatalf("MemAvailable %d bytes, MemTotal %d", avail, total)
	}
}
