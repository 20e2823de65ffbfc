package procmem

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// PeakRSS is the process's peak resident set size in bytes (0 if unknown):
// VmHWM of /proc/self/status. (getrusage's ru_maxrss is no use here: it
// survives fork and exec, so a worker started by `odmoe demo` would report
// the demo process's own peak.)
func PeakRSS() int64 { return status("VmHWM:") }

// RSS is the process's resident set size now in bytes (0 if unknown):
// VmRSS of /proc/self/status.
func RSS() int64 { return status("VmRSS:") }

// PeakRSSOf is process pid's peak resident set size in bytes (0 if
// unknown): its VmHWM.
func PeakRSSOf(pid int) int64 { return statusOf(strconv.Itoa(pid), "VmHWM:") }

// RSSOf is process pid's resident set size now in bytes (0 if unknown).
func RSSOf(pid int) int64 { return statusOf(strconv.Itoa(pid), "VmRSS:") }

// Available is the memory new work of this process could take without
// swapping, page cache the kernel would drop included, in bytes (0 if
// unknown): MemAvailable of /proc/meminfo, or less where the process's
// memory cgroup (a container's) or one above it leaves less room
// (cgroupRoom).
func Available() int64 {
	avail := fieldOf("/proc/meminfo", "MemAvailable:")
	if room, ok := cgroupRoom(); ok && (avail == 0 || room < avail) {
		return room
	}
	return avail
}

// cgroupRoom is the least room, its limit less its use, that the
// process's memory cgroup and those above it leave (v2's memory.max and
// memory.current, v1's memory.limit_in_bytes and memory.usage_in_bytes);
// ok is false where none sets a limit.
func cgroupRoom() (room int64, ok bool) { return cgroupRoomIn("/proc/self/cgroup", "/sys/fs/cgroup") }

// cgroupRoomIn is cgroupRoom with the process's cgroup file and the
// cgroup file systems' mount point given.
func cgroupRoomIn(cgroupFile, mount string) (room int64, ok bool) {
	b, err := os.ReadFile(cgroupFile)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		// "0::/path" (v2) or "4:memory:/path" (v1)
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		root, limit, use := "", "", ""
		switch {
		case parts[0] == "0" && parts[1] == "":
			root, limit, use = mount, "memory.max", "memory.current"
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			root, limit, use = filepath.Join(mount, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes"
		default:
			continue
		}
		for dir := filepath.Join(root, parts[2]); ; dir = filepath.Dir(dir) {
			lim, okLim := readInt(filepath.Join(dir, limit))
			cur, okCur := readInt(filepath.Join(dir, use))
			if okLim && okCur && lim < 1<<62 { // v1 says "no limit" with a page-rounded 2^63
				if r := max(0, lim-cur); !ok || r < room {
					room, ok = r, true
				}
			}
			if dir == root || len(dir) <= len(root) {
				break
			}
		}
	}
	return room, ok
}

// readInt reads a file holding one integer ("max" and others: false).
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}

// status reads a field of /proc/self/status given in kB, in bytes.
func status(field string) int64 { return statusOf("self", field) }

// statusOf reads a field of /proc/PID/status given in kB, in bytes.
func statusOf(pid, field string) int64 { return fieldOf("/proc/"+pid+"/status", field) }

// fieldOf reads a field given in kB of a /proc file of such lines, in
// bytes.
func fieldOf(path, field string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte(field)); ok {
			f := bytes.Fields(v) // "1234", "kB"
			if len(f) == 2 {
				kb, err := strconv.ParseInt(string(f[0]), 10, 64)
				if err == nil {
					return kb * 1024
				}
			}
		}
	}
	return 0
}

// CPUTime is the CPU time (user and system) all of the process's threads
// have used so far; 0 if unknown.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTicks is Linux's USER_HZ, the unit of /proc/PID/stat's times (100
// on every architecture Linux builds for user space).
const clockTicks = 100

// CPUTimeOf is the CPU time (user and system) process pid has used so
// far, from /proc/PID/stat; false if it cannot be read.
func CPUTimeOf(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// "PID (COMM) STATE PPID ...": fields after the command name, which
	// may hold spaces and parentheses, so from its last ")"
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 { // STATE is field 3; utime 14, stime 15
		return 0, false
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * time.Second / clockTicks, true
}

// RunningThreads is how many threads of process pid are running or
// ready to run (state R in /proc/PID/task/*/stat): a thread spinning is,
// one blocked in a read or a futex is not; false if the process cannot
// be read (it is gone). Where a CPU-time clock of another process moves
// only at scheduler ticks for a thread running on another CPU, a
// thread's state says at once whether it spins.
func RunningThreads(pid int) (int, bool) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	running := 0
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/stat")
		if err != nil {
			continue // the thread has exited
		}
		// "TID (COMM) STATE ...": the state follows the command name's last ")"
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'R' {
			running++
		}
	}
	return running, true
}

// PageFaults are the process's page faults so far: minor (the page was
// in memory: a mapping set up) and major (read from disk); 0 if unknown.
func PageFaults() (minor, major int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return ru.Minflt, ru.Majflt
}
