package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDemoServesTheAPIUntilInterrupted: `odmoe demo` without -prompt
// serves the API from its swarm, prints where its nodes log and curl
// lines that work as pasted, and on SIGINT stops every process it started
// and exits 0, the nodes' logs kept in -logs DIR.
func TestDemoServesTheAPIUntilInterrupted(t *testing.T) {
	cache, logs := t.TempDir(), filepath.Join(t.TempDir(), "logs")
	cmd := exec.Command(odmoeBin(t), "demo", "-workers", "2", "-cache", cache, "-http", "127.0.0.1:0", "-log-level", "warn", "-logs", logs)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderrFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderrFile.Close()
	cmd.Stderr = stderrFile
	stderr := func() string { b, _ := os.ReadFile(stderrFile.Name()); return string(b) }
	// its own process group: the cleanup can kill the demo's children
	// too, which hold its stdout open after the demo itself is killed
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines, exited := make(chan string, 64), make(chan struct{})
	var waitErr error
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads any more
			}
		}
		close(lines)
		waitErr = cmd.Wait()
		close(exited)
	}()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Error("the demo's stdout stayed open 30 s after its process group was killed")
		}
	}()
	var printed, curls []string
	timeout := time.After(2 * time.Minute)
	for len(curls) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("demo exited without serving:\n%s\n%s", strings.Join(printed, "\n"), stderr())
			}
			printed = append(printed, l)
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "curl ") {
				curls = append(curls, l)
			}
		case <-timeout:
			t.Fatalf("demo printed no curl lines within 2 minutes:\n%s\n%s", strings.Join(printed, "\n"), stderr())
		}
	}
	if m := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/v1) `).FindStringSubmatch(strings.Join(printed, "\n")); m == nil || strings.HasSuffix(m[1], ":0/v1") {
		t.Errorf("demo did not say where it serves, with the port it got:\n%s", strings.Join(printed, "\n"))
	}
	children := childPIDs(t, cmd.Process.Pid)
	if children != nil && len(children) != 4 {
		t.Errorf("demo runs %d child processes %v, want 4 (2 workers, the shadow, the main node)", len(children), children)
	}

	// the printed lines, pasted into a shell
	if _, err := exec.LookPath("curl"); err == nil {
		chat := hasChatTemplate(t, filepath.Join(cache, "models", "tiny-seed1"))
		for _, c := range curls {
			out, err := exec.Command("sh", "-c", c+" --silent --show-error").CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", c, err, out)
			}
			switch {
			case strings.Contains(c, "/chat/completions") && chat:
				if !strings.Contains(string(out), `"finish_reason":`) || !strings.HasSuffix(strings.TrimSpace(string(out)), "data: [DONE]") {
					t.Errorf("%s printed:\n%s", c, out)
				}
			case strings.Contains(c, "/chat/completions"):
				if !strings.Contains(string(out), "no chat template") {
					t.Errorf("%s printed:\n%s", c, out)
				}
				t.Logf("NOTE: the demo's model has no chat template: its chat curl line answers %s", out)
			default:
				var r struct {
					Choices []struct{ Text, FinishReason string }
					Usage   apiUsage
				}
				if err := json.Unmarshal(out, &r); err != nil || len(r.Choices) != 1 || r.Usage.CompletionTokens == 0 {
					t.Errorf("%s printed:\n%s", c, out)
				}
			}
		}
	} else {
		t.Log("curl is not installed: the printed lines were not run")
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("demo after SIGINT: %v\n%s", waitErr, stderr())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not stop within 30 s of SIGINT")
	}
	for _, pid := range children {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d of the demo outlived it (kill -0: %v)", pid, err)
		}
	}
	if !strings.Contains(strings.Join(printed, "\n"), filepath.Join(logs, "NAME.log")+" (kept)") {
		t.Errorf("the demo did not say where its nodes log:\n%s", strings.Join(printed, "\n"))
	}
	for _, name := range []string{"main", "w1", "w2"} { // at -log-level warn a worker's may be empty
		if _, err := os.Stat(filepath.Join(logs, name+".log")); err != nil {
			t.Errorf("%s's log after the demo stopped: %v", name, err)
		}
	}
}

// childPIDs lists the processes whose parent is pid (Linux: /proc); nil
// elsewhere.
func childPIDs(t *testing.T, pid int) []int {
	t.Helper()
	if runtime.GOOS != "linux" {
		return nil
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	children := []int{}
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
			children = append(children, child)
		}
	}
	return children
}
