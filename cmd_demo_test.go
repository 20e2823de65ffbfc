package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
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
	d := startServingDemo(t, "-workers", "2", "-cache", cache, "-http", "127.0.0.1:0", "-log-level", "warn", "-logs", logs)
	cmd, printed, curls, stderr, exited := d.cmd, d.printed, d.curls, d.stderr, d.exited
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
		if *d.waitErr != nil {
			t.Fatalf("demo after SIGINT: %v\n%s", *d.waitErr, stderr())
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

// demoRun is an `odmoe demo` serving, started by startServingDemo.
type demoRun struct {
	cmd            *exec.Cmd
	printed, curls []string
	stderr         func() string
	exited         chan struct{}
	waitErr        *error
}

// startServingDemo starts `odmoe demo` with args in a process group of
// its own (killed, children and all, when the test ends) and waits until
// it has printed its two curl lines.
func startServingDemo(t *testing.T, args ...string) *demoRun {
	t.Helper()
	cmd := exec.Command(odmoeBin(t), append([]string{"demo"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderrFile, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stderrFile.Close() })
	cmd.Stderr = stderrFile
	d := &demoRun{cmd: cmd, stderr: func() string { b, _ := os.ReadFile(stderrFile.Name()); return string(b) },
		exited: make(chan struct{}), waitErr: new(error)}
	// its own process group: the cleanup can kill the demo's children
	// too, which hold its stdout open after the demo itself is killed
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads any more
			}
		}
		close(lines)
		*d.waitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			t.Error("the demo's stdout stayed open 30 s after its process group was killed")
		}
	})
	timeout := time.After(2 * time.Minute)
	for len(d.curls) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("demo exited without serving:\n%s\n%s", strings.Join(d.printed, "\n"), d.stderr())
			}
			d.printed = append(d.printed, l)
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "curl ") {
				d.curls = append(d.curls, l)
			}
		case <-timeout:
			t.Fatalf("demo printed no curl lines within 2 minutes:\n%s\n%s", strings.Join(d.printed, "\n"), d.stderr())
		}
	}
	return d
}

// TestDemoTakesAKeyAnOriginAndItsPorts: `odmoe demo -api-key K
// -cors-origin O -listen-base P` serves on P with the key required and O's
// pages allowed, and every node listens on a port from P to P+20; the
// curl lines it prints send the key; run's serving flags (here
// -served-model-name, -max-batch) reach the main node.
func TestDemoTakesAKeyAnOriginAndItsPorts(t *testing.T) {
	base := 18400
	for ; base < 30000; base += 100 { // 18400 unless a port there is taken
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base)); err == nil {
			ln.Close()
			break
		}
	}
	const origin = "http://page.example"
	d := startServingDemo(t, "-workers", "2", "-cache", t.TempDir(), "-api-key", "sk-demo", "-cors-origin", origin,
		"-listen-base", strconv.Itoa(base), "-log-level", "warn", "-served-model-name", "swarm", "-max-batch", "3")
	root := fmt.Sprintf("http://127.0.0.1:%d", base)
	if !strings.Contains(strings.Join(d.printed, "\n"), root+"/v1") || !strings.Contains(d.curls[0], "Authorization: Bearer $ODMOE_API_KEY") {
		t.Errorf("the demo's lines:\n%s", strings.Join(d.printed, "\n"))
	}
	get := func(path, key, origin string) *http.Response {
		req, _ := http.NewRequest("GET", root+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := get("/v1/models", "", ""); r.StatusCode != 401 {
		t.Errorf("/v1/models without the key: %d", r.StatusCode)
	}
	if r := get("/v1/models/swarm", "sk-demo", origin); r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != origin {
		t.Errorf("/v1/models/swarm (the name passed on) with the key from %s: %d, Allow-Origin %q", origin, r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
	}
	// every node's -listen, from its command line (the main node's is the API's -http)
	listens, batch := 0, false
	for _, pid := range childPIDs(t, d.cmd.Process.Pid) {
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		for _, arg := range strings.Split(string(raw), "\x00") {
			batch = batch || arg == "-max-batch=3"
			for _, flag := range []string{"-listen=", "-http="} {
				if addr, ok := strings.CutPrefix(arg, flag); ok {
					listens++
					_, port, _ := net.SplitHostPort(addr)
					if p, _ := strconv.Atoi(port); p < base || p > base+20 {
						t.Errorf("process %d listens on %s: not in %d-%d", pid, addr, base, base+20)
					}
				}
			}
		}
	}
	if runtime.GOOS == "linux" && (listens != 4 || !batch) {
		t.Errorf("%d nodes' addresses found, want 4 (2 workers, the shadow, the main node's API); -max-batch=3 passed on: %v", listens, batch)
	}
	// the nodes' addresses, as the console shows them
	resp := get("/console/events", "sk-demo", "")
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var snap struct {
			Nodes []struct{ Name, Addr string }
		}
		if err := json.Unmarshal([]byte(data), &snap); err != nil {
			t.Fatal(err)
		}
		workers := 0
		for _, n := range snap.Nodes {
			if n.Addr == "" {
				continue
			}
			workers++
			_, port, _ := net.SplitHostPort(n.Addr)
			if p, _ := strconv.Atoi(port); p <= base || p > base+20 {
				t.Errorf("node %s on %s: not in %d-%d", n.Name, n.Addr, base, base+20)
			}
		}
		if workers != 2 {
			t.Errorf("%d nodes with addresses in the console, want the 2 workers: %s", workers, data)
		}
		return
	}
	t.Fatalf("no console snapshot: %v", sc.Err())
}
