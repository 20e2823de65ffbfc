package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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

// TestConsoleInARealBrowser opens the console of a swarm of processes
// (4 workers, an int8 shadow, the main node serving the API with a key)
// in headless Chromium, as a user would: it gives the API key when the
// page asks, sees a tile per node, sends a chat message and sees the
// answer stream in and the workers' counters move, then sees a killed
// worker's tile go lost and, once the worker is started again and the
// next pass has taken it back, rejoined.
// Screenshots go to the test's artifact directory (go test -artifacts).
func TestConsoleInARealBrowser(t *testing.T) {
	browser := chromium(t)
	s := startAPISwarm(t)
	root := strings.TrimSuffix(s.base, "/v1")
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
			t.Fatalf("%s: %v\n%s", what, err, s.logs())
		}
	}
	tile := func(name string) string { return fmt.Sprintf(`.tile[data-node=%q]`, name) }
	// the feed answers 401 without the key: the page asks for it
	run("open the page and give the API key", chromedp.Navigate(root+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#key-box`)), chromedp.SendKeys(chromedp.CSS(`#key`), apiTestKey), chromedp.Click(chromedp.CSS(`#key-save`)))
	run("a tile per node", chromedp.WaitVisible(chromedp.CSS(tile("main"))), chromedp.WaitVisible(chromedp.CSS(tile("shadow"))), chromedp.WaitVisible(chromedp.CSS(tile("w4"))))
	tiles, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('.tile').length`))
	if err != nil || tiles != 6 {
		t.Fatalf("%d tiles (%v), want 6 (main, shadow, 4 workers)", tiles, err)
	}
	const loadsJS = `[...document.querySelectorAll('.tile .loads')].reduce((s, e) => s + Number(e.textContent), 0)`
	loads := func() int {
		sum, err := chromedp.Run(ctx, chromedp.Evaluate[int](loadsJS))
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	before := loads()
	run("chat", chromedp.SendKeys(chromedp.CSS(`#prompt`), "Hello swarm"), chromedp.Click(chromedp.CSS(`#send`)),
		chromedp.WaitVisible(chromedp.CSS(`.msg.assistant`)),
		chromedp.Poll[chromedp.Void](`document.querySelector('.msg.assistant .content').textContent.length > 0 && !document.getElementById('send').disabled`,
			chromedp.WithPollingTimeout(time.Minute)))
	answer, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`.msg.assistant .content`)))
	if err != nil || strings.TrimSpace(answer) == "" || strings.HasSuffix(answer, "]") {
		t.Fatalf("the answer %q (%v)", answer, err)
	}
	run("each worker's address", chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('.tile .role')].filter((e) => /^worker 127\.0\.0\.1:\d+$/.test(e.textContent)).length == 4`,
		chromedp.WithPollingTimeout(10*time.Second)))
	run("each worker's memory", chromedp.Poll[chromedp.Void](`document.querySelectorAll('.tile .memory').length == 4 && [...document.querySelectorAll('.tile .memory')].every((e) => e.textContent.endsWith('of 64 MiB'))`,
		chromedp.WithPollingTimeout(10*time.Second)))
	run("the counters move", chromedp.Poll[chromedp.Void](fmt.Sprintf("%s > %d", loadsJS, before), chromedp.WithPollingTimeout(10*time.Second)))
	shot("console")
	t.Logf("answer %q; workers' loads %d -> %d", answer, before, loads())

	s.signal("w2", syscall.SIGKILL)
	run("w2 lost", chromedp.WaitVisible(chromedp.CSS(tile("w2")+`[data-state="lost"]`)))
	shot("worker-lost")
	i := 1
	s.start("w2", "run", "-role", "worker", "-listen", s.workers[i], "-store", s.store, "-certs", filepath.Join(s.dir, "certs"), "-name", "w"+strconv.Itoa(i+1),
		"-device-mem", "64MiB", "-log-level", "warn")
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
		t.Fatalf("w2 never rejoined\n%s", s.logs())
	}
	shot("worker-rejoined")
}
