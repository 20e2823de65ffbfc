package testbed

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Mode is a way of running the model the benchmark compares.
type Mode string

// The modes, in report order.
const (
	ModeLocal    Mode = "local"    // one process, the whole model: the reference the others must match bit for bit
	ModeResident Mode = "resident" // every worker holds its experts for good: fully cached, no loading
	// ModeResidentShadow is the resident swarm with the shadow running,
	// aligned every pass and hinting as in shadow mode (its hints land
	// on experts pinned already): the baseline that pays the shadow's CPU
	// and alignment traffic as shadow mode does, so shadow / resident-shadow
	// measures what the predictions and loads cost, and nothing else.
	ModeResidentShadow Mode = "resident-shadow"
	ModeReactive       Mode = "reactive" // load each expert when its activation arrives
	ModeShadow         Mode = "shadow"   // load on the shadow's predictions, aligned every pass (T1/K1)
	// ModeShadowLate is shadow mode with the shadow's -ahead 0: it waits
	// for every alignment before departing (OD-MoE's late departure).
	ModeShadowLate Mode = "shadow-late"
	// ModeResidency is shadow mode with -residency on: each expert runs on
	// its owner, which keeps it resident while its budget allows.
	ModeResidency Mode = "residency"
	// ModeResidencyUniform is residency with -placement uniform: owners
	// fixed at (expert + layer) mod workers, whatever the workers are.
	ModeResidencyUniform Mode = "residency-uniform"
	// ModeDraft is shadow mode with -draft auto: each pass checks the
	// shadow's guesses of the next tokens where the policy says it pays.
	ModeDraft Mode = "draft"
	// ModeFault is shadow mode with a worker killed (SIGKILL) 40% into
	// each run's decode and restarted after it: what a lost node costs.
	ModeFault Mode = "fault"
)

// usesShadow reports whether mode runs a shadow node.
func (m Mode) usesShadow() bool {
	return m == ModeShadow || m == ModeShadowLate || m == ModeResidency || m == ModeResidencyUniform || m == ModeFault || m == ModeResidentShadow || m == ModeDraft
}

// resident reports whether mode's workers pin the experts they own at
// start (worker -resident).
func (m Mode) resident() bool { return m == ModeResident || m == ModeResidentShadow }

// residency reports whether mode runs -residency on.
func (m Mode) residency() bool { return m == ModeResidency || m == ModeResidencyUniform }

// AllModes lists the modes a benchmark runs by default, in report order
// (fault mode runs when asked for).
var AllModes = []Mode{ModeLocal, ModeResident, ModeReactive, ModeShadow}

// ParseModes reads a comma-separated mode list; local is always run
// (first): it is what the others are checked against.
func ParseModes(s string) ([]Mode, error) {
	out := []Mode{ModeLocal}
	for _, f := range strings.Split(s, ",") {
		m := Mode(strings.TrimSpace(f))
		switch m {
		case ModeLocal, "":
		case ModeResident, ModeResidentShadow, ModeReactive, ModeShadow, ModeShadowLate, ModeResidency, ModeResidencyUniform, ModeFault, ModeDraft:
			if m == ModeFault && !slices.Contains(out, ModeShadow) {
				out = append(out, ModeShadow) // the fault run is timed, and compared, against it
			}
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		default:
			return nil, fmt.Errorf("mode %q unknown: resident, resident-shadow, reactive, shadow, shadow-late, residency, residency-uniform, draft, fault (local always runs)", m)
		}
	}
	return out, nil
}

// Case is one prompt length and output length.
type Case struct {
	Prompt, Output int
}

func (c Case) String() string { return fmt.Sprintf("p%d-o%d", c.Prompt, c.Output) }

// PaperCases are OD-MoE's lengths: 16 and 128 prompt tokens, 64 and 256
// output tokens.
var PaperCases = []Case{{16, 64}, {16, 256}, {128, 64}, {128, 256}}

// ParseCases reads "16x64,128x256". A case given twice is refused: a
// case's index picks its prompt, and both would write one run directory
// (BenchOptions.Repeat runs a case more than once).
func ParseCases(s string) ([]Case, error) {
	var out []Case
	for _, f := range strings.Split(s, ",") {
		var c Case
		p, o, ok := strings.Cut(strings.TrimSpace(f), "x")
		var err1, err2 error
		c.Prompt, err1 = strconv.Atoi(p)
		c.Output, err2 = strconv.Atoi(o)
		if !ok || err1 != nil || err2 != nil || c.Prompt < 1 || c.Output < 1 {
			return nil, fmt.Errorf("case %q: want PROMPTxOUTPUT tokens, e.g. 16x64", f)
		}
		if slices.Contains(out, c) {
			return nil, fmt.Errorf("case %s given twice: to run a case more than once, repeat the benchmark's runs (-repeat)", c)
		}
		out = append(out, c)
	}
	return out, nil
}

// Prompts is the benchmark's prompt set: case i uses Prompts[i %
// len(Prompts)], its tokens repeated to the case's prompt length
// (run -prompt-tokens), so lengths are exact whatever the tokenizer.
var Prompts = []string{
	"The history of the printing press begins with movable type in East Asia and continues in Europe, where",
	"A distributed system of small computers can run a large language model if each of them",
	"Write a short story about a lighthouse keeper who finds a message in a bottle that says",
	"Explain step by step how a mixture-of-experts layer chooses which experts process a token:",
}

// BenchOptions configure a rig benchmark.
type BenchOptions struct {
	Rig   *Rig
	Via   Via
	Files Paths // on this machine (local mode reads them; Push sends them)
	Out   string
	Cases []Case
	Modes []Mode
	// Repeat runs every case this many times on each mode (0: once), in
	// rounds: each round runs every mode once, its nodes started afresh,
	// so that a case's runs are minutes apart and a machine whose speed
	// drifts weighs on every mode alike; the report keeps the run of
	// median decode tokens/s and the others' rates.
	Repeat int
	// TraceIters are the decode passes the timeline shows ("3:5").
	TraceIters string
	// NetDelay, when set, is passed to every node as -net-delay (the
	// emulated rig's delay where the kernel has no netem).
	NetDelay time.Duration
	// ResidencyDeviceMem, when set, is every worker's -device-mem in
	// residency mode (e.g. a quarter of the expert bytes over the
	// workers), while the other modes keep the rig's: the resident
	// reference needs room for every expert it owns.
	ResidencyDeviceMem string
	// Fetch starts every node but the main node on directories of its
	// own, which it fills from the main node (-fetch-from; the main node
	// serves its checkpoint and store on FetchAddr): NodeFiles holds
	// them on this machine (local and netns: NodeFiles/NAME/model and
	// /store), the remote directory on a real LAN. A shadow (or shadow
	// stage) fetches its experts as the store's chunks into its store.
	Fetch     bool
	NodeFiles string
	// filled: the nodes' directories were filled (fillRig) before the
	// modes, which then start the stages and the shadow on them as they
	// are (a worker keeps -fetch-from: a lost worker's experts come from
	// there)
	filled bool
	// Command is how the benchmark was started, for the report.
	Command string
	Log     zerolog.Logger
}

// Run is one mode on one case.
type Run struct {
	Mode      Mode            `json:"mode"`
	Case      string          `json:"case"`
	Prompt    int             `json:"prompt_tokens"`
	Output    int             `json:"output_tokens"`
	Stats     json.RawMessage `json:"stats"`     // the main (or local) node's -stats
	Identical bool            `json:"identical"` // tokens and logits bit-identical to local mode
	Diff      string          `json:"diff,omitempty"`
	CPUBusy   float64         `json:"cpu_busy"` // this machine's CPU busy fraction during the run
	// CPUSeconds is the CPU time each role's nodes used during the run
	// ("main", "shadow", "workers": all workers together), where every
	// node runs on this machine; what the roles cost one another when
	// they share its cores.
	CPUSeconds map[string]float64 `json:"cpu_s,omitempty"`
	WallS      float64            `json:"wall_s"`
	Trace      string             `json:"trace,omitempty"`
	// DecodeRuns are the decode tokens/s of every run of this mode and
	// case, in order, when BenchOptions.Repeat ran it more than once:
	// the run kept is the median's; Repeats are those runs themselves
	// (their stats and CPU time: what calibration averages)
	DecodeRuns []float64 `json:"decode_tokens_per_s_runs,omitempty"`
	Repeats    []Run     `json:"repeats,omitempty"`
	// FaultNode was killed FaultAtS seconds after the main node started
	// (fault mode).
	FaultNode string  `json:"fault_node,omitempty"`
	FaultAtS  float64 `json:"fault_at_s,omitempty"`
}

// Report is report.json.
type Report struct {
	Date    string            `json:"date"`
	Command string            `json:"command"`
	Machine Machine           `json:"machine"`
	Rig     string            `json:"rig"`
	Nodes   []string          `json:"nodes"`
	Via     string            `json:"via"`
	Link    map[string]string `json:"link,omitempty"` // the emulated rig's state: rate, delay, delay_by, loss
	Model   string            `json:"model"`
	// Fill is what the nodes fetched when they started on their own
	// directories (BenchOptions.Fetch): the first start, from whatever
	// the directories held (nothing, the first time), and a second
	// start from what the first fetched.
	Fill []FillStart `json:"fill,omitempty"`
	Runs []Run       `json:"runs"`
}

// Bench runs every mode on every case against the rig and writes
// report.json, report.md and the timelines into opt.Out. It fails if a
// swarm mode's output is not bit-identical to local mode's (after writing
// the report, which says where).
func Bench(opt BenchOptions) (*Report, error) {
	if err := os.MkdirAll(filepath.Join(opt.Out, "logs"), 0o755); err != nil {
		return nil, err
	}
	if opt.TraceIters == "" {
		opt.TraceIters = "3:5"
	}
	rep := &Report{Date: time.Now().UTC().Format(time.RFC3339), Command: opt.Command, Machine: ReadMachine(),
		Rig: opt.Rig.Path, Via: opt.Via.Name(), Model: opt.Files.Model}
	if opt.Via.Name() == "netns" { // the links are the emulated rig's only there
		rep.Link = ReadRigState()
	}
	for _, n := range opt.Rig.Nodes() {
		node := fmt.Sprintf("%s %s %s", n.Name, n.RunRole(), n.Addr)
		if n.CPUs != "" {
			node += " cpus=" + n.CPUs
		}
		rep.Nodes = append(rep.Nodes, node)
	}
	for _, mode := range opt.Modes {
		if mode.usesShadow() && opt.Rig.Shadow == nil {
			return nil, fmt.Errorf("testbed: mode %s needs a shadow node in %s", mode, opt.Rig.Path)
		}
		if mode == ModeFault && len(opt.Rig.Workers) < 2 {
			return nil, fmt.Errorf("testbed: mode fault needs two workers or more in %s", opt.Rig.Path)
		}
		if len(opt.Rig.Stages) > 0 && mode.residency() {
			return nil, fmt.Errorf("testbed: mode %s with the main node's stages (%s): residency does not place a staged main node's experts yet", mode, opt.Rig.Path)
		}
	}
	if opt.Fetch {
		for start := 1; start <= 2; start++ {
			fs, err := fillRig(opt, start)
			rep.Fill = append(rep.Fill, fs)
			if err != nil {
				writeReport(opt, rep)
				return rep, err
			}
		}
		opt.filled = true
	}
	// rounds: every mode once per round, so that a machine whose speed
	// drifts over minutes weighs on every mode alike
	repeats := make([][][]Run, len(opt.Modes)) // by mode, by case
	var done []Run
	for round := range max(1, opt.Repeat) {
		for m, mode := range opt.Modes {
			runs, err := benchMode(opt, mode, round, done)
			done = append(done, runs...)
			if repeats[m] == nil {
				repeats[m] = make([][]Run, len(opt.Cases))
			}
			for i, r := range runs {
				repeats[m][i] = append(repeats[m][i], r)
			}
			if err != nil {
				rep.Runs = keptOfModes(repeats)
				writeReport(opt, rep)
				return rep, err
			}
		}
	}
	rep.Runs = keptOfModes(repeats)
	var failed []string
	for _, r := range rep.Runs {
		if !r.Identical {
			failed = append(failed, fmt.Sprintf("%s %s: %s", r.Mode, r.Case, r.Diff))
		}
	}
	if err := writeReport(opt, rep); err != nil {
		return rep, err
	}
	if len(failed) > 0 {
		return rep, fmt.Errorf("testbed: output differs from local mode: %s", strings.Join(failed, "; "))
	}
	return rep, nil
}

// nodeFlags are node n's flags in role: the rig's own for it (ReadRig
// checked they parse), then what every node gets (identity,
// certificates, the emulated link delay). The caller sets the rest, after
// the rig's: what it sets counts.
func nodeFlags(opt BenchOptions, via Via, n Node, role string) runflags.Flags {
	f, _ := n.FlagsAs(role) // checked by ReadRig
	f.Cluster.Certs, f.Cluster.Name = via.Paths(n).Certs, n.Name
	if opt.Fetch && role != runflags.RoleMain && role != runflags.RoleLocal && (!opt.filled || role == runflags.RoleWorker) {
		f.FetchFrom = opt.FetchAddr()
	}
	if role != runflags.RoleMain && (f.Log.Level == "warn" || f.Log.Level == "error") {
		f.Log.Level = "info" // the bench waits for a server's "listening" line (waitListening)
	}
	if opt.NetDelay > 0 {
		f.Cluster.NetDelay = opt.NetDelay
	}
	return f
}

// StartServers starts the workers (and the shadow, in shadow mode) that
// mode needs, each logging to logDir/NAME.log. On error it returns what
// it started, for the caller to stop.
func StartServers(opt BenchOptions, mode Mode, logDir string) ([]*Proc, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	var servers []*Proc
	start := func(n Node, args []string) error {
		p, err := startLogged(opt, logDir, n, args)
		if err == nil {
			servers = append(servers, p)
		}
		return err
	}
	for i := range opt.Rig.Workers {
		if err := start(opt.Rig.Workers[i], workerArgs(opt, mode, i)); err != nil {
			return servers, err
		}
	}
	main := MainFlags(opt, mode)
	for _, st := range opt.Rig.Stages { // the main node's stages, running its layers as it would
		f := nodeFlags(opt, opt.Via, st, runflags.RoleStage)
		f.Listen, f.Model, f.Workers, f.DialTimeout = st.Addr, opt.NodePaths(st).Model, opt.Rig.WorkerAddrs(), rigDialTimeout
		f.Prefetch, f.Group, f.MiniBatch, f.PeerTimeout = main.Prefetch, main.Group, main.MiniBatch, main.PeerTimeout
		if opt.Fetch && main.Shadow != "" {
			f.StoreRelays = strings.Trim(main.Shadow+","+main.StoreRelays, ",") // the stage tells its workers their place
		}
		if err := start(st, f.Args()); err != nil {
			return servers, err
		}
	}
	if mode.usesShadow() {
		if opt.Rig.Shadow == nil {
			return servers, fmt.Errorf("testbed: mode %s needs a shadow node in %s", mode, opt.Rig.Path)
		}
		// a staged shadow's stages first: its first stage dials them
		for _, st := range opt.Rig.ShadowStages {
			f := nodeFlags(opt, opt.Via, st, runflags.RoleShadow)
			f.Listen, f.Model = st.Addr, opt.NodePaths(st).Model
			if opt.Fetch { // its experts as the store's chunks
				f.Store = opt.NodePaths(st).Store
			}
			if err := start(st, f.Args()); err != nil {
				return servers, err
			}
		}
		s := *opt.Rig.Shadow
		f := nodeFlags(opt, opt.Via, s, runflags.RoleShadow)
		f.Listen, f.Model, f.Workers, f.DialTimeout = s.Addr, opt.NodePaths(s).Model, opt.Rig.WorkerAddrs(), rigDialTimeout
		f.Stages = opt.Rig.ShadowStageAddrs()
		if opt.Fetch { // its experts as the store's chunks
			f.Store = opt.NodePaths(s).Store
		}
		if mode == ModeShadowLate {
			f.Ahead = 0 // whatever the rig says
		}
		if err := start(s, f.Args()); err != nil {
			return servers, err
		}
	}
	return servers, nil
}

// startLogged starts node n with args, its output appended to
// logDir/NAME.log (a restarted node adds to its first log).
func startLogged(opt BenchOptions, logDir string, n Node, args []string) (*Proc, error) {
	f, err := os.OpenFile(filepath.Join(logDir, n.Name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	p, err := opt.Via.Start(n, args, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	go func() { <-p.done; f.Close() }()
	return p, nil
}

// workerArgs are worker i's `odmoe` arguments in mode.
func workerArgs(opt BenchOptions, mode Mode, i int) []string {
	w := opt.Rig.Workers[i]
	f := nodeFlags(opt, opt.Via, w, runflags.RoleWorker)
	f.Listen, f.Store = w.Addr, opt.NodePaths(w).Store
	if mode.resident() {
		f.Resident = fmt.Sprintf("%d/%d", i, len(opt.Rig.Workers))
	}
	if mode.residency() && opt.ResidencyDeviceMem != "" {
		f.DeviceMem = opt.ResidencyDeviceMem // whatever the rig says
	}
	return f.Args()
}

// rigDialTimeout is how long the main node and the shadow wait for the
// rig's workers at start: the benchmark started them itself, and on a rig
// whose workers fill a host cache (-host-preload) or pin experts first
// that takes far longer than a node's 30 s default.
const rigDialTimeout = 10 * time.Minute

// mainVia is how the main node starts: in its namespace on the emulated
// rig, else on this machine (on a real LAN the benchmark runs on the main
// node's host, which reads the main node's dumps and stats).
func (opt BenchOptions) mainVia() Via {
	if opt.Via.Name() == "ssh" {
		return Local{Files: opt.Files}
	}
	return opt.Via
}

// MainFlags are the main node's flags for mode (local mode's for
// ModeLocal), without the prompt, lengths and outputs.
func MainFlags(opt BenchOptions, mode Mode) runflags.Flags {
	m := opt.Rig.Main
	via := opt.mainVia()
	if mode == ModeLocal {
		f, _ := m.FlagsAs(runflags.RoleLocal) // checked by ReadRig (as the main node's)
		f.Model = via.Paths(m).Model
		return f
	}
	prefetch := mode
	switch {
	case mode.resident():
		prefetch = ModeResident
	case mode.usesShadow():
		prefetch = ModeShadow
	}
	f := nodeFlags(opt, via, m, runflags.RoleMain)
	f.Model, f.Workers, f.Prefetch, f.DialTimeout = via.Paths(m).Model, opt.Rig.WorkerAddrs(), string(prefetch), rigDialTimeout
	if mode.residency() {
		f.Residency = "on"
	}
	if mode == ModeResidencyUniform {
		f.Placement = "uniform"
	}
	if mode.usesShadow() {
		f.Shadow, f.AlignToken, f.AlignKV = opt.Rig.Shadow.Addr, 1, 1
	}
	if mode == ModeDraft {
		f.Draft = "auto"
	}
	f.Stages = opt.Rig.StageAddrs()
	if opt.Fetch {
		f.Store, f.StoreListen = via.Paths(m).Store, opt.FetchAddr()
		if mode.usesShadow() { // the later shadow stages relay their layers' chunks too
			var relays []string
			for _, n := range opt.Rig.ShadowStages {
				relays = append(relays, n.Addr)
			}
			f.StoreRelays = strings.Join(relays, ",")
		}
	}
	return f
}

// DefaultFetchPort is the port the main node serves the swarm's weights
// on (-store-listen) where the rig's main line gives none.
const DefaultFetchPort = "7600"

// FetchAddr is where the main node serves its checkpoint and store to
// the nodes fetching theirs (Fetch): its address's port, or
// DefaultFetchPort.
func (opt BenchOptions) FetchAddr() string {
	host, port, err := net.SplitHostPort(opt.Rig.Main.Addr)
	if err != nil {
		host, port = opt.Rig.Main.Addr, DefaultFetchPort
	}
	return net.JoinHostPort(host, port)
}

// NodePaths are node n's files: the Via's, or, where nodes fetch their
// weights (Fetch) on this machine, a model and a store directory of its
// own under NodeFiles, for every node but the main node (which holds
// the model and the store it serves).
func (opt BenchOptions) NodePaths(n Node) Paths {
	p := opt.Via.Paths(n)
	if opt.Fetch && opt.NodeFiles != "" && n.Name != opt.Rig.Main.Name {
		p.Model, p.Store = filepath.Join(opt.NodeFiles, n.Name, "model"), filepath.Join(opt.NodeFiles, n.Name, "store")
	}
	return p
}

// listeningMark is what a worker or shadow logs once it listens, ready.
const listeningMark = "wire: listening"

// logSizes are the sizes of the rig's nodes' logs in logDir now (a node
// started again appends to its log).
func logSizes(opt BenchOptions, logDir string) map[string]int64 {
	sizes := map[string]int64{}
	for _, n := range opt.Rig.Nodes() {
		if fi, err := os.Stat(filepath.Join(logDir, n.Name+".log")); err == nil {
			sizes[n.Name] = fi.Size()
		}
	}
	return sizes
}

// waitListening waits until every server has logged, past the size its
// log had before it started (from), that it listens; it fails if one
// exits first or the timeout passes.
func waitListening(servers []*Proc, logDir string, from map[string]int64, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range servers {
		path := filepath.Join(logDir, p.Node.Name+".log")
		for {
			if b, err := os.ReadFile(path); err == nil && int64(len(b)) > from[p.Node.Name] && bytes.Contains(b[from[p.Node.Name]:], []byte(listeningMark)) {
				break
			}
			if p.Exited() {
				return fmt.Errorf("testbed: %s %w before it listened; its log: %s", p.Node.Name, errExited, path)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("testbed: %s did not listen within %v; its log: %s", p.Node.Name, timeout, path)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// keptOfModes is keptRuns of each mode's repeats, in mode order.
func keptOfModes(repeats [][][]Run) []Run {
	var out []Run
	for _, byCase := range repeats {
		out = append(out, keptRuns(byCase)...)
	}
	return out
}

// benchMode starts the servers a mode needs, runs every case on it once
// (round rep of BenchOptions.Repeat), and stops them; it returns the
// runs in case order, as far as it got. done are the runs so far (fault
// mode times its kill from a shadow run of the same case).
func benchMode(opt BenchOptions, mode Mode, rep int, done []Run) ([]Run, error) {
	logDir := filepath.Join(opt.Out, "logs", string(mode))
	var servers []*Proc
	defer func() { StopAll(servers, 10*time.Second) }()
	if mode != ModeLocal {
		var err error
		from := logSizes(opt, logDir)
		if servers, err = StartServers(opt, mode, logDir); err != nil {
			return nil, err
		}
		opt.Log.Info().Str("mode", string(mode)).Int("servers", len(servers)).Str("logs", logDir).Msg("rig nodes started")
		// a node pins experts, fills its host cache or quantizes before
		// it listens: that CPU is no run's
		if err := waitListening(servers, logDir, from, rigDialTimeout); err != nil {
			return nil, err
		}
	}
	var runs []Run
	for i, c := range opt.Cases {
		for _, p := range servers {
			if p.Exited() {
				return runs, fmt.Errorf("testbed: %s %s %w; its log: %s", mode, p.Node.Name, errExited, filepath.Join(logDir, p.Node.Name+".log"))
			}
		}
		var f *fault
		if mode == ModeFault {
			f = planFault(opt, servers, done, c)
		}
		r, err := benchCase(opt, mode, i, rep, c, f, servers)
		if f != nil {
			<-f.ran // benchCase has stopped the kill, or it has run
			r.FaultNode, r.FaultAtS = f.node, f.at.Seconds()
			// the killed worker comes back for the next case
			if servers[f.victim].Exited() {
				p, serr := startLogged(opt, logDir, opt.Rig.Workers[f.victim], workerArgs(opt, mode, f.victim))
				if serr != nil {
					return runs, serr
				}
				servers[f.victim] = p
			}
		}
		if err != nil {
			return runs, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// keptRuns is the run of each case that the report keeps: of its repeats,
// the first not bit-identical to local mode (so that the report says so),
// else the one of median decode tokens/s (the lower of the middle two),
// with every repeat's rate in DecodeRuns and every repeat in Repeats.
func keptRuns(repeats [][]Run) []Run {
	var out []Run
	for _, rs := range repeats {
		if len(rs) == 0 {
			continue
		}
		if len(rs) == 1 {
			out = append(out, rs[0])
			continue
		}
		rates := make([]float64, len(rs))
		for i, r := range rs {
			rates[i] = r.figures().DecodeTokensPerS
		}
		kept := -1
		for i, r := range rs {
			if !r.Identical {
				kept = i
				break
			}
		}
		if kept < 0 {
			order := make([]int, len(rs))
			for i := range order {
				order[i] = i
			}
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(rates[a], rates[b]) })
			kept = order[(len(order)-1)/2]
		}
		r := rs[kept]
		r.DecodeRuns, r.Repeats = rates, rs
		out = append(out, r)
	}
	return out
}

// fault is fault mode's kill of one worker during a run.
type fault struct {
	victim int           // index of the worker in the rig (and in servers)
	node   string        // its name
	after  time.Duration // after the main node has connected to its workers
	at     time.Duration // when the kill came, after the main node's start; 0: none
	kill   func()
	stop   chan struct{} // closed when the run has ended
	ran    chan struct{} // closed once the kill ran or was called off
}

// connectedMark is what the main node logs once every worker is connected.
const connectedMark = "all workers connected"

// planFault picks worker w2 (the second) and the moment to kill it,
// counted from the main node's "all workers connected" (start-up, which
// includes waiting for workers that fill a host cache, varies from run to
// run): the shadow run of the same case's time to first token plus 40% of
// its decode.
func planFault(opt BenchOptions, servers []*Proc, done []Run, c Case) *fault {
	after := time.Second
	for _, r := range done {
		var st struct {
			Generated int     `json:"generated_tokens"`
			Decode    float64 `json:"decode_tokens_per_s"`
			TTFTms    float64 `json:"ttft_ms"`
		}
		if r.Mode != ModeShadow || r.Case != c.String() || json.Unmarshal(r.Stats, &st) != nil || st.Decode <= 0 {
			continue
		}
		decode := float64(st.Generated) / st.Decode
		after = time.Duration((st.TTFTms/1e3 + 0.4*decode) * float64(time.Second))
	}
	f := &fault{victim: 1, node: opt.Rig.Workers[1].Name, after: after, stop: make(chan struct{}), ran: make(chan struct{})}
	f.kill = func() {
		if err := servers[f.victim].Kill(); err != nil {
			opt.Log.Warn().Err(err).Msg("fault mode: kill failed")
			return
		}
		opt.Log.Info().Str("node", f.node).Dur("at", f.at).Msg("fault mode: worker killed")
	}
	return f
}

// arm waits for the main node (logging to logPath, started at t0) to
// connect, then f.after, then kills, unless the run ends first.
func (f *fault) arm(logPath string, t0 time.Time) {
	defer close(f.ran)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if b, err := os.ReadFile(logPath); err == nil && bytes.Contains(b, []byte(connectedMark)) {
			break
		}
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
	}
	select {
	case <-f.stop:
		return
	case <-time.After(f.after):
	}
	f.at = time.Since(t0)
	f.kill()
}

// runDir is where repeat rep (from 0) of mode on c leaves its dumps,
// stats and log: runs/MODE-CASE, then runs/MODE-CASE-r2, -r3, ...
func runDir(opt BenchOptions, mode Mode, c Case, rep int) string {
	return filepath.Join(opt.Out, "runs", string(mode)+"-"+c.String()+repeatSuffix(rep))
}

// repeatSuffix names repeat rep's files: none for the first, -r2, -r3, ...
func repeatSuffix(rep int) string {
	if rep == 0 {
		return ""
	}
	return fmt.Sprintf("-r%d", rep+1)
}

// benchCase runs the main node (or local mode) once: repeat rep of case
// i, c.
func benchCase(opt BenchOptions, mode Mode, i, rep int, c Case, f *fault, servers []*Proc) (Run, error) {
	m := opt.Rig.Main
	dir := runDir(opt, mode, c, rep)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Run{}, err
	}
	mf := MainFlags(opt, mode)
	mf.Prompt, mf.PromptTokens, mf.N, mf.IgnoreEOS, mf.Dump, mf.Stats = Prompts[i%len(Prompts)], c.Prompt, c.Output, true, dir, filepath.Join(dir, "stats.json")
	r := Run{Mode: mode, Case: c.String(), Prompt: c.Prompt, Output: c.Output}
	if mode != ModeLocal && i == 0 { // each repeat its own, so that the run the report keeps has its timeline
		r.Trace = filepath.Join(opt.Out, "trace-"+string(mode)+repeatSuffix(rep)+".json")
		mf.Trace, mf.TraceIters = r.Trace, opt.TraceIters
	}
	out, err := os.Create(filepath.Join(dir, "main.log"))
	if err != nil {
		return r, err
	}
	defer out.Close()
	opt.Log.Info().Str("mode", string(mode)).Str("case", c.String()).Msg("run")
	cpu0 := ReadCPU()
	serversCPU0, serversOK := serversCPU(servers)
	t0 := time.Now()
	p, err := opt.mainVia().Start(m, mf.Args(), out)
	if f != nil {
		if err != nil {
			close(f.ran)
		} else {
			go f.arm(out.Name(), t0)
		}
	}
	var died *Proc
	if err == nil {
		gone := watchServers(p, servers, f)
		err = p.Wait()
		died = gone()
	}
	if f != nil {
		close(f.stop) // a kill not yet due is called off
	}
	if died != nil {
		return r, fmt.Errorf("testbed: %s %s: node %s %w while the main node ran, so the run was stopped; its log: %s",
			mode, c, died.Node.Name, errExited, filepath.Join(opt.Out, "logs", string(mode), died.Node.Name+".log"))
	}
	r.WallS = time.Since(t0).Seconds()
	r.CPUBusy = ReadCPU().BusySince(cpu0)
	if f == nil && serversOK && p != nil {
		if mainCPU, ok := p.CPUTime(); ok {
			if after, ok := serversCPU(servers); ok {
				r.CPUSeconds = map[string]float64{"main": mainCPU.Seconds()}
				for role, s := range after {
					r.CPUSeconds[role] = s - serversCPU0[role]
				}
			}
		}
	}
	if err != nil {
		return r, fmt.Errorf("testbed: %s %s: %w (log: %s)", mode, c, err, out.Name())
	}
	if r.Stats, err = os.ReadFile(filepath.Join(dir, "stats.json")); err != nil {
		return r, err
	}
	r.Stats = bytes.TrimSpace(r.Stats)
	if r.Stats, err = withPeaks(r.Stats, m.Name, servers); err != nil {
		return r, err
	}
	if mode == ModeLocal {
		r.Identical = true
	} else {
		r.Diff = sameOutput(runDir(opt, ModeLocal, c, 0), dir) // every local run gives the same bits
		r.Identical = r.Diff == ""
	}
	var st struct {
		DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	}
	json.Unmarshal(r.Stats, &st)
	opt.Log.Info().Str("mode", string(mode)).Str("case", c.String()).Float64("decode_tok_s", st.DecodeTokensPerS).
		Float64("cpu_busy", r.CPUBusy).Bool("identical", r.Identical).Msg("run done")
	return r, nil
}

// withPeaks adds to a run's stats, in peak_memory_bytes, each node's
// peak RSS under its name in the rig: the main node's own figure (main,
// or local) under its name, and each server's VmHWM so far (a server
// runs every case of a mode: its peak over them), where it runs on this
// machine.
func withPeaks(stats []byte, mainName string, servers []*Proc) ([]byte, error) {
	var st map[string]json.RawMessage
	if err := json.Unmarshal(stats, &st); err != nil {
		return stats, fmt.Errorf("testbed: the run's stats: %w", err)
	}
	peaks := map[string]int64{}
	if raw, ok := st["peak_memory_bytes"]; ok {
		if err := json.Unmarshal(raw, &peaks); err != nil {
			return stats, fmt.Errorf("testbed: the run's peak_memory_bytes: %w", err)
		}
	}
	if b := max(peaks["main"], peaks["local"]); b > 0 {
		peaks[mainName] = b
	}
	for _, s := range servers {
		if b, ok := s.PeakRSS(); ok {
			peaks[s.Node.Name] = b
		}
	}
	raw, err := json.Marshal(peaks)
	if err != nil {
		return stats, err
	}
	st["peak_memory_bytes"] = raw
	return json.Marshal(st)
}

// serversCPU is the CPU seconds the servers have used so far, by role
// ("shadow", "workers"); false unless every one runs on this machine and
// is readable.
func serversCPU(servers []*Proc) (map[string]float64, bool) {
	by := map[string]float64{}
	for _, s := range servers {
		t, ok := s.CPUTime()
		if !ok {
			return nil, false
		}
		role := "workers"
		switch {
		case s.Node.Stage:
			role = "stages"
		case s.Node.Role == wire.RoleShadow:
			role = "shadow"
		}
		by[role] += t.Seconds()
	}
	return by, true
}

// watchServers stops the main node p when a server it needs ends (other
// than the fault's victim), instead of letting it wait out its dial
// timeout for a node that is gone. Once p has ended, the returned func
// says which server that was (nil: none).
func watchServers(p *Proc, servers []*Proc, f *fault) func() *Proc {
	var gone *Proc
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			for i, s := range servers {
				if s.Exited() && (f == nil || i != f.victim) {
					gone = s
					p.Stop(5 * time.Second)
					return
				}
			}
		}
	}()
	return func() *Proc {
		<-done
		return gone
	}
}

// sameOutput compares two -dump directories byte for byte; "" if equal.
func sameOutput(want, got string) string {
	for _, f := range []string{"tokens.json", "logits.npy"} {
		a, err1 := os.ReadFile(filepath.Join(want, f))
		b, err2 := os.ReadFile(filepath.Join(got, f))
		switch {
		case err1 != nil:
			return fmt.Sprintf("no reference %s: %v", f, err1)
		case err2 != nil:
			return fmt.Sprintf("no %s: %v", f, err2)
		case !bytes.Equal(a, b):
			return f + " differs from local mode's"
		}
	}
	return ""
}

// writeReport writes report.json, report.md and the timelines.
func writeReport(opt BenchOptions, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(opt.Out, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var timelines []string
	for _, r := range rep.Runs {
		if r.Trace == "" {
			continue
		}
		tf, err := trace.ReadFile(r.Trace)
		if err != nil {
			return err
		}
		name := "timeline-" + string(r.Mode) + ".svg"
		if r.Mode == ModeShadow {
			name = "timeline.svg"
		}
		if err := writeTimeline(filepath.Join(opt.Out, name), tf, fmt.Sprintf("%s swarm, %s: decode passes %d-%d, measured", r.Mode, r.Case, tf.From, tf.To)); err != nil {
			return err
		}
		timelines = append(timelines, name)
	}
	var md bytes.Buffer
	WriteMarkdown(&md, rep, timelines)
	return os.WriteFile(filepath.Join(opt.Out, "report.md"), md.Bytes(), 0o644)
}

func writeTimeline(path string, tf *trace.File, title string) error {
	var buf bytes.Buffer
	if err := Timeline(&buf, tf, TimelineOptions{Title: title}); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// ReadRigState reads the emulated rig's settings (testbed/rig's state
// file: nodes, rate, delay, delay_by, loss, ...); nil if no rig is up.
func ReadRigState() map[string]string {
	b, err := os.ReadFile(filepath.Join(RigStateDir, "state"))
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			out[k] = strings.Trim(v, `"'`)
		}
	}
	return out
}
