package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromium returns the path of Debian's chromium, or skips the test
// (fails it when CI=true: .ci/run installs it).
func chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: .ci/run installs Debian's chromium")
	}
	t.Skip("no chromium on PATH (Debian: apt-get install chromium)")
	return ""
}

// consoleRun is what driveConsole needs of a swarm: the console's
// address, the API key if there is one, its workers, how to kill worker
// w2 and start it again, and the nodes' logs for failures.
type consoleRun struct {
	root, key     string
	workers       int
	kill, restart func()
	logs          func() string
}

// driveConsole opens the console in headless Chromium as a user would:
// gives the API key when the page asks, sees a tile per node (each
// worker's address and memory budget on it), sends a chat message and
// sees the answer stream in and the workers' counters move, then kills
// w2, sees its tile go lost and, once the worker is started again and a
// pass has taken it back, rejoined. Screenshots go to the test's artifact
// directory (go test -artifacts).
func driveConsole(t *testing.T, c consoleRun) {
	browser := chromium(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 820))...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithBrowserOption(chromedp.WithConsolef(t.Logf)))
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 3*time.Minute)
	defer cancelTimeout()
	shot := func(name string) {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		path := filepath.Join(t.ArtifactDir(), name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Error(err)
		}
		t.Logf("screenshot: %s", path)
	}
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			shot("failed")
			t.Fatalf("%s: %v\n%s", what, err, c.logs())
		}
	}
	tile := func(name string) string { return fmt.Sprintf(`.tile[data-node=%q]`, name) }
	run("open the page", chromedp.Navigate(c.root+"/"))
	if c.key != "" { // the feed answers 401 without the key: the page asks for it
		run("give the API key", chromedp.WaitVisible(chromedp.CSS(`#key-box`)), chromedp.SendKeys(chromedp.CSS(`#key`), c.key),
			chromedp.Click(chromedp.CSS(`#key-save`)))
	}
	last := "w" + strconv.Itoa(c.workers)
	run("a tile per node", chromedp.WaitVisible(chromedp.CSS(tile("main"))), chromedp.WaitVisible(chromedp.CSS(tile("shadow"))),
		chromedp.WaitVisible(chromedp.CSS(tile(last))))
	tiles, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('.tile').length`))
	if err != nil || tiles != c.workers+2 {
		t.Fatalf("%d tiles (%v), want %d (main, shadow, %d workers)", tiles, err, c.workers+2, c.workers)
	}
	run("each worker's address", chromedp.Poll[chromedp.Void](fmt.Sprintf(`[...document.querySelectorAll('.tile .role')].filter((e) => /^worker 127\.0\.0\.1:\d+$/.test(e.textContent)).length == %d`, c.workers),
		chromedp.WithPollingTimeout(10*time.Second)))
	run("each worker's memory", chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelectorAll('.tile .memory').length == %d && [...document.querySelectorAll('.tile .memory')].every((e) => / of \d+ MiB$/.test(e.textContent))`, c.workers),
		chromedp.WithPollingTimeout(10*time.Second)))
	const loadsJS = `[...document.querySelectorAll('.tile .loads')].reduce((s, e) => s + Number(e.textContent), 0)`
	before, err := chromedp.Run(ctx, chromedp.Evaluate[int](loadsJS))
	if err != nil {
		t.Fatal(err)
	}
	// Shift+Enter starts a new line and sends nothing; Enter sends
	run("Shift+Enter", chromedp.SendKeys(chromedp.CSS(`#prompt`), "Hello"), chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)))
	if sent, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelectorAll('.msg').length > 0 || !document.getElementById('prompt').value.includes('\n')`)); err != nil || sent {
		shot("failed")
		t.Fatalf("Shift+Enter sent the message or wrote no new line (%v)", err)
	}
	run("chat", chromedp.SendKeys(chromedp.CSS(`#prompt`), "swarm"), chromedp.KeyEvent(kb.Enter),
		chromedp.WaitVisible(chromedp.CSS(`.msg.assistant`)),
		chromedp.Poll[chromedp.Void](`document.querySelector('.msg.assistant .content').textContent.length > 0 && !document.getElementById('send').disabled`,
			chromedp.WithPollingTimeout(time.Minute)))
	answer, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`.msg.assistant .content`)))
	if err != nil || strings.TrimSpace(answer) == "" || strings.HasSuffix(answer, "]") {
		t.Fatalf("the answer %q (%v)", answer, err)
	}
	run("the main node's and the shadow's figures", chromedp.Poll[chromedp.Void](`document.querySelectorAll('.tile[data-node="main"] dd').length >= 4 && document.querySelectorAll('.tile[data-node="shadow"] dd').length >= 4 && document.querySelector('.tile[data-node="main"] dd.tps') !== null`,
		chromedp.WithPollingTimeout(10*time.Second)))
	if timing, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`.msg.assistant .timing`))); err != nil || !strings.Contains(timing, "tokens in") {
		t.Errorf("the turn's timing %q (%v)", timing, err)
	}
	run("the counters move", chromedp.Poll[chromedp.Void](fmt.Sprintf("%s > %d", loadsJS, before), chromedp.WithPollingTimeout(10*time.Second)))
	run("the passes' timeline", chromedp.Poll[chromedp.Void](`document.querySelectorAll('#passes rect').length > 0`, chromedp.WithPollingTimeout(10*time.Second)))
	shot("console")

	c.kill()
	run("w2 lost", chromedp.WaitVisible(chromedp.CSS(tile("w2")+`[data-state="lost"]`)))
	shot("worker-lost")
	c.restart()
	// a worker that answers again rejoins the layout when a pass starts:
	// chat until one has
	rejoined := false
	for try := 0; try < 8 && !rejoined; try++ {
		run("chat again", chromedp.SendKeys(chromedp.CSS(`#prompt`), "Again"), chromedp.Click(chromedp.CSS(`#send`)),
			chromedp.Poll[chromedp.Void](`!document.getElementById('send').disabled`, chromedp.WithPollingTimeout(time.Minute)))
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('.tile[data-node="w2"]').dataset.state`))
		if err != nil {
			t.Fatal(err)
		}
		rejoined = state == "rejoined"
	}
	if !rejoined {
		shot("failed")
		t.Fatalf("w2 never rejoined\n%s", c.logs())
	}
	shot("worker-rejoined")
}

// TestConsoleInARealBrowser drives the console of a swarm of processes
// serving the API with a key (4 workers, an int8 shadow): driveConsole's
// walk, the key given when the page asks.
func TestConsoleInARealBrowser(t *testing.T) {
	chromium(t)
	s := startAPISwarm(t)
	driveConsole(t, consoleRun{root: strings.TrimSuffix(s.base, "/v1"), key: apiTestKey, workers: 4, logs: s.logs,
		kill: func() { s.signal("w2", syscall.SIGKILL) },
		restart: func() {
			s.start("w2", "run", "-role", "worker", "-listen", s.workers[1], "-store", s.store, "-certs", filepath.Join(s.dir, "certs"), "-name", "w2",
				"-device-mem", "64MiB", "-log-level", "warn")
		}})
}

// TestConsoleOnTheDemoInARealBrowser drives the console of `odmoe demo`
// serving (4 workers): the address it prints, then driveConsole's walk,
// w2 killed by its pid and started again with the command line the demo
// gave it.
func TestConsoleOnTheDemoInARealBrowser(t *testing.T) {
	chromium(t)
	cache, logs := t.TempDir(), filepath.Join(t.TempDir(), "logs")
	cmd := exec.Command(odmoeBin(t), "demo", "-workers", "4", "-cache", cache, "-http", "127.0.0.1:0", "-log-level", "warn", "-logs", logs)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its nodes die with it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var restarted *exec.Cmd
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		if restarted != nil {
			restarted.Process.Kill()
			restarted.Wait()
		}
	})
	nodeLogs := func() string {
		var b strings.Builder
		for _, n := range []string{"main", "shadow", "w2"} {
			data, _ := os.ReadFile(filepath.Join(logs, n+".log"))
			fmt.Fprintf(&b, "--- %s\n%s\n", n, tail(string(data), 20))
		}
		return b.String()
	}
	root := ""
	sc := bufio.NewScanner(stdout)
	addr := regexp.MustCompile(`console .* in a browser: (http://127\.0\.0\.1:\d+)/$`)
	for root == "" && sc.Scan() {
		if m := addr.FindStringSubmatch(sc.Text()); m != nil {
			root = m[1]
		}
	}
	if root == "" {
		t.Fatalf("the demo printed no console address\n%s", nodeLogs())
	}
	go func() { // keep its stdout drained
		for sc.Scan() {
		}
	}()
	var argv []string
	driveConsole(t, consoleRun{root: root, workers: 4, logs: nodeLogs,
		kill: func() {
			pid, args := findProcess(t, "-name=w2", cache)
			argv = args
			syscall.Kill(pid, syscall.SIGKILL)
		},
		restart: func() {
			out, err := os.OpenFile(filepath.Join(logs, "w2.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			restarted = exec.Command(argv[0], argv[1:]...)
			restarted.Stdout, restarted.Stderr = out, out
			if err := restarted.Start(); err != nil {
				t.Fatal(err)
			}
		}})
}

// findProcess returns the pid and command line of the one process whose
// command line has every one of parts.
func findProcess(t *testing.T, parts ...string) (int, []string) {
	t.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		line := strings.Join(args, " ")
		match := true
		for _, p := range parts {
			match = match && strings.Contains(line, p)
		}
		if match {
			return pid, args
		}
	}
	t.Fatalf("no process with %q in its command line", parts)
	return 0, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
