package cpuset

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestCheckTakesTasksetsListsAndNamesWhatIsWrong(t *testing.T) {
	for _, ok := range []string{"0", "15", "0-3", "0-3,8,10-11", "2-2"} {
		if err := Check(ok); err != nil {
			t.Errorf("Check(%q): %v", ok, err)
		}
	}
	for list, want := range map[string]string{
		"":      "empty",
		"a":     `"a"`,
		"1,,2":  `""`,
		"3-1":   "backwards",
		"-1":    `""`,
		"1-":    `""`,
		"+1":    `"+1"`,
		"0 - 3": `"0 "`,
	} {
		err := Check(list)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v, want an error naming %s", list, err, want)
		}
	}
}

func TestArgvPinsOnlyWithAList(t *testing.T) {
	argv := []string{"/bin/odmoe", "run", "-role", "worker"}
	if got := Argv("", argv); !slices.Equal(got, argv) {
		t.Errorf("no list: %q", got)
	}
	if got, want := Argv("2-3", argv), append([]string{"taskset", "-c", "2-3"}, argv...); !slices.Equal(got, want) {
		t.Errorf("Argv = %q, want %q", got, want)
	}
}

// The process started runs on the list's CPUs alone (the kernel's own
// record of it, /proc/self/status), and it is the program itself:
// taskset has exec'd it, so the PID the caller holds is the node's.
func TestCommandRunsTheProgramOnTheListsCPUs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("taskset and /proc are Linux's")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Fatalf("taskset (util-linux) is not installed: %v", err)
	}
	cmd := CommandContext(context.Background(), "0", "sh", "-c", `echo $$; grep Cpus_allowed_list /proc/self/status`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if got, err := OfProcess(0); err != nil || got == "" || got == "0" && runtime.NumCPU() > 1 {
		t.Errorf("this process runs on %q (%v): the pin leaked to the caller", got, err)
	}
	if len(lines) != 2 {
		t.Fatalf("output %q", out)
	}
	if pid := strings.TrimSpace(lines[0]); pid != strconv.Itoa(cmd.Process.Pid) {
		t.Errorf("the shell's PID is %s, the started process's %d: taskset did not exec it", pid, cmd.Process.Pid)
	}
	if f := strings.Fields(lines[1]); len(f) != 2 || f[1] != "0" {
		t.Errorf("pinned to %q, want CPU 0 alone", lines[1])
	}
}

func TestCommandNamesTasksetWhereItIsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := CommandContext(context.Background(), "0", os.Args[0]).Start()
	if err == nil || !strings.Contains(err.Error(), "taskset") || !strings.Contains(err.Error(), "CPUs 0") {
		t.Errorf("Start without taskset: %v, want an error naming taskset and the list", err)
	}
	if err := CommandContext(context.Background(), "", "/bin/true").Run(); err != nil {
		t.Errorf("no list, no taskset needed: %v", err)
	}
}

func TestOfProcessReadsAPinnedProcesssList(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux's")
	}
	cmd := CommandContext(context.Background(), "0", "sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var got string
	var err error
	for range 100 { // until taskset has set the mask and exec'd sleep
		if got, err = OfProcess(cmd.Process.Pid); err == nil && got == "0" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got != "0" {
		t.Errorf("OfProcess(sleep) = %q, %v; want 0", got, err)
	}
	if _, err := OfProcess(1 << 30); err == nil {
		t.Error("OfProcess of no process: no error")
	}
}
