package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/testbed"
	"github.com/rs/zerolog"
)

// rigFlags are what launch and bench rig share: the rig, the files, and
// how nodes are started.
type rigFlags struct {
	rig, model, store, certs, via, remoteDir, netDelay, nodeFiles string
	fetch                                                         bool
	log                                                           runflags.Log
}

func (f *rigFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.rig, "rig", "testbed/rigs/paper.rig", "rig description `FILE` (nodes, roles, addresses, flags)")
	fs.StringVar(&f.model, "model", "", "Hugging Face model `DIR` (required)")
	fs.StringVar(&f.store, "store", "", "expert store `DIR`; default MODEL.store, made with odmoe convert if missing")
	fs.StringVar(&f.certs, "certs", "", "cluster certificates `DIR`; default MODEL.certs-RIGNAME, made for the rig's nodes if missing")
	fs.StringVar(&f.via, "via", "netns", "how nodes start: netns (the emulated rig of testbed/rig up), local (processes on this machine, loopback addresses), ssh (a real LAN)")
	fs.StringVar(&f.remoteDir, "remote-dir", "/opt/odmoe", "ssh: the `DIR` on every host holding odmoe, model, store, certs (odmoe launch -push puts them there)")
	fs.BoolVar(&f.fetch, "fetch", false, "start every node but the main node on directories of its own, empty at first, which it fills from the main node (their -fetch-from; the main node serves its model and store on -store-listen, its rig address's port or 7600), each piece checked; a second start fetches nothing")
	fs.StringVar(&f.nodeFiles, "node-files", "", "with -fetch on this machine (local, netns): the `DIR` holding each node's directories (NAME/model, NAME/store); default MODEL.nodes-RIGNAME")
	fs.StringVar(&f.netDelay, "net-delay", "auto", "one-way delay every node adds to what it sends: auto = the emulated rig's delay when the kernel has no netem (testbed/rig state), else a duration or 0")
}

// setup reads the rig, makes the store and certificates if missing, and
// returns the options that say how to start nodes (testbed.Setup).
func (f *rigFlags) setup(ctx context.Context, log zerolog.Logger) (testbed.BenchOptions, error) {
	if f.model == "" {
		return testbed.BenchOptions{}, usagef("-model is required")
	}
	if err := testbed.CheckVia(f.via, f.remoteDir); err != nil {
		return testbed.BenchOptions{}, usagef("%v", err)
	}
	delay, err := testbed.ParseNetDelay(f.netDelay)
	if err != nil {
		return testbed.BenchOptions{}, usagef("%v", err)
	}
	if f.nodeFiles != "" && !f.fetch {
		return testbed.BenchOptions{}, usagef("-node-files is where -fetch puts the nodes' directories: give -fetch too")
	}
	return testbed.Setup(ctx, testbed.SetupOptions{Rig: f.rig, Model: f.model, Store: f.store, Certs: f.certs, Via: f.via, RemoteDir: f.remoteDir, NetDelay: delay,
		Fetch: f.fetch, NodeFiles: f.nodeFiles}, log)
}

func runBenchRig(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench rig", stderr)
	var rf rigFlags
	rf.register(fs)
	out := fs.String("out", "", "`DIR` for report.json, report.md, timeline.svg, per-run dumps and node logs (required)")
	cases := fs.String("cases", "16x64,16x256,128x64,128x256", "PROMPTxOUTPUT token lengths to run (OD-MoE's by default)")
	modes := fs.String("modes", "resident,reactive,shadow", "swarm modes to run besides local: resident, resident-shadow (resident with the shadow running, aligned and hinting as in shadow mode: the baseline that pays the shadow's CPU), reactive, shadow, shadow-late (shadow with the shadow's -ahead 0: OD-MoE's late departure), residency (shadow with -residency on: experts stay on their owners while the budget allows), residency-uniform (the same with -placement uniform), draft (shadow with -draft auto: each pass checks the shadow's guessed tokens where it pays), fault (shadow with worker w2 killed 40% into each decode: tokens/s with and without the fault, and the recovery time)")
	traceIters := fs.String("trace-iters", "3:5", "decode passes the timelines show, FROM:TO")
	repeat := fs.Int("repeat", 1, "run every case `N` times on each mode, in rounds of every mode in turn (each round starts its nodes afresh), and report the run of median decode tokens/s with the others' rates (a shared machine's speed drifts by 10-20% over minutes)")
	residencyMem := fs.String("residency-device-mem", "", "residency mode: every worker's -device-mem `SIZE` (e.g. 38MiB: a quarter of a model's expert bytes over 8 workers), where the other modes keep the rig's; empty = the rig's")
	rf.log.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(rf.log, stderr)
	if err != nil {
		return err
	}
	if *out == "" {
		return usagef("-out is required")
	}
	cs, err := testbed.ParseCases(*cases)
	if err != nil {
		return usagef("-cases: %v", err)
	}
	ms, err := testbed.ParseModes(*modes)
	if err != nil {
		return usagef("-modes: %v", err)
	}
	if *repeat < 1 {
		return usagef("-repeat %d: want 1 or more", *repeat)
	}
	opt, err := rf.setup(ctx, log)
	if err != nil {
		return err
	}
	if opt.Out, err = filepath.Abs(*out); err != nil {
		return err
	}
	opt.Cases, opt.Modes, opt.TraceIters, opt.ResidencyDeviceMem, opt.Repeat = cs, ms, *traceIters, *residencyMem, *repeat
	opt.Command = "odmoe bench rig " + strings.Join(args, " ")
	rep, err := testbed.Bench(opt)
	if rep != nil {
		fmt.Fprintf(stdout, "report: %s\n", filepath.Join(opt.Out, "report.md"))
	}
	return err
}

func runLaunch(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("launch", stderr)
	var rf rigFlags
	rf.register(fs)
	mode := fs.String("mode", "shadow", "what to start: shadow (workers and the shadow), reactive (workers), resident (workers holding their experts)")
	push := fs.Bool("push", false, "ssh: first copy the binary, model, store and certificates to every host's -remote-dir (with -fetch: the binary and certificates alone)")
	logDir := fs.String("logs", "rig-logs", "`DIR` for each node's log")
	rf.log.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(rf.log, stderr)
	if err != nil {
		return err
	}
	m := testbed.Mode(*mode)
	if m != testbed.ModeShadow && m != testbed.ModeReactive && m != testbed.ModeResident {
		return usagef("-mode %q unknown: shadow, reactive or resident", *mode)
	}
	opt, err := rf.setup(ctx, log)
	if err != nil {
		return err
	}
	if *push {
		if _, ok := opt.Via.(testbed.SSH); !ok {
			return usagef("-push is for -via ssh")
		}
	}
	return testbed.Up(ctx, opt, m, *push, *logDir, stdout)
}
