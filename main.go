// Command odmoe runs Mixture-of-Experts language models losslessly on a
// swarm of small edge nodes. One binary, subcommands:
//
//	odmoe gen-tiny  -out DIR [-preset tiny|small|mixtral-layers] [-seed N]
//	odmoe demo      [-preset tiny|small] [-workers 8] [-prompt TEXT]
//	odmoe run       -role local|main|worker|shadow ...
//	odmoe convert   -model DIR -out STORE_DIR [-shards K] [-force]
//	odmoe inspect   -store STORE_DIR [-verify] [-model DIR]
//	odmoe certs     -out DIR -nodes main,shadow,w1,...
//	odmoe tune-align -model DIR [-quant int8] [-periods 1,2,4,8,16]
//	odmoe tokenize  -tokenizer FILE | -model DIR [-jsonl] [-special]
//	odmoe template  -config tokenizer_config.json | -model DIR [-jsonl]
//	odmoe launch    -rig FILE -model DIR [-via netns|local|ssh] [-mode shadow]
//	odmoe bench rig -rig FILE -model DIR -out DIR [-cases 16x64,...]
//	odmoe bench serve [-preset small] [-clients 1,2,4,8] [-out DIR]
//
// Run `odmoe COMMAND -h` for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: it parses its own flags from args.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

var commands = map[string]command{
	"certs":      {"make a cluster CA and a certificate for each node (mutual TLS)", runCerts},
	"bench":      {"measure this machine (odmoe bench kernels: bandwidth, matvec, decode)", runBench},
	"convert":    {"compress a model's experts losslessly into a store directory", runConvert},
	"demo":       {"start a whole swarm on this machine on a generated model and serve the API (-prompt: answer once)", runDemo},
	"gen-tiny":   {"write a deterministic random model in Hugging Face layout", runGenTiny},
	"fetch":      {"fill a store directory with this node's share of the expert store other nodes hold (checked, resumable)", runFetch},
	"launch":     {"start a rig's workers and shadow (emulated, local or over ssh) until interrupted (testbed/launch)", runLaunch},
	"inspect":    {"report a store's sizes against the entropy bound; -verify checks every chunk", runInspect},
	"run":        {"run a role (local: the whole model in one process)", runRun},
	"tune-align": {"try token/KV alignment periods for the shadow and print the fastest", runTuneAlign},
	"sim":        {"predict a bench rig case on a rig of given costs, each node on its own CPU (package sim)", runSim},
	"plan":       {"plan a swarm of one kind of node for a model's config.json: its stages, shadow stages and workers, what each holds, its speed", runPlan},
	"tokenize":   {"encode text (stdin) into token ids with a tokenizer.json", runTokenize},
	"template":   {"render conversations (JSON on stdin) with a model's chat template, as transformers does", runTemplate},
	"version":    {"print the build: version, commit, Go version, kernel path", runVersion},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(dispatch(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// dispatch runs the subcommand named by args[0] and returns the exit code.
func dispatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) >= 2 && args[0] == "help" { // odmoe help run: run's flags
		if _, ok := commands[args[1]]; !ok {
			fmt.Fprintf(stderr, "odmoe help: unknown command %q (odmoe help lists them)\n", args[1])
			return 2
		}
		return dispatch(ctx, append([]string{args[1]}, append(args[2:], "-h")...), stdin, stdout, stderr)
	}
	if len(args) == 0 { // a mistake: usage where errors go
		usage(stderr)
		return 2
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stdout) // asked for: on stdout, to page or grep
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "odmoe: unknown command %q (odmoe help lists them)\n", args[0])
		return 2
	}
	if err := cmd.run(ctx, args[1:], stdin, stdout, stderr); err != nil {
		var help helpRequest
		if errors.As(err, &help) {
			help.print(stdout)
			return 0
		}
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "odmoe %s: %v\n", args[0], err)
			return 2
		}
		fmt.Fprintf(stderr, "odmoe %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "odmoe runs Mixture-of-Experts models losslessly on a swarm of small edge nodes.")
	fmt.Fprintln(w, "\nUsage: odmoe COMMAND [flags]   (odmoe help COMMAND, or odmoe COMMAND -h, for its flags)")
	fmt.Fprintln(w, "\nCommands:")
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
}
