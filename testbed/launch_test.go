package testbed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logBuffer is a log a test can read while the process still writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits until the log has s (the process got that far).
func (b *logBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("log never showed %q; it has %q", s, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var shell = Local{Files: Paths{Bin: "/bin/sh"}}

// startSh runs script with /bin/sh -c as node name through Local.
func startSh(t *testing.T, name, script string) (*Proc, *logBuffer) {
	t.Helper()
	log := &logBuffer{}
	p, err := shell.Start(Node{Name: name}, []string{"-c", script}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(0) })
	return p, log
}

// endedBy is the signal that ended the process, as Wait reports it.
func endedBy(t *testing.T, err error) syscall.Signal {
	t.Helper()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("Wait() = %v, want an *exec.ExitError", err)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		t.Fatalf("Wait() = %v: not ended by a signal", err)
	}
	return ws.Signal()
}

func TestLocalWaitReportsExitStatus(t *testing.T) {
	p, log := startSh(t, "w7", "echo hi; echo oops >&2; exit 3")
	err := p.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait() = %v, want exit status 3", err)
	}
	if !strings.Contains(err.Error(), "w7") {
		t.Errorf("Wait() = %q, does not name the node w7", err)
	}
	if !p.Exited() {
		t.Error("Exited() = false after Wait")
	}
	if got := log.String(); !strings.Contains(got, "hi\n") || !strings.Contains(got, "oops\n") {
		t.Errorf("log = %q, want stdout (hi) and stderr (oops)", got)
	}
	if p.Node.Name != "w7" {
		t.Errorf("Proc.Node = %+v, want w7", p.Node)
	}
}

func TestLocalWaitSuccess(t *testing.T) {
	p, _ := startSh(t, "w1", "exit 0")
	if err := p.Wait(); err != nil {
		t.Errorf("Wait() = %v, want nil", err)
	}
	p.Stop(time.Second) // a no-op on a process that has ended
}

func TestLocalPassesArgumentsAsTheyAre(t *testing.T) {
	log := &logBuffer{}
	args := []string{"-c", `printf '<%s>' "$@"`, "sh", "two words", "", "it's", "$HOME"}
	p, err := shell.Start(Node{Name: "n"}, args, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if got, want := log.String(), "<two words><><it's><$HOME>"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
}

// A node with cpus= runs on those CPUs alone, and the process Start
// returns is the node itself (taskset exec'd it): its PID is the one
// that Stop signals and CPUTime reads.
func TestLocalStartPinsANodeToItsCPUs(t *testing.T) {
	log := &logBuffer{}
	p, err := shell.Start(Node{Name: "n", CPUs: "0"}, []string{"-c", `echo "pid $$"; grep Cpus_allowed_list /proc/self/status`}, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("pid %d\n", p.cmd.Process.Pid); !strings.Contains(log.String(), want) {
		t.Errorf("output %q, want %q: the process started is not the node", log.String(), want)
	}
	if f := strings.Fields(log.String()); len(f) < 4 || f[len(f)-1] != "0" {
		t.Errorf("output %q, want the node on CPU 0 alone", log.String())
	}
}

func TestLocalStopEndsASleepingProcessWithSIGTERM(t *testing.T) {
	// exec: the shell becomes sleep, so no child outlives it holding the log.
	p, log := startSh(t, "w1", "echo ready; exec sleep 30")
	log.waitFor(t, "ready")
	if p.Exited() {
		t.Fatal("Exited() = true while the process sleeps")
	}
	p.Stop(time.Minute)
	if !p.Exited() {
		t.Error("Exited() = false after Stop")
	}
	// SIGTERM ended it, not the kill after the grace.
	if sig := endedBy(t, p.Wait()); sig != syscall.SIGTERM {
		t.Errorf("ended by %v, want SIGTERM", sig)
	}
}

func TestLocalStopKillsAProcessIgnoringSIGTERMAfterTheGrace(t *testing.T) {
	// The ignored SIGTERM is inherited through exec by sleep.
	p, log := startSh(t, "w1", "trap '' TERM; echo ready; exec sleep 30")
	log.waitFor(t, "ready")
	p.Stop(100 * time.Millisecond)
	if !p.Exited() {
		t.Error("Exited() = false after Stop")
	}
	if sig := endedBy(t, p.Wait()); sig != syscall.SIGKILL {
		t.Errorf("ended by %v, want SIGKILL", sig)
	}
}

func TestLocalStartFailsForAMissingBinary(t *testing.T) {
	l := Local{Files: Paths{Bin: filepath.Join(t.TempDir(), "no-such-odmoe")}}
	p, err := l.Start(Node{Name: "w3"}, nil, &logBuffer{})
	if err == nil {
		p.Stop(0)
		t.Fatal("Start succeeded with a missing binary")
	}
	if !strings.Contains(err.Error(), "w3") {
		t.Errorf("error %q does not name the node", err)
	}
}

func TestStopAllStopsTheLastStartedFirst(t *testing.T) {
	order := filepath.Join(t.TempDir(), "order")
	var procs []*Proc
	for _, name := range []string{"a", "b", "c"} {
		// On SIGTERM, note the name, then end.
		p, log := startSh(t, name, "trap 'echo "+name+" >> "+shellQuote(order)+"; exit 0' TERM; echo ready; while :; do sleep 0.02; done")
		log.waitFor(t, "ready")
		procs = append(procs, p)
	}
	StopAll(procs, time.Minute)
	for _, p := range procs {
		if !p.Exited() {
			t.Errorf("%s still runs after StopAll", p.Node.Name)
		}
	}
	b, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Fields(string(b)), []string{"c", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("stopped in order %q, want %q", got, want)
	}
}

func TestShellQuote(t *testing.T) {
	plain := []string{"run", "-role", "worker", "10.0.0.1:7400", "/opt/odmoe/bin/odmoe", "-resident=0/8", "alice@host", "50%", "a+b,c", "A_Z-09"}
	for _, s := range plain {
		if q := shellQuote(s); q != s {
			t.Errorf("shellQuote(%q) = %q, want it unchanged", s, q)
		}
	}
	nasty := []string{"", "two words", "it's", `"double"`, "$HOME", "${x:-y}", "`id`", "$(id)", "a\nb", "tab\there",
		"*", "?", "[ab]", "~", "~/x", "a;b", "a&b", "a|b", "a>b", "<", "\\", "!", "#x", "'", "''", "'\\''", "é", "x=$y", "(", "{}"}
	for _, s := range nasty {
		q := shellQuote(s)
		if q == s {
			t.Errorf("shellQuote(%q) left it unquoted", s)
		}
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+q).Output()
		if err != nil {
			t.Errorf("sh -c 'printf %%s %s': %v", q, err)
			continue
		}
		if string(out) != s {
			t.Errorf("shellQuote(%q) = %s: the shell reads it as %q", s, q, out)
		}
	}
	// shellJoin keeps every word a word of its own, empty ones included.
	words := append(append([]string{}, plain...), nasty...)
	out, err := exec.Command("/bin/sh", "-c", `printf '%s\0' `+shellJoin(words)).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); !slices.Equal(got, words) {
		t.Errorf("shellJoin: the shell reads %q, want %q", got, words)
	}
}

// fakeSSH writes an ssh that records its arguments (NUL-separated, one
// call per record ending in "\n") to argsFile and runs its last argument,
// the remote command line, with sh on this machine: the remote host.
func fakeSSH(t *testing.T, dir string) (bin, argsFile string) {
	t.Helper()
	bin, argsFile = filepath.Join(dir, "ssh"), filepath.Join(dir, "ssh.args")
	writeScript(t, bin, `{ printf '%s\0' "$@"; echo; } >> `+shellQuote(argsFile)+`
for last; do :; done
exec /bin/sh -c "$last"
`)
	return bin, argsFile
}

func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// readCalls reads the argument lists a fake command recorded.
func readCalls(t *testing.T, argsFile string) [][]string {
	t.Helper()
	b, err := os.ReadFile(argsFile)
	if err != nil {
		t.Fatal(err)
	}
	var calls [][]string
	for rec := range strings.SplitSeq(strings.TrimSuffix(string(b), "\x00\n"), "\x00\n") {
		calls = append(calls, strings.Split(rec, "\x00"))
	}
	return calls
}

func TestSSHStartRunsTheBinaryRemotelyAndStopKillsIt(t *testing.T) {
	tmp := t.TempDir()
	sshBin, sshArgs := fakeSSH(t, tmp)
	// A remote directory that needs quoting.
	dir := filepath.Join(tmp, "remote dir's")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := SSH{Dir: dir, Cmd: []string{sshBin, "-o", "BatchMode=yes"}}
	paths := s.Paths(Node{})
	if paths.Bin != filepath.Join(dir, "odmoe") {
		t.Fatalf("Paths().Bin = %q, want Dir/odmoe", paths.Bin)
	}
	// The remote "odmoe" notes its PID and arguments, then sleeps.
	writeScript(t, paths.Bin, `echo $$ > "$(dirname "$0")/odmoe.pid"
printf '%s\0' "$@" > "$(dirname "$0")/argv"
for a; do printf 'arg: %s\n' "$a"; done
echo ready
exec sleep 30
`)
	n := Node{Name: "w1", Role: "worker", Addr: "10.0.0.5:7400", SSH: "bob@lan-host"}
	args := []string{"run", "-prompt", `it's a "test" $HOME ; exit 1`, "", "two  spaces", "line1\nline2", "*"}
	log := &logBuffer{}
	p, err := s.Start(n, args, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(0) })
	log.waitFor(t, "ready")

	argv, err := os.ReadFile(filepath.Join(dir, "argv"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(argv), "\x00"), "\x00"); !slices.Equal(got, args) {
		t.Errorf("the remote binary got %q, want %q", got, args)
	}
	if !strings.Contains(log.String(), "arg: run\n") {
		t.Errorf("log = %q: the remote output does not reach it", log.String())
	}
	calls := readCalls(t, sshArgs)
	if len(calls) != 1 {
		t.Fatalf("ssh called %d times, want once: %q", len(calls), calls)
	}
	if c := calls[0]; len(c) != 4 || c[0] != "-o" || c[1] != "BatchMode=yes" || c[2] != "bob@lan-host" {
		t.Errorf("ssh arguments %q, want the options, bob@lan-host (the node's SSHTarget) and a command line", c)
	}

	// NAME.pid names the remote process that runs the binary (the shell
	// execs it), so that killing that PID ends the node.
	pid := readPID(t, filepath.Join(dir, "w1.pid"))
	if binPID := readPID(t, filepath.Join(dir, "odmoe.pid")); pid != binPID {
		t.Errorf("w1.pid = %d, but the binary runs as %d", pid, binPID)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("process %d of w1.pid is not running: %v", pid, err)
	}

	p.Stop(time.Minute)
	if !p.Exited() {
		t.Error("Exited() = false after Stop")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d still there after Stop (kill -0: %v)", pid, err)
	}
	// It was the remote kill (SIGTERM) that ended it, not the local kill
	// after the grace.
	if sig := endedBy(t, p.Wait()); sig != syscall.SIGTERM {
		t.Errorf("ended by %v, want SIGTERM from the remote kill", sig)
	}
	calls = readCalls(t, sshArgs)
	if len(calls) != 2 {
		t.Fatalf("ssh called %d times, want twice (start, stop): %q", len(calls), calls)
	}
	if c := calls[1]; len(c) != 4 || c[2] != "bob@lan-host" || !strings.HasPrefix(c[3], "kill ") {
		t.Errorf("stop ran ssh %q, want a kill on bob@lan-host", c)
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: %q is not a PID", path, b)
	}
	return pid
}

func TestSSHPushCopiesTheFilesIntoDirOncePerHost(t *testing.T) {
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	sshBin, sshArgs := fakeSSH(t, bin)
	// scp from PATH: records its arguments and copies to HOST:PATH's PATH.
	scpArgs := filepath.Join(bin, "scp.args")
	writeScript(t, filepath.Join(bin, "scp"), `{ printf '%s\0' "$@"; echo; } >> `+shellQuote(scpArgs)+`
src=; dst=
for a; do src=$dst; dst=$a; done
exec cp -r "$src" "${dst#*:}"
`)
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	local := filepath.Join(tmp, "local")
	files := Paths{Bin: filepath.Join(local, "odmoe"), Model: filepath.Join(local, "Qwen model"),
		Store: filepath.Join(local, "store"), Certs: filepath.Join(local, "certs")}
	content := map[string]string{
		files.Bin: "the binary",
		filepath.Join(files.Model, "config.json"):        "{}",
		filepath.Join(files.Store, "layer0", "e0.bin"):   "expert",
		filepath.Join(files.Certs, "ca.pem"):             "ca",
		filepath.Join(files.Certs, "w1", "cert.pem"):     "w1 cert",
		filepath.Join(files.Model, "tokenizer.json"):     "tok",
		filepath.Join(files.Store, "layer1", "e3.bin"):   "expert 3",
		filepath.Join(files.Certs, "main", "cert.pem"):   "main cert",
		filepath.Join(files.Certs, "shadow", "cert.pem"): "shadow cert",
	}
	for p, c := range content {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	dir := filepath.Join(tmp, "remote", "odmoe dir") // Push makes it
	s := SSH{Dir: dir, Cmd: []string{sshBin}}
	// main and w1 share a login; the shadow is on its address's host.
	r, err := ParseRig(strings.NewReader(`m main 10.0.0.1 ssh=u@box
s shadow 10.0.0.2:7400
w1 worker 10.0.0.3:7400 ssh=u@box
`), "push.rig")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.Push(r, files, false, &out); err != nil {
		t.Fatalf("Push: %v\n%s", err, out.String())
	}

	remote := s.Paths(Node{})
	for local, c := range content {
		// Where the file lands: its root swapped for the remote one.
		var dst string
		for _, m := range [][2]string{{files.Bin, remote.Bin}, {files.Model, remote.Model}, {files.Store, remote.Store}, {files.Certs, remote.Certs}} {
			if rel, err := filepath.Rel(m[0], local); err == nil && !strings.HasPrefix(rel, "..") {
				dst = filepath.Join(m[1], rel)
			}
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			t.Errorf("%s was not pushed to %s: %v", local, dst, err)
		} else if string(b) != c {
			t.Errorf("%s = %q, want %q", dst, b, c)
		}
	}

	// One clean-and-mkdir (an earlier push's files must not survive: scp -r
	// onto an existing folder copies into it) and one copy of each of the
	// four per host, hosts in node order: u@box (m and w1), then 10.0.0.2.
	hosts := []string{"u@box", "10.0.0.2"}
	sshCalls := readCalls(t, sshArgs)
	if len(sshCalls) != len(hosts) {
		t.Fatalf("ssh called %d times, want %d (once per host): %q", len(sshCalls), len(hosts), sshCalls)
	}
	for i, h := range hosts {
		if c := sshCalls[i]; len(c) != 2 || c[0] != h || !strings.HasPrefix(c[1], "rm -rf ") || !strings.Contains(c[1], "/model") || !strings.Contains(c[1], " && mkdir -p ") {
			t.Errorf("ssh call %d = %q, want rm -rf of the old files and mkdir -p on %s", i, c, h)
		}
	}
	scpCalls := readCalls(t, scpArgs)
	if len(scpCalls) != 4*len(hosts) {
		t.Fatalf("scp called %d times, want %d: %q", len(scpCalls), 4*len(hosts), scpCalls)
	}
	for i, c := range scpCalls {
		h := hosts[i/4]
		if !slices.Contains(c, "-r") || !strings.HasPrefix(c[len(c)-1], h+":"+dir+"/") {
			t.Errorf("scp call %d = %q, want a recursive copy to %s:%s/...", i, c, h, dir)
		}
	}
	for _, h := range hosts {
		if !strings.Contains(out.String(), "push "+h+":") {
			t.Errorf("Push output %q does not mention host %s", out.String(), h)
		}
	}

	// with fetch, the binary and certificates alone: what the nodes
	// fetched into the model and store directories stays
	fetched := filepath.Join(remote.Store, "fetched.bin")
	if err := os.WriteFile(fetched, []byte("a chunk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(files.Bin, []byte("a new binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(scpArgs)
	os.Remove(sshArgs)
	out.Reset()
	if err := s.Push(r, files, true, &out); err != nil {
		t.Fatalf("Push with fetch: %v\n%s", err, out.String())
	}
	if b, err := os.ReadFile(fetched); err != nil || string(b) != "a chunk" {
		t.Errorf("a push with fetch removed what the node fetched: %q, %v", b, err)
	}
	if b, err := os.ReadFile(remote.Bin); err != nil || string(b) != "a new binary" {
		t.Errorf("a push with fetch left the binary %q (%v)", b, err)
	}
	if calls := readCalls(t, scpArgs); len(calls) != 2*len(hosts) {
		t.Errorf("a push with fetch called scp %d times, want %d (binary, certificates): %q", len(calls), 2*len(hosts), calls)
	}
	for _, c := range readCalls(t, sshArgs) {
		if strings.Contains(c[1], "/model") || strings.Contains(c[1], "/store") {
			t.Errorf("a push with fetch cleans %q", c[1])
		}
	}
}

func TestSSHPushReportsAFailedCopy(t *testing.T) {
	bin := t.TempDir()
	sshBin, _ := fakeSSH(t, bin)
	writeScript(t, filepath.Join(bin, "scp"), "echo 'scp: permission denied' >&2; exit 1\n")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	r, err := ParseRig(strings.NewReader("m main 10.0.0.1\nw1 worker 10.0.0.3:7400\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	s := SSH{Dir: filepath.Join(bin, "remote"), Cmd: []string{sshBin}}
	err = s.Push(r, Paths{Bin: "/local/odmoe", Model: "/local/model", Store: "/local/store", Certs: "/local/certs"}, false, &bytes.Buffer{})
	if err == nil {
		t.Fatal("Push succeeded with a failing scp")
	}
	for _, w := range []string{"/local/odmoe", "10.0.0.1", "permission denied"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// The emulated rig's state decides which half of this test can run: with
// no rig up, NewNetns must say how to make one; with a rig up, it maps
// each address of RigStateDir/nodes to its namespace.
func TestNewNetns(t *testing.T) {
	nodesFile := filepath.Join(RigStateDir, "nodes")
	_, statErr := os.Stat(nodesFile)
	rigUp := statErr == nil

	t.Run("no rig", func(t *testing.T) {
		if rigUp {
			t.Skipf("an emulated rig is up (%s exists): the no-rig error cannot be provoked without tearing it down", nodesFile)
		}
		_, err := NewNetns(Paths{})
		if err == nil {
			t.Fatal("NewNetns succeeded with no emulated rig")
		}
		if !strings.Contains(err.Error(), "testbed/rig up") {
			t.Errorf("error %q does not say to run testbed/rig up", err)
		}
	})

	t.Run("rig up", func(t *testing.T) {
		if !rigUp {
			t.Skipf("no emulated rig is up (%s: %v): nothing to map", nodesFile, statErr)
		}
		files := Paths{Bin: "/x/odmoe", Model: "/x/model"}
		v, err := NewNetns(files)
		if err != nil {
			t.Fatal(err)
		}
		if v.Name() != "netns" || v.Paths(Node{}) != files {
			t.Errorf("Name %q, Paths %+v; want netns, %+v", v.Name(), v.Paths(Node{}), files)
		}
		f, err := os.Open(nodesFile)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		mapped := 0
		for sc.Scan() { // "<i> <namespace> <ip>"
			fs := strings.Fields(sc.Text())
			if len(fs) != 3 {
				continue
			}
			for _, addr := range []string{fs[2], fs[2] + ":7400"} {
				ns, err := v.Namespace(Node{Name: "n" + fs[0], Addr: addr})
				if err != nil || ns != fs[1] {
					t.Errorf("Namespace(%s) = %q, %v; want %s", addr, ns, err, fs[1])
				}
			}
			mapped++
		}
		if mapped == 0 {
			t.Errorf("%s lists no nodes", nodesFile)
		}
		_, err = v.Namespace(Node{Name: "stray", Addr: "192.0.2.1:7400"})
		if err == nil || !strings.Contains(err.Error(), "stray") || !strings.Contains(err.Error(), "192.0.2.1") {
			t.Errorf("Namespace of an address outside the rig: %v, want an error naming the node and address", err)
		}
	})
}

// TestWatchServersStopsTheMainNodeWhenAServerDies: a worker that ends
// while the main node runs (it failed to bind, ran out of memory) stops
// the main node at once, naming the worker, instead of the main node
// waiting out its dial timeout; a fault's planned victim does not.
func TestWatchServersStopsTheMainNodeWhenAServerDies(t *testing.T) {
	main, log := startSh(t, "main", "echo ready; exec sleep 60")
	log.waitFor(t, "ready")
	alive, _ := startSh(t, "w1", "exec sleep 60")
	dying, _ := startSh(t, "w2", "sleep 0.3; exit 3")
	gone := watchServers(main, []*Proc{alive, dying}, nil)
	if sig := endedBy(t, main.Wait()); sig != syscall.SIGTERM {
		t.Errorf("main ended by %v, want the watcher's SIGTERM", sig)
	}
	if g := gone(); g != dying {
		t.Errorf("watcher names %v, want w2", g)
	}

	// the fault's victim may die: the main node keeps running
	main2, log2 := startSh(t, "main", "echo ready; sleep 1; exit 0")
	log2.waitFor(t, "ready")
	victim, _ := startSh(t, "w1", "exit 0")
	gone = watchServers(main2, []*Proc{victim, alive}, &fault{victim: 0})
	if err := main2.Wait(); err != nil {
		t.Errorf("main with its fault victim dead: %v, want it to run to its end", err)
	}
	if g := gone(); g != nil {
		t.Errorf("watcher names %s for a planned fault", g.Node.Name)
	}
}

// TestProcCPUTimeOfANodeHere: a node process on this machine reports the
// CPU it uses while it runs (from /proc) and once it has ended (from its
// exit status); one reached over ssh reports none.
func TestProcCPUTimeOfANodeHere(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	// a busy loop of ~0.3 s, then a pause while it is read
	p, err := Local{Files: Paths{Bin: sh}}.Start(Node{Name: "w1"}, []string{"-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 0.5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	var running time.Duration
	for time.Now().Before(deadline) {
		d, ok := p.CPUTime()
		if !ok {
			t.Fatal("a running local node's CPU time unreadable")
		}
		if d >= 50*time.Millisecond {
			running = d
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if running == 0 {
		t.Fatal("a busy local node never showed 50 ms of CPU")
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if d, ok := p.CPUTime(); !ok || d < running {
		t.Fatalf("after exit: %v, %v; want at least the %v seen running", d, ok, running)
	}
	if _, ok := (&Proc{}).CPUTime(); ok {
		t.Fatal("a node not on this machine reported CPU time")
	}
}
