package testbed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/odmoe/odmoe/internal/procmem"
)

// Paths are where a node finds the odmoe binary and the files it needs.
type Paths struct {
	Bin, Model, Store, Certs string
}

// Via starts nodes: on this machine, in the emulated rig's network
// namespaces, or over ssh on a real LAN.
type Via interface {
	// Name is "local", "netns" or "ssh".
	Name() string
	// Paths are the files as node n sees them.
	Paths(n Node) Paths
	// Start runs args (after the binary) as node n, its output to log.
	Start(n Node, args []string, log io.Writer) (*Proc, error)
}

// Proc is a started node process.
type Proc struct {
	Node Node
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	stop func() error // asks the node to stop (SIGTERM, or kill over ssh)
	kill func() error // kills the node at once (SIGKILL), as a crash would
	// here: the process is the node itself, on this machine (not an ssh
	// client), so its CPU time is the node's
	here bool
}

func startProc(n Node, cmd *exec.Cmd, log io.Writer, stop, kill func(p *Proc) error) (*Proc, error) {
	cmd.Stdout, cmd.Stderr = log, log
	// a killed process's children may still hold a piped log open: do not
	// wait on them for long
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("testbed: starting %s: %w", n.Name, err)
	}
	p := &Proc{Node: n, cmd: cmd, done: make(chan struct{})}
	p.stop = func() error { return stop(p) }
	p.kill = func() error { return kill(p) }
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// CPUTime is the CPU time (user and system) the node has used so far, if
// it runs on this machine (false over ssh, or if it cannot be read): from
// /proc while it runs, from its exit status once it has ended.
func (p *Proc) CPUTime() (time.Duration, bool) {
	if !p.here {
		return 0, false
	}
	if p.Exited() {
		if st := p.cmd.ProcessState; st != nil {
			return st.UserTime() + st.SystemTime(), true
		}
		return 0, false
	}
	return procmem.CPUTimeOf(p.cmd.Process.Pid)
}

// PeakRSS is the node's peak resident set size so far in bytes, if it
// runs on this machine and still runs (false over ssh, once it has
// ended, or if it cannot be read).
func (p *Proc) PeakRSS() (int64, bool) {
	if !p.here || p.Exited() {
		return 0, false
	}
	b := procmem.PeakRSSOf(p.cmd.Process.Pid)
	return b, b > 0
}

// Wait waits for the process to end by itself.
func (p *Proc) Wait() error {
	<-p.done
	if p.err != nil {
		return fmt.Errorf("testbed: %s: %w", p.Node.Name, p.err)
	}
	return nil
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop asks the process to end, waits up to grace, then kills it.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	p.stop()
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill ends the node at once, as a crash or a power cut would, and waits
// for it to be gone.
func (p *Proc) Kill() error {
	if p.Exited() {
		return nil
	}
	if err := p.kill(); err != nil {
		return fmt.Errorf("testbed: killing %s: %w", p.Node.Name, err)
	}
	<-p.done
	return nil
}

func signalStop(p *Proc) error { return p.cmd.Process.Signal(syscall.SIGTERM) }
func signalKill(p *Proc) error { return p.cmd.Process.Kill() }

// Local starts nodes as processes on this machine, with no network
// isolation (addresses must be local ones, e.g. 127.0.0.x).
type Local struct{ Files Paths }

func (Local) Name() string       { return "local" }
func (l Local) Paths(Node) Paths { return l.Files }
func (l Local) Start(n Node, args []string, log io.Writer) (*Proc, error) {
	argv := n.Argv(l.Files.Bin, args)
	p, err := startProc(n, exec.Command(argv[0], argv[1:]...), log, signalStop, signalKill)
	if p != nil {
		p.here = true
	}
	return p, err
}

// RigStateDir is where testbed/rig keeps the emulated rig's state.
const RigStateDir = "/run/odmoe-rig"

// Netns starts each node in the network namespace of the emulated rig
// (testbed/rig up) that owns the node's address.
type Netns struct {
	Files Paths
	ns    map[string]string // IP -> namespace
}

// NewNetns reads the rig's node table (RigStateDir/nodes).
func NewNetns(files Paths) (*Netns, error) {
	f, err := os.Open(path.Join(RigStateDir, "nodes"))
	if err != nil {
		return nil, fmt.Errorf("testbed: no emulated rig (run testbed/rig up N first): %w", err)
	}
	defer f.Close()
	v := &Netns{Files: files, ns: map[string]string{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) == 3 {
			v.ns[fs[2]] = fs[1]
		}
	}
	return v, sc.Err()
}

func (*Netns) Name() string       { return "netns" }
func (v *Netns) Paths(Node) Paths { return v.Files }
func (v *Netns) Namespace(n Node) (string, error) {
	ns, ok := v.ns[n.Host()]
	if !ok {
		return "", fmt.Errorf("testbed: node %s's address %s is not one of the emulated rig's (see %s/nodes; is the rig up with enough nodes?)", n.Name, n.Host(), RigStateDir)
	}
	return ns, nil
}

func (v *Netns) Start(n Node, args []string, log io.Writer) (*Proc, error) {
	ns, err := v.Namespace(n)
	if err != nil {
		return nil, err
	}
	// ip netns exec enters the namespace and execs the binary (taskset
	// too, when the node has CPUs of its own): the process we signal is
	// the node itself.
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, n.Argv(v.Files.Bin, args)...)...)
	p, err := startProc(n, cmd, log, signalStop, signalKill)
	if p != nil {
		p.here = true
	}
	return p, err
}

// SSH starts nodes on the hosts of a real LAN. Each node's files live in
// Dir on its host (Push puts them there); the node's shell PID goes to
// Dir/NAME.pid so that Stop can end it, since ending the local ssh
// client does not end the remote process.
type SSH struct {
	Dir string   // remote directory, absolute
	Cmd []string // the ssh command and options; default ssh -o BatchMode=yes
}

func (s SSH) ssh() []string {
	if len(s.Cmd) > 0 {
		return s.Cmd
	}
	return []string{"ssh", "-o", "BatchMode=yes"}
}

func (SSH) Name() string { return "ssh" }

func (s SSH) Paths(Node) Paths {
	return Paths{Bin: path.Join(s.Dir, "odmoe"), Model: path.Join(s.Dir, "model"), Store: path.Join(s.Dir, "store"), Certs: path.Join(s.Dir, "certs")}
}

// remote runs a shell command line on node n's host.
func (s SSH) remote(n Node, line string) *exec.Cmd {
	argv := append(append([]string{}, s.ssh()...), n.SSHTarget(), line)
	return exec.Command(argv[0], argv[1:]...)
}

func (s SSH) Start(n Node, args []string, log io.Writer) (*Proc, error) {
	pid := path.Join(s.Dir, n.Name+".pid")
	line := fmt.Sprintf("echo $$ > %s && exec %s", shellQuote(pid), shellJoin(n.Argv(s.Paths(n).Bin, args)))
	return startProc(n, s.remote(n, line), log, func(p *Proc) error {
		return s.remote(n, fmt.Sprintf("kill $(cat %s)", shellQuote(pid))).Run()
	}, func(p *Proc) error {
		return s.remote(n, fmt.Sprintf("kill -9 $(cat %s)", shellQuote(pid))).Run()
	})
}

// Push copies the binary, model, store and certificates from files to
// every node's host, with ssh and scp, replacing what an earlier push
// left there; with fetch, the binary and certificates alone: the nodes
// fetch their weights from the main node, into the model and store
// directories kept there (what an earlier start fetched stays).
func (s SSH) Push(r *Rig, files Paths, fetch bool, out io.Writer) error {
	scp := []string{"scp", "-q", "-r", "-o", "BatchMode=yes"}
	done := map[string]bool{}
	for _, n := range r.Nodes() {
		host := n.SSHTarget()
		if done[host] {
			continue
		}
		done[host] = true
		dst := s.Paths(n)
		copies := [][2]string{{files.Bin, dst.Bin}, {files.Certs, dst.Certs}, {files.Model, dst.Model}, {files.Store, dst.Store}}
		what := "binary, certificates, model, store"
		if fetch {
			copies, what = copies[:2], "binary, certificates (the nodes fetch their weights)"
		}
		fmt.Fprintf(out, "push %s: %s -> %s:%s\n", host, what, host, s.Dir)
		var stale []string
		for _, c := range copies {
			stale = append(stale, c[1])
		}
		clean := fmt.Sprintf("rm -rf %s && mkdir -p %s", shellJoin(stale), shellQuote(s.Dir))
		if b, err := s.remote(n, clean).CombinedOutput(); err != nil {
			return fmt.Errorf("testbed: %s: mkdir %s: %w: %s", host, s.Dir, err, b)
		}
		for _, c := range copies {
			if b, err := exec.Command(scp[0], append(scp[1:], c[0], host+":"+c[1])...).CombinedOutput(); err != nil {
				return fmt.Errorf("testbed: copying %s to %s:%s: %w: %s", c[0], host, c[1], err, b)
			}
		}
	}
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// StopAll stops procs, the last started first.
func StopAll(procs []*Proc, grace time.Duration) {
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(grace)
	}
}

// errExited is returned when a server node ends while it should serve.
var errExited = errors.New("exited early")

// Up starts the rig's servers (workers, and the shadow in shadow mode) as
// mode says, each node's log in logDir, first pushing the binary and the
// files to every host when push (ssh only); it prints the command line
// that runs the main node there, and keeps the servers up until ctx ends
// (`odmoe launch`).
func Up(ctx context.Context, opt BenchOptions, mode Mode, push bool, logDir string, stdout io.Writer) error {
	rig, via := opt.Rig, opt.Via
	if push {
		s, ok := via.(SSH)
		if !ok {
			return fmt.Errorf("testbed: pushing the files is for ssh rigs")
		}
		if err := s.Push(rig, opt.Files, opt.Fetch, stdout); err != nil {
			return err
		}
	}
	procs, err := StartServers(opt, mode, logDir)
	defer StopAll(procs, 10*time.Second)
	if err != nil {
		return err
	}
	line := shellJoin(rig.Main.Argv(opt.Files.Bin, MainFlags(opt, mode).Args())) + " -prompt 'Hello'"
	where := "on this host (" + rig.Main.Host() + ")"
	if nv, ok := via.(*Netns); ok {
		ns, err := nv.Namespace(rig.Main)
		if err != nil {
			return err
		}
		line, where = "ip netns exec "+ns+" "+line, "in its namespace"
	}
	fmt.Fprintf(stdout, "rig up: %d node processes (%s), logs in %s. Run the main node %s with:\n  %s\nCtrl-C stops them.\n",
		len(procs), mode, logDir, where, line)
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping the rig's nodes")
	return nil
}
