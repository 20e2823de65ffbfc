// Package procswarm runs a swarm's workers and shadow as processes of
// this binary on loopback QUIC with mutual TLS, each logging to its own
// file, and starts the main node the caller asks for: what `odmoe demo`
// and `odmoe bench serve` run on.
package procswarm

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/internal/cpuset"
	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/shadow"
)

// Options say which nodes a procSwarm starts and how.
type Options struct {
	Workers int
	Group   int // workers per group; 0: the main node's default
	// Prefetch is the main node's -prefetch; "shadow" starts a shadow node.
	Prefetch string
	Quant    string // the shadow's weight format
	Ahead    int    // the shadow's -ahead
	// ShadowStages, above 1, splits the shadow into that many stages of
	// consecutive layers (as even as they divide): the first follows the
	// main node, the others (shadow2, ...) hold the later layers.
	ShadowStages int
	// Stages, above 0, puts the main node's layers on that many stage
	// processes (stage1, ...: -role stage, their layers as even as they
	// divide), the main node holding none (-stages).
	Stages int
	// DeviceMem and LoadBW are the workers' -device-mem and -load-bw.
	DeviceMem, LoadBW string
	// HostCache and HostPreload are the workers' -host-cache and
	// -host-preload ("" and false: none, as the workers default).
	HostCache   string
	HostPreload bool
	// Residency is the main node's -residency (off, on).
	Residency string
	// ProfileDir, when set, has every node write its CPU profile there
	// (-cpuprofile DIR/NAME.pprof) as it ends.
	ProfileDir string
	// LogDir, when set, is where the nodes' logs go (NAME.log), kept
	// after Close; "": a temporary directory Close removes.
	LogDir string
	// CPUs, when set (taskset's list: 0-13), are the CPUs every node
	// process runs on, the main node's too: a benchmark run under
	// taskset on other CPUs keeps its clients off the swarm's cores.
	CPUs string
	// NetDelay is every node's -net-delay (the main node's too): a LAN's
	// latency on loopback. 0: none.
	NetDelay time.Duration
	// Draft is the main node's -draft ("": its default, off).
	Draft string
	// ListenBase, when set, puts the workers on the loopback UDP ports
	// after it (ListenBase+1, +2, ...), then the shadow and its stages;
	// 0: free ports anywhere below the kernel's ephemeral range.
	ListenBase int
}

// ports hands out the nodes' addresses as o says.
type ports struct{ next int }

func (p *ports) addr() (string, error) {
	if p.next == 0 {
		return FreeAddr()
	}
	p.next++
	if p.next > 65535 {
		return "", fmt.Errorf("-listen-base: ports past 65535")
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.next)), nil
}

// Register adds the flags that choose a Swarm's nodes (demo, bench
// serve) to fs, writing into o.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.IntVar(&o.Workers, "workers", 8, "worker processes")
	fs.IntVar(&o.Group, "group", 0, "workers per group; 0 = the router's top-k, or the largest size below it that the workers split into evenly")
	fs.StringVar(&o.Prefetch, "prefetch", "shadow", "loading policy: shadow (a quantized shadow node predicts), reactive, oracle-next, random")
	fs.StringVar(&o.Quant, "quant", "int8", "the shadow's weight format: fp16, int8, nf4")
	fs.IntVar(&o.Ahead, "ahead", shadow.DefaultAhead, "the shadow's -ahead: passes it may run past its alignment on its own tokens (0 = OD-MoE's late departure)")
	fs.IntVar(&o.Stages, "stages", 0, "put the main node's layers on `N` stage processes (-role stage) of consecutive layers, each running its layers' experts on the workers; the main node keeps the embedding and the head (0 = it holds every layer)")
	fs.IntVar(&o.ShadowStages, "shadow-stages", 1, "split the shadow into `N` stages of consecutive layers, each a process holding its share of the quantized copy (-layers, -stages)")
	fs.StringVar(&o.DeviceMem, "device-mem", "1GiB", "each worker's device memory budget")
	fs.StringVar(&o.LoadBW, "load-bw", "0", "pace each worker's expert loads (bytes/s, e.g. 4GB); 0 = unpaced")
	fs.StringVar(&o.HostCache, "host-cache", "", "each worker's -host-cache (decompressed experts kept in host RAM, e.g. 2GiB, as paper.rig's nodes); empty = none")
	fs.BoolVar(&o.HostPreload, "host-preload", false, "workers fill -host-cache at start (-host-preload)")
	fs.StringVar(&o.Residency, "residency", "off", "the main node's -residency: off (cacheless workers) or on (experts stay resident on their owners while -device-mem allows)")
	fs.StringVar(&o.LogDir, "logs", "", "write every node's log to `DIR`/NAME.log and keep them (default: a temporary directory, removed when the swarm stops)")
	fs.StringVar(&o.CPUs, "node-cpus", "", "run every node process on these `CPUs` alone (taskset -c LIST, e.g. 0-13); run the command itself under taskset on others to keep its clients apart from the swarm")
	fs.DurationVar(&o.NetDelay, "net-delay", 0, "every node's -net-delay `D`, the main node's too: a LAN's one-way latency on loopback (at least half this machine's timer grain, ~1.1 ms, or it is not applied); 0 = none")
	fs.StringVar(&o.Draft, "draft", "", "the main node's -draft: off, auto or K (default off)")
	fs.StringVar(&o.ProfileDir, "profile", "", "every node (main, shadow, workers) writes its CPU profile to `DIR`/NAME.pprof as it ends (go tool pprof)")
}

// Swarm is a swarm's workers (and shadow) running as processes of
// this binary on loopback QUIC with mutual TLS, each logging to its own
// file; the main node is the caller's to start (MainFlags, RunNode). demo and
// bench serve run on it.
type Swarm struct {
	files   inproc.Files
	ports   ports // the nodes' addresses (Options.ListenBase)
	group   int
	workers []string // addresses, in layout order
	shadow  string   // the shadow's address; "" without one
	// dialTimeout is the main node's and the shadow's -dial-timeout:
	// long while the workers fill their host caches
	dialTimeout     time.Duration
	logDir          string
	keepLogs        bool   // logDir is the caller's (Options.LogDir): Close keeps it
	residency       string // the main node's -residency; "" as off
	profileDir      string // where nodes write their CPU profiles; "" none
	cpus            string // the CPUs every node runs on (taskset -c); "" any
	stop            context.CancelFunc
	procs           []*exec.Cmd // worker i at i (RestartWorker keeps it there), then the shadow and stages, then ended workers
	shadowCmd       *exec.Cmd   // the shadow's (its first stage's), among procs; nil without one
	shadowStageCmds []*exec.Cmd // a staged shadow's later stages, among procs
	stages          string      // the main node's stages' addresses (-stages), "" without
	stageCmds       []*exec.Cmd // the main node's stages, among procs
	mainNode        *Node       // the caller's main node, once runNode started it
	// netDelay and draft are the main node's -net-delay and -draft
	netDelay time.Duration
	draft    string
	opt      Options // as started: RestartWorker starts a worker as Start did
	wctx     context.Context
}

// Start starts o.Workers workers (w1..wN of f.Certs) and, with
// o.Prefetch shadow, a shadow, as child processes. Close stops them.
func Start(ctx context.Context, f inproc.Files, o Options) (_ *Swarm, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if o.CPUs != "" {
		if err := cpuset.Check(o.CPUs); err != nil {
			return nil, fmt.Errorf("-node-cpus: %w", err)
		}
	}
	logDir, keepLogs := o.LogDir, o.LogDir != ""
	if keepLogs {
		err = os.MkdirAll(logDir, 0o755)
	} else {
		logDir, err = os.MkdirTemp("", "odmoe-swarm-")
	}
	if err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(ctx)
	s := &Swarm{files: f, group: o.Group, logDir: logDir, keepLogs: keepLogs, stop: stop, dialTimeout: 30 * time.Second, residency: o.Residency, profileDir: o.ProfileDir, cpus: o.CPUs, netDelay: o.NetDelay, draft: o.Draft,
		opt: o, wctx: wctx}
	if s.profileDir != "" {
		if err := os.MkdirAll(s.profileDir, 0o755); err != nil {
			return nil, fmt.Errorf("-profile: %w", err)
		}
	}
	if o.HostPreload {
		s.dialTimeout = 10 * time.Minute // the workers answer once their host caches are full
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.ports = ports{next: o.ListenBase}
	for i := range o.Workers {
		addr, err := s.ports.addr()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("w%d", i+1)
		w := s.workerFlags(name, addr)
		if err := s.start(wctx, self, name, w.Args()...); err != nil {
			return nil, err
		}
		s.workers = append(s.workers, addr)
	}
	if o.Stages > 0 {
		if err := s.startMainStages(wctx, self, f, o); err != nil {
			return nil, err
		}
	}
	if o.Prefetch == "shadow" {
		addr, err := s.ports.addr()
		if err != nil {
			return nil, err
		}
		sh := runflags.For(runflags.RoleShadow)
		sh.Model, sh.Quant, sh.Listen, sh.Workers, sh.Group, sh.DialTimeout, sh.Ahead = f.Model, o.Quant, addr, strings.Join(s.workers, ","), o.Group, s.dialTimeout, o.Ahead
		sh.Cluster.NetDelay = o.NetDelay
		sh.Cluster.Certs, sh.Cluster.Name, sh.Log.Level = f.Certs, "shadow", "warn"
		if o.ShadowStages > 1 {
			if sh.Layers, sh.Stages, err = s.startShadowStages(wctx, self, f, o); err != nil {
				return nil, err
			}
		}
		if err := s.start(wctx, self, "shadow", sh.Args()...); err != nil {
			return nil, err
		}
		s.shadow, s.shadowCmd = addr, s.procs[len(s.procs)-1]
	}
	return s, nil
}

// workerFlags are worker name's flags on addr, as Start starts it.
func (s *Swarm) workerFlags(name, addr string) runflags.Flags {
	o := s.opt
	w := runflags.For(runflags.RoleWorker)
	w.Listen, w.Store, w.DeviceMem, w.LoadBW, w.HostPreload = addr, s.files.Store, o.DeviceMem, o.LoadBW, o.HostPreload
	w.HostCache = cmp.Or(o.HostCache, w.HostCache)
	w.Cluster.NetDelay = o.NetDelay
	w.Cluster.Certs, w.Cluster.Name, w.Log.Level = s.files.Certs, name, "warn"
	return w
}

// KillWorker ends worker i (0-based, layout order) at once (SIGKILL),
// as a crash would, and waits for it.
func (s *Swarm) KillWorker(i int) error {
	if i < 0 || i >= len(s.workers) {
		return fmt.Errorf("procswarm: no worker %d", i)
	}
	p := s.procs[i]
	if err := p.Process.Kill(); err != nil {
		return err
	}
	p.Wait()
	return nil
}

// RestartWorker starts worker i again at its address, logging to
// logName.log, with its flags as Start gave them and then as edit
// changes them (its store, -fetch-from, ...).
func (s *Swarm) RestartWorker(i int, logName string, edit func(*runflags.Flags)) error {
	if i < 0 || i >= len(s.workers) {
		return fmt.Errorf("procswarm: no worker %d", i)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	name := fmt.Sprintf("w%d", i+1)
	w := s.workerFlags(name, s.workers[i])
	edit(&w)
	if err := s.start(s.wctx, self, logName, w.Args()...); err != nil {
		return err
	}
	n := len(s.procs) - 1
	s.procs[i], s.procs[n] = s.procs[n], s.procs[i] // the worker's place; the old process, ended, last
	return nil
}

// NextAddr is a loopback UDP address for another listener of the
// swarm's (Options.ListenBase's next, or a free one).
func (s *Swarm) NextAddr() (string, error) { return s.ports.addr() }

// startMainStages starts the main node's stages, stage1..stageN
// (o.Stages, their layers as even as the model's divide), each on the
// workers under o.Prefetch, and keeps their addresses for MainFlags.
func (s *Swarm) startMainStages(ctx context.Context, self string, f inproc.Files, o Options) error {
	cfg, err := model.LoadConfig(f.Model)
	if err != nil {
		return err
	}
	if o.Stages > cfg.NumLayers {
		return fmt.Errorf("-stages %d: the model has %d layers", o.Stages, cfg.NumLayers)
	}
	var addrs []string
	for i, r := range model.AllLayers(cfg.NumLayers).Split(o.Stages) {
		name := fmt.Sprintf("stage%d", i+1)
		if err := inproc.EnsureNodes(f.Certs, name); err != nil {
			return err
		}
		addr, err := s.ports.addr()
		if err != nil {
			return err
		}
		st := runflags.For(runflags.RoleStage)
		st.Model, st.Layers, st.Listen, st.Workers, st.Group, st.Prefetch, st.DialTimeout = f.Model, r.String(), addr, strings.Join(s.workers, ","), o.Group, o.Prefetch, s.dialTimeout
		st.Cluster.NetDelay = o.NetDelay
		st.Cluster.Certs, st.Cluster.Name, st.Log.Level = f.Certs, name, "warn"
		if err := s.start(ctx, self, name, st.Args()...); err != nil {
			return err
		}
		s.stageCmds = append(s.stageCmds, s.procs[len(s.procs)-1])
		addrs = append(addrs, addr)
	}
	s.stages = strings.Join(addrs, ",")
	return nil
}

// startShadowStages starts a staged shadow's later stages, shadow2..shadowN
// (o.ShadowStages in all, their layers as even as the model's divide),
// and returns the first stage's -layers and -stages.
func (s *Swarm) startShadowStages(ctx context.Context, self string, f inproc.Files, o Options) (layers, stages string, err error) {
	cfg, err := model.LoadConfig(f.Model)
	if err != nil {
		return "", "", err
	}
	if o.ShadowStages > cfg.NumLayers {
		return "", "", fmt.Errorf("-shadow-stages %d: the model has %d layers", o.ShadowStages, cfg.NumLayers)
	}
	split := model.AllLayers(cfg.NumLayers).Split(o.ShadowStages)
	var addrs []string
	for i := 1; i < len(split); i++ {
		name := fmt.Sprintf("shadow%d", i+1)
		if err := inproc.EnsureNodes(f.Certs, name); err != nil {
			return "", "", err
		}
		addr, err := s.ports.addr()
		if err != nil {
			return "", "", err
		}
		st := runflags.For(runflags.RoleShadow)
		st.Model, st.Quant, st.Listen = f.Model, o.Quant, addr
		st.Layers = split[i].String()
		st.Cluster.NetDelay = o.NetDelay
		st.Cluster.Certs, st.Cluster.Name, st.Log.Level = f.Certs, name, "warn"
		if err := s.start(ctx, self, name, st.Args()...); err != nil {
			return "", "", err
		}
		s.shadowStageCmds = append(s.shadowStageCmds, s.procs[len(s.procs)-1])
		addrs = append(addrs, addr)
	}
	return split[0].String(), strings.Join(addrs, ","), nil
}

// start runs this binary with args as node name, logging to its file.
func (s *Swarm) start(ctx context.Context, self, name string, args ...string) error {
	lf, err := os.Create(filepath.Join(s.logDir, name+".log"))
	if err != nil {
		return err
	}
	cmd := cpuset.CommandContext(ctx, s.cpus, self, s.profiled(name, args)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Start()
	lf.Close() // the child has its own descriptor
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	s.procs = append(s.procs, cmd)
	return nil
}

// Node is a process of this binary that its starter owns: Stop ends it
// and waits for it; Exited is closed once it has exited, Err then says
// how.
type Node struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	exited chan struct{}
	err    error
}

// RunNode starts this binary with args as node name (the main node of a
// Swarm), logging to logFile(name), and waits for it in the
// background.
func (s *Swarm) RunNode(ctx context.Context, name string, args ...string) (*Node, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lf, err := os.Create(s.logFile(name))
	if err != nil {
		return nil, err
	}
	defer lf.Close() // the child has its own descriptor
	nctx, cancel := context.WithCancel(ctx)
	cmd := cpuset.CommandContext(nctx, s.cpus, self, s.profiled(name, args)...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	n := &Node{cmd: cmd, cancel: cancel, exited: make(chan struct{})}
	s.mainNode = n
	go func() {
		n.err = cmd.Wait()
		close(n.exited)
	}()
	return n, nil
}

// Exited is closed once the node has exited.
func (n *Node) Exited() <-chan struct{} { return n.exited }

// Err is how the node exited (nil: status 0), once Exited is closed.
func (n *Node) Err() error { return n.err }

// Stop ends the node (SIGTERM) and waits for it; an exit status of 0
// after the signal is no error.
func (n *Node) Stop() error {
	n.cancel()
	<-n.exited
	if ps := n.cmd.ProcessState; ps != nil && ps.Success() {
		return nil
	}
	return n.err
}

// MainFlags are the flags of `odmoe run -role main` on this swarm with
// the loading policy prefetch (the shadow's alignment periods with one):
// the caller adds what the main node is to do, and renders them (Args).
func (s *Swarm) MainFlags(prefetch string, alignToken, alignKV int) runflags.Flags {
	m := runflags.For(runflags.RoleMain)
	m.Model, m.Workers, m.Prefetch, m.Group, m.DialTimeout = s.files.Model, strings.Join(s.workers, ","), prefetch, s.group, s.dialTimeout
	m.Cluster.Certs, m.Cluster.Name, m.Cluster.NetDelay = s.files.Certs, "main", s.netDelay
	if s.shadow != "" {
		m.Shadow, m.AlignToken, m.AlignKV = s.shadow, alignToken, alignKV
		m.Draft = cmp.Or(s.draft, m.Draft)
	}
	m.Stages = s.stages
	m.Residency = cmp.Or(s.residency, m.Residency)
	return m
}

// profiled is a node's arguments with -cpuprofile added when the swarm
// profiles its nodes.
func (s *Swarm) profiled(name string, args []string) []string {
	if s.profileDir == "" {
		return args
	}
	return append(slices.Clip(args), "-cpuprofile", filepath.Join(s.profileDir, name+".pprof"))
}

// RoleCPU is the CPU time (user and system) a swarm's processes have
// used so far, by role, and this process's (the benchmark's own
// clients).
type RoleCPU struct{ Main, Shadow, Workers, Client time.Duration }

// CPU reads every node's CPU time so far from /proc (zero where it is
// unavailable: not Linux, or a node that has exited).
func (s *Swarm) CPU() RoleCPU {
	var c RoleCPU
	c.Client, _ = procmem.CPUTimeOf(os.Getpid())
	if s.mainNode != nil {
		c.Main, _ = procmem.CPUTimeOf(s.mainNode.cmd.Process.Pid)
	}
	for _, p := range s.procs {
		t, _ := procmem.CPUTimeOf(p.Process.Pid)
		switch {
		case p == s.shadowCmd || slices.Contains(s.shadowStageCmds, p):
			c.Shadow += t
		case slices.Contains(s.stageCmds, p): // the main node's share
			c.Main += t
		default:
			c.Workers += t
		}
	}
	return c
}

// NodeCPUs are the CPU lists the kernel lets the swarm's running node
// processes (the caller's main node among them) run on, each once, in
// order: what Options.CPUs made of them ("" where none could be read).
func (s *Swarm) NodeCPUs() []string {
	cmds := slices.Clone(s.procs)
	if s.mainNode != nil {
		cmds = append(cmds, s.mainNode.cmd)
	}
	var lists []string
	for _, c := range cmds {
		if l, err := cpuset.OfProcess(c.Process.Pid); err == nil && !slices.Contains(lists, l) {
			lists = append(lists, l)
		}
	}
	slices.Sort(lists)
	return lists
}

// logFile is where a node started here (or the caller's main node) logs.
func (s *Swarm) logFile(name string) string { return filepath.Join(s.logDir, name+".log") }

// PrintLogs copies every node's non-empty log to w, for a failed run.
func (s *Swarm) PrintLogs(w io.Writer) {
	logs, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil && len(b) > 0 {
			fmt.Fprintf(w, "--- %s ---\n%s", filepath.Base(l), b)
		}
	}
}

// Workers are the workers' addresses, in layout order.
func (s *Swarm) Workers() []string { return s.workers }

// Shadow is the shadow's address, "" without one.
func (s *Swarm) Shadow() string { return s.shadow }

// Close stops the nodes (SIGTERM), waits for them and removes their logs
// (unless they went to Options.LogDir).
func (s *Swarm) Close() {
	s.stop()
	for _, p := range s.procs {
		p.Wait()
	}
	if !s.keepLogs {
		os.RemoveAll(s.logDir)
	}
}

// LogDir is where the nodes' logs are (NAME.log).
func (s *Swarm) LogDir() string { return s.logDir }

// KeepsLogs reports whether Close keeps the logs (Options.LogDir).
func (s *Swarm) KeepsLogs() bool { return s.keepLogs }

// FreeAddr returns a loopback port free over UDP and TCP (a worker
// listens on both: QUIC for its peers, TCP for the workers fetching
// from it), one this process has not handed out before: a port is free again once this lets go of it,
// so two nodes that have not bound theirs yet could otherwise be given
// the same one (seen: a shadow given a worker's port, failing to listen).
// It picks below the kernel's ephemeral range where it can: a port the
// kernel handed this process for a moment it hands anyone who binds port
// 0 next, and the tests' QUIC clients do that all the time (seen: a
// shadow failing to listen in CI, go test running every package at once).
func FreeAddr() (string, error) {
	for range 64 {
		addr, err := freeLoopback(func(a string) (io.Closer, net.Addr, error) {
			c, err := net.ListenPacket("udp", a)
			if err != nil {
				return nil, nil, err
			}
			t, err := net.Listen("tcp", c.LocalAddr().String())
			if err != nil {
				c.Close()
				return nil, nil, err
			}
			return both{c, t}, c.LocalAddr(), nil
		})
		if err != nil {
			return "", err
		}
		handedOut.Lock()
		fresh := !handedOut.addrs[addr]
		handedOut.addrs[addr] = true
		handedOut.Unlock()
		if fresh {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no loopback port this process has not handed out already, in 64 tries")
}

// both closes a UDP socket and a TCP listener on one port.
type both struct {
	udp net.PacketConn
	tcp net.Listener
}

func (b both) Close() error { return errors.Join(b.udp.Close(), b.tcp.Close()) }

// freeLoopback binds listen to a loopback port below the kernel's
// ephemeral range (belowEphemeral; the kernel's pick where that is not
// known), lets go of it and returns its address.
func freeLoopback(listen func(addr string) (io.Closer, net.Addr, error)) (string, error) {
	lo, hi := belowEphemeral()
	for range 64 {
		port := 0
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		c, addr, err := listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			if port != 0 {
				continue // taken: another
			}
			return "", err
		}
		c.Close()
		return addr.String(), nil
	}
	return "", fmt.Errorf("no free loopback port in [%d, %d) in 64 tries", lo, hi)
}

// belowEphemeral is the range of ports [lo, hi) FreeAddr picks from:
// up to 8192 ports below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range), none of them privileged;
// lo == hi where the range is not known (the kernel picks, from it).
var belowEphemeral = sync.OnceValues(func() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	first, err := strconv.Atoi(f[0])
	if err != nil || first < 1024+1024 {
		return 0, 0
	}
	return max(1024, first-8192), first
})

// handedOut are the addresses FreeAddr and FreeTCPAddr have returned.
var handedOut = struct {
	sync.Mutex
	addrs map[string]bool
}{addrs: map[string]bool{}}

// FreeTCPAddr returns a free loopback TCP port, picked below the
// kernel's ephemeral range as FreeAddr picks (a test's HTTP clients
// take ports from that range all the time).
func FreeTCPAddr() (string, error) {
	for range 64 {
		addr, err := freeLoopback(func(a string) (io.Closer, net.Addr, error) {
			l, err := net.Listen("tcp", a)
			if err != nil {
				return nil, nil, err
			}
			return l, l.Addr(), nil
		})
		if err != nil {
			return "", err
		}
		handedOut.Lock()
		fresh := !handedOut.addrs[addr]
		handedOut.addrs[addr] = true
		handedOut.Unlock()
		if fresh { // not a worker's, whose TCP port may not be bound yet (FreeAddr)
			return addr, nil
		}
	}
	return "", fmt.Errorf("no loopback TCP port this process has not handed out already, in 64 tries")
}
