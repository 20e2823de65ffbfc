//go:build linux

package procmem

import (
	"os"
	"os/exec"
	"path/filepath"
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

// TestRunningThreadsSeesASpinAndASleep: a child spinning has a thread
// running (or ready to run), one sleeping has none, one gone cannot be
// read.
func TestRunningThreadsSeesASpinAndASleep(t *testing.T) {
	spin := exec.Command("sh", "-c", "while :; do :; done")
	sleeper := exec.Command("sleep", "5")
	for _, c := range []*exec.Cmd{spin, sleeper} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	// each child read until it shows what it does (a page fault of its
	// start may hold it in another state a moment); a spinning thread is
	// R whether it is on a CPU or waiting for one
	settled := func(pid, want int) (n int, ok bool) {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if n, ok = RunningThreads(pid); ok && n == want {
				break
			}
		}
		return n, ok
	}
	if n, ok := settled(spin.Process.Pid, 1); !ok || n != 1 {
		t.Errorf("a spinning child: %d threads running (readable %v), want 1", n, ok)
	}
	if n, ok := settled(sleeper.Process.Pid, 0); !ok || n != 0 {
		t.Errorf("a sleeping child: %d threads running (readable %v), want 0", n, ok)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	if _, ok := RunningThreads(sleeper.Process.Pid); ok {
		t.Error("a reaped child's threads read as if it were there")
	}
}

// Available is at most what /proc/meminfo says is available, and what
// the process's memory cgroups leave where they set a limit.
func TestAvailableIsWithinTheMachinesAndTheCgroupsRoom(t *testing.T) {
	avail, meminfo := Available(), fieldOf("/proc/meminfo", "MemAvailable:")
	if avail <= 0 || meminfo <= 0 || avail > meminfo {
		t.Fatalf("Available %d bytes, MemAvailable %d", avail, meminfo)
	}
	if room, ok := cgroupRoom(); ok && avail > room {
		t.Fatalf("Available %d bytes, the cgroups leave %d", avail, room)
	}
}

// The room a cgroup leaves is the least of its and its parents' limits
// less their use, in either version's files; none where none sets one.
func TestCgroupRoomIsTheLeastLimitLessUseOnTheWayUp(t *testing.T) {
	write := func(path, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, cgroup string
		files        map[string]string
		room         int64
		ok           bool
	}{
		{"v2, the parent's limit is the least", "0::/a/b\n", map[string]string{
			"a/b/memory.max": "max\n", "a/b/memory.current": "100\n",
			"a/memory.max": "1000\n", "a/memory.current": "400\n",
			"memory.max": "5000\n", "memory.current": "600\n"}, 600, true},
		{"v2, no limit", "0::/a\n", map[string]string{"a/memory.max": "max\n", "a/memory.current": "5\n"}, 0, false},
		{"v1, the process's own", "4:memory:/p/q\n3:cpu:/\n", map[string]string{
			"memory/p/q/memory.limit_in_bytes": "2048\n", "memory/p/q/memory.usage_in_bytes": "48\n",
			"memory/p/memory.limit_in_bytes": "9223372036854771712\n", "memory/p/memory.usage_in_bytes": "48\n"}, 2000, true},
		{"over its limit: no room", "0::/a\n", map[string]string{"a/memory.max": "100\n", "a/memory.current": "150\n"}, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			write(filepath.Join(dir, "cgroup"), c.cgroup)
			for name, body := range c.files {
				write(filepath.Join(dir, "fs", name), body)
			}
			room, ok := cgroupRoomIn(filepath.Join(dir, "cgroup"), filepath.Join(dir, "fs"))
			if room != c.room || ok != c.ok {
				t.Errorf("room %d, %v; want %d, %v", room, ok, c.room, c.ok)
			}
		})
	}
}
