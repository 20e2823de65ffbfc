// Package cpuset pins a node's process to a set of CPUs, as `taskset -c
// LIST` does: a benchmark that runs every node of a rig on one machine
// gives each its own cores, so that one node's work is not another's
// wait. It owns the list's syntax and the command line that pins; the
// process started is the node itself (taskset execs it), so its PID,
// signals and CPU time are the node's.
package cpuset

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Check reports whether list is a CPU list as taskset -c and the kernel
// write it: comma-separated CPU numbers and ascending ranges (0-3,8,10-11).
func Check(list string) error {
	if list == "" {
		return fmt.Errorf("empty CPU list")
	}
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return fmt.Errorf("CPU list %q: %q: %w", list, part, err)
		}
		if !isRange {
			continue
		}
		b, err := cpuNumber(hi)
		if err != nil {
			return fmt.Errorf("CPU list %q: %q: %w", list, part, err)
		}
		if b < a {
			return fmt.Errorf("CPU list %q: range %q runs backwards", list, part)
		}
	}
	return nil
}

func cpuNumber(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strings.HasPrefix(s, "+") {
		return 0, fmt.Errorf("want a CPU number (0, 1, ...), got %q", s)
	}
	return n, nil
}

// Argv is argv run on the CPUs of list: argv itself when list is empty,
// else taskset -c list followed by argv.
func Argv(list string, argv []string) []string {
	if list == "" {
		return argv
	}
	return append([]string{"taskset", "-c", list}, argv...)
}

// CommandContext is exec.CommandContext of Argv(list, name and args).
// With a list, it fails at Start, naming taskset, where taskset cannot
// be found.
func CommandContext(ctx context.Context, list, name string, args ...string) *exec.Cmd {
	argv := Argv(list, append([]string{name}, args...))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if list != "" && cmd.Err != nil {
		cmd.Err = fmt.Errorf("pinning %s to CPUs %s needs taskset (Debian: apt-get install util-linux): %w", name, list, cmd.Err)
	}
	return cmd
}

// OfProcess is the CPU list the kernel lets process pid run on (0: this
// process), as /proc/PID/status says it (Linux).
func OfProcess(pid int) (string, error) {
	p := "self"
	if pid != 0 {
		p = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/%s/status has no Cpus_allowed_list", p)
}
