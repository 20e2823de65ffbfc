package main

import (
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// odmoeBin builds the binary once per test run: the end-to-end tests drive
// the real executable, as a user would.
func odmoeBin(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "odmoe-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "odmoe")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = &buildError{out: string(out), err: err}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

func run(t testing.TB, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(odmoeBin(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var so, se strings.Builder
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return so.String(), se.String(), code
}

func TestGenTinyThenRunLocalWithDump(t *testing.T) {
	dir := t.TempDir()
	modelDir, dump := filepath.Join(dir, "tiny"), filepath.Join(dir, "dump")
	if _, se, code := run(t, "", "gen-tiny", "-out", modelDir, "-seed", "3"); code != 0 {
		t.Fatalf("gen-tiny exit %d: %s", code, se)
	}
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		if _, err := os.Stat(filepath.Join(modelDir, f)); err != nil {
			t.Fatalf("gen-tiny did not write %s", f)
		}
	}
	so, se, code := run(t, "", "run", "-role", "local", "-model", modelDir, "-prompt", "Hello world", "-n", "5", "-ignore-eos", "-dump", dump)
	if code != 0 {
		t.Fatalf("run exit %d: %s", code, se)
	}
	lines := strings.Split(strings.TrimSpace(so), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(so, "Hello world") || !strings.Contains(last, "generated tokens: 5") || !strings.Contains(last, "decode:") {
		t.Fatalf("unexpected output:\n%s", so)
	}
	var toks struct{ Prompt, Generated []int }
	b, err := os.ReadFile(filepath.Join(dump, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &toks); err != nil || len(toks.Generated) != 5 || len(toks.Prompt) < 2 {
		t.Fatalf("tokens.json %s (%v)", b, err)
	}
	var cfg struct {
		Vocab int `json:"vocab_size"`
	}
	cb, _ := os.ReadFile(filepath.Join(modelDir, "config.json"))
	json.Unmarshal(cb, &cfg)
	npy, err := os.ReadFile(filepath.Join(dump, "logits.npy"))
	if err != nil {
		t.Fatal(err)
	}
	hl := int(binary.LittleEndian.Uint16(npy[8:10]))
	if got, want := len(npy)-10-hl, 5*cfg.Vocab*4; got != want {
		t.Fatalf("logits.npy holds %d data bytes, want %d (5 steps x %d vocab)", got, want, cfg.Vocab)
	}

	if !strings.Contains(se, "in memory") {
		t.Errorf("the run (-weights auto) did not say its weights are in memory:\n%s", se)
	}

	// Same run again, its weights mapped: greedy decoding is deterministic,
	// wherever the weights live; dumps are identical.
	dump2 := filepath.Join(dir, "dump2")
	if _, se, code := run(t, "", "run", "-model", modelDir, "-prompt", "Hello world", "-n", "5", "-ignore-eos", "-weights", "mapped", "-dump", dump2); code != 0 {
		t.Fatalf("second run exit %d: %s", code, se)
	} else if !strings.Contains(se, `weights=mapped`) {
		t.Errorf("the run with -weights mapped did not say so:\n%s", se)
	}
	npy2, _ := os.ReadFile(filepath.Join(dump2, "logits.npy"))
	if string(npy) != string(npy2) {
		t.Fatal("two identical greedy runs, weights in memory and mapped, dumped different logits")
	}

	// tokenize -jsonl agrees with the prompt ids the run used (minus BOS).
	so, se, code = run(t, "\"Hello world\"\n", "tokenize", "-model", modelDir, "-jsonl")
	if code != 0 {
		t.Fatalf("tokenize exit %d: %s", code, se)
	}
	var ids []int
	if err := json.Unmarshal([]byte(strings.TrimSpace(so)), &ids); err != nil {
		t.Fatalf("tokenize output %q: %v", so, err)
	}
	if len(ids) != len(toks.Prompt)-1 || ids[0] != toks.Prompt[1] {
		t.Fatalf("tokenize gave %v, run's prompt was %v", ids, toks.Prompt)
	}
}

// TestDemoRunsASwarmOfProcesses: `odmoe demo` starts workers and the main
// node as separate processes and its answer equals local mode's.
func TestDemoRunsASwarmOfProcesses(t *testing.T) {
	cache := t.TempDir()
	statsFile := filepath.Join(t.TempDir(), "stats.json")
	so, se, code := run(t, "", "demo", "-workers", "4", "-n", "6", "-prompt", "Hello world", "-cache", cache, "-stats", statsFile)
	if code != 0 {
		t.Fatalf("demo exit %d:\n%s\n%s", code, so, se)
	}
	var st struct {
		Generated int                `json:"generated_tokens"`
		Loads     int                `json:"expert_loads"`
		Misses    *int               `json:"misses"`
		Stall     *float64           `json:"stall_fraction"`
		Peak      map[string]float64 `json:"peak_memory_bytes"`
		Workers   []map[string]float64
	}
	b, err := os.ReadFile(statsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if st.Generated != 6 || st.Loads == 0 || st.Misses == nil || st.Stall == nil || len(st.Workers) != 4 || st.Peak["main"] <= 0 || st.Peak["worker_device"] <= 0 {
		t.Fatalf("stats: %s", b)
	}
	// the same prompt in local mode prints the same text
	lo, se, code := run(t, "", "run", "-role", "local", "-model", filepath.Join(cache, "models", "tiny-seed1"), "-prompt", "Hello world", "-n", "6")
	if code != 0 {
		t.Fatalf("local exit %d: %s", code, se)
	}
	firstLine := func(s string) string { return strings.SplitN(s, "\n", 2)[0] }
	if firstLine(so) != firstLine(lo) {
		t.Fatalf("demo printed %q, local %q", firstLine(so), firstLine(lo))
	}
}

func TestCommandLineErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"run", "-role", "local"}, 2, "-model is required"},
		{[]string{"run", "-role", "martian", "-model", "x"}, 2, `-role "martian" unknown`},
		{[]string{"run", "-role", "worker"}, 2, "-store is required"},
		{[]string{"run", "-role", "worker", "-store", "x", "-device-mem", "lots"}, 2, `-device-mem "lots"`},
		{[]string{"run", "-role", "main", "-model", "x"}, 2, "-workers is required"},
		{[]string{"run", "-role", "main", "-model", "x", "-workers", "a:1", "-prefetch", "psychic"}, 2, `prefetch policy "psychic" unknown`},
		{[]string{"run", "-role", "shadow", "-model", "x"}, 2, "-workers is required for -role shadow"},
		{[]string{"run", "-role", "shadow", "-model", "x", "-workers", "a:1", "-quant", "int3"}, 2, `-quant: "int3" unknown`},
		{[]string{"run", "-model", "/does/not/exist"}, 1, "no such file"},
		{[]string{"gen-tiny", "-out", "/tmp/x", "-preset", "huge"}, 1, `unknown preset "huge"`},
		{[]string{"tokenize"}, 2, "-tokenizer or -model is required"},
		{[]string{"run", "-role", "local", "-model", "x", "-temperature", "-1"}, 2, "-temperature must be >= 0"},
		{[]string{"run", "-role", "local", "-model", "x", "-top-p", "2"}, 2, "-top-p must be in (0, 1]"},
		{[]string{"run", "-role", "main", "-model", "x", "-workers", "a:1", "-prompt", ""}, 2, "-prompt is empty"},
		{[]string{"run", "-role", "main", "-model", "x", "-workers", "a:1", "-peer-timeout", "1ms"}, 2, "-peer-timeout 1ms: at least 100ms"},
		{[]string{"help", "nosuch"}, 2, `unknown command "nosuch"`},
		{[]string{"run", "-model", "x", "-log-level", "bogus"}, 2, `-log-level "bogus" unknown: want debug, info, warn or error`},
		{[]string{"run", "-bogus"}, 2, "flag provided but not defined: -bogus (odmoe run -h lists its flags)"},
		{[]string{"run", "-role", "shadow", "-model", "x", "-layers", "4"}, 2, `-layers: layers "4": want A-B`},
		{[]string{"run", "-role", "local", "-model", "x", "-mem", "plenty"}, 2, `-mem: want a size such as 16GiB, got "plenty"`},
		{[]string{"run", "-role", "main", "-model", "x", "-workers", "a:1", "-mem", "0"}, 2, `-mem: want a size such as 16GiB, got "0"`},
		{[]string{"run", "-role", "local", "-model", "x", "-weights", "ram"}, 2, `-weights: weights "ram": want auto, packed, memory or mapped`},
		{[]string{"run", "-role", "main", "-model", "x", "-workers", "a:1", "-weights", "ram"}, 2, `-weights: weights "ram": want auto, packed, memory or mapped`},
		{[]string{"run", "-role", "stage", "-model", "x", "-layers", "0-1", "-workers", "a:1", "-weights", "ram"}, 2, `-weights: weights "ram": want auto, packed, memory or mapped`},
		{[]string{"bench", "kernels", "-dtypes", "BF16,BF12"}, 2, `-dtypes: kernels: unsupported dtype "BF12" (want F32, F16 or BF16) (or BF16P: BF16 packed as -weights packed holds it)`},
	}
	for _, tc := range cases {
		_, se, code := run(t, "", tc.args...)
		if code != tc.code || !strings.Contains(se, tc.want) {
			t.Errorf("odmoe %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, se, tc.code, tc.want)
		}
		if tc.code == 2 && strings.Count(se, "\n") > 2 {
			t.Errorf("odmoe %v: %d lines on stderr, want the error alone:\n%s", tc.args, strings.Count(se, "\n"), se)
		}
	}
}

// TestRunHelpIsGroupedByRole: run -h starts with a usage line and
// examples, lists each role's flags under its heading (one role's alone
// after -role), and no line is 100 characters or more.
func TestRunHelpIsGroupedByRole(t *testing.T) {
	all, _, code := run(t, "", "run", "-h")
	if code != 0 || !strings.HasPrefix(all, "Usage: odmoe run -role") || !strings.Contains(all, "Examples:") {
		t.Fatalf("run -h: exit %d:\n%s", code, all)
	}
	for _, heading := range []string{"\nLocal (", "\nMain node (", "\nWorker (", "\nShadow (", "\nEvery role:"} {
		if !strings.Contains(all, heading) {
			t.Errorf("run -h has no %q heading", strings.TrimSpace(heading))
		}
	}
	for _, line := range strings.Split(all, "\n") {
		if len(line) >= 100 {
			t.Errorf("a line of %d characters: %q", len(line), line)
		}
	}
	worker, _, _ := run(t, "", "run", "-role", "worker", "-h")
	if !strings.Contains(worker, "-device-mem") || strings.Contains(worker, "\n  -prefetch") || strings.Contains(worker, "\nMain node (") {
		t.Errorf("run -role worker -h lists more than the worker's flags:\n%s", worker)
	}
}

// TestHelpGoesToStdout: help asked for (odmoe help, -h, help COMMAND,
// COMMAND -h, a subcommand's -h) is printed on stdout, to page or grep,
// and exits 0; odmoe alone prints the usage on stderr and exits 2.
func TestHelpGoesToStdout(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"help"}, "Commands:"}, {[]string{"-h"}, "Commands:"}, {[]string{"help", "run"}, "-prefetch"},
		{[]string{"run", "-h"}, "-prefetch"}, {[]string{"sim", "sweep", "-h"}, "-vary"}, {[]string{"help", "convert"}, "-shards"},
		{[]string{"bench", "-h"}, "Targets:"}, {[]string{"--version"}, "wire protocol"}, {[]string{"-version"}, "wire protocol"},
	} {
		so, se, code := run(t, "", c.args...)
		if code != 0 || !strings.Contains(so, c.want) || se != "" {
			t.Errorf("odmoe %v: exit %d, stdout %d bytes (want %q in it), stderr %q", c.args, code, len(so), c.want, se)
		}
	}
	if so, se, code := run(t, ""); code != 2 || so != "" || !strings.Contains(se, "Commands:") {
		t.Errorf("odmoe alone: exit %d, stdout %q, stderr %d bytes", code, so, len(se))
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestTuneAlignPrintsATableAndTheBest runs the alignment sweep on a tiny
// model with an in-process swarm.
func TestTuneAlignPrintsATableAndTheBest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if _, se, code := run(t, "", "gen-tiny", "-out", dir, "-seed", "5"); code != 0 {
		t.Fatalf("gen-tiny: %s", se)
	}
	so, se, code := run(t, "", "tune-align", "-model", dir, "-periods", "1,0", "-workers", "2", "-n", "4", "-quant", "fp16", "-load-bw", "0")
	if code != 0 {
		t.Fatalf("tune-align exit %d: %s", code, se)
	}
	if strings.Contains(se, "INF") {
		t.Errorf("tune-align logged at info level by default:\n%s", se)
	}
	for _, want := range []string{"T1_KV1", "T1_KV0", "T0_KV1", "T0_KV0", "best: T", "median of 3 runs", "min-max", "main node flags: -prefetch shadow -align-token "} {
		if !strings.Contains(so, want) {
			t.Errorf("output lacks %q:\n%s", want, so)
		}
	}
}

// TestRunPastTheContextIsRefusedBeforeAnyWork: a prompt and -n that do
// not fit the model's context are refused at once, saying what would fit,
// and nothing is dumped.
func TestRunPastTheContextIsRefusedBeforeAnyWork(t *testing.T) {
	model := tinyModel(t)
	dump := filepath.Join(t.TempDir(), "dump")
	so, se, code := run(t, "", "run", "-role", "local", "-model", model, "-prompt-tokens", "4090", "-n", "16", "-dump", dump, "-log-level", "warn")
	if code == 0 || !strings.Contains(se, "need 4105 positions, more than the context of 4096") || !strings.Contains(se, "-n 7 or less") || so != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, so, se)
	}
	if entries, _ := os.ReadDir(dump); len(entries) != 0 {
		t.Fatalf("the refused run left %d files in its dump directory", len(entries))
	}
}

// TestMainNodeToAbsentWorkerSaysSoAndStops: a main node pointed at a
// worker that is not running logs that it is still dialing, then gives up
// after -dial-timeout with an error naming the address.
func TestMainNodeToAbsentWorkerSaysSoAndStops(t *testing.T) {
	model := tinyModel(t)
	certs := filepath.Join(t.TempDir(), "certs")
	if _, se, code := run(t, "", "certs", "-out", certs, "-nodes", "main,w1", "-log-level", "warn"); code != 0 {
		t.Fatal(se)
	}
	addr := freeLoopbackAddr(t)
	start := time.Now()
	_, se, code := run(t, "", "run", "-role", "main", "-model", model, "-workers", addr, "-group", "1", "-certs", certs, "-name", "main", "-dial-timeout", "2s")
	if took := time.Since(start); code == 0 || took > 15*time.Second {
		t.Fatalf("exit %d after %v", code, took)
	}
	if !strings.Contains(se, "no answer yet; dialing again") || !strings.Contains(se, "no answer within 2s") || !strings.Contains(se, addr) {
		t.Fatalf("stderr does not show the dial's progress and end:\n%s", se)
	}
}

// TestVersionSaysWhatTheBinaryIs: odmoe version prints the Go version,
// the wire protocol and the kernel path this machine picks.
func TestVersionSaysWhatTheBinaryIs(t *testing.T) {
	so, se, code := run(t, "", "version")
	if code != 0 || !strings.Contains(so, "odmoe ") || !strings.Contains(so, runtime.Version()) || !strings.Contains(so, "wire protocol ") || !strings.Contains(so, "kernels ") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, so, se)
	}
	// a kernel path this CPU lacks is refused as run refuses it, not
	// reported as the one it would fall back to
	cmd := exec.Command(odmoeBin(t), "version")
	cmd.Env = append(os.Environ(), "ODMOE_KERNELS=bogus")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), `path "bogus" is not available`) || !strings.Contains(string(out), "available: ") {
		t.Errorf("ODMOE_KERNELS=bogus odmoe version: %v, %s", err, out)
	}
}

// TestMistakesSayWhatToDo: a store given as a model, a model given as a
// store and an API address in use each end the command at once with one
// line naming the mistake and the fix (the address before the model
// loads).
func TestMistakesSayWhatToDo(t *testing.T) {
	model := tinyModel(t)
	store := filepath.Join(t.TempDir(), "tiny.store")
	if _, se, code := run(t, "", "convert", "-model", model, "-out", store, "-log-level", "warn"); code != 0 {
		t.Fatalf("convert: %s", se)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "-role", "worker", "-insecure", "-name", "w1", "-listen", "127.0.0.1:0", "-store", model}, []string{"is a model directory", "odmoe convert -model " + model}},
		{[]string{"run", "-role", "local", "-model", store, "-prompt", "hi", "-n", "1"}, []string{"is an expert store", "give -model the Hugging Face directory"}},
		{[]string{"run", "-role", "local", "-model", "/nonexistent/model"}, []string{"a model directory holds a Hugging Face config.json"}},
		{[]string{"run", "-role", "local", "-model", model, "-http", busy.Addr().String()}, []string{"cannot serve there", "choose another ADDR, or port 0"}},
	} {
		_, se, code := run(t, "", append(c.args, "-log-level", "error")...)
		lines := strings.Split(strings.TrimSpace(se), "\n")
		last := lines[len(lines)-1]
		for _, w := range c.want {
			if code == 0 || !strings.Contains(last, w) {
				t.Errorf("odmoe %v: exit %d, last line %q, want it to say %q\n%s", c.args, code, last, w, se)
			}
		}
	}
}
