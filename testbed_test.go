package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/testbed"
)

// tinyModel generates the tiny preset with the CLI, as a user would.
func tinyModel(t testing.TB) string {
	t.Helper()
	model := filepath.Join(t.TempDir(), "tiny")
	if _, se, code := run(t, "", "gen-tiny", "-out", model, "-log-level", "warn"); code != 0 {
		t.Fatalf("gen-tiny: %s", se)
	}
	return model
}

// loopbackRig writes dir/loop.rig: a main node, an fp16 shadow and
// workers w1..wN with workerFlags, on free loopback ports.
func loopbackRig(t *testing.T, dir string, workers int, workerFlags string) string {
	t.Helper()
	var rig strings.Builder
	fmt.Fprintln(&rig, "main main 127.0.0.1")
	for i := range workers + 1 {
		addr := freeLoopbackAddr(t)
		if i == 0 {
			fmt.Fprintf(&rig, "shadow shadow %s -quant fp16\n", addr)
		} else {
			fmt.Fprintf(&rig, "w%d worker %s %s\n", i, addr, workerFlags)
		}
	}
	path := filepath.Join(dir, "loop.rig")
	if err := os.WriteFile(path, []byte(rig.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// benchRig runs `odmoe bench rig -via local` on rigFile with the extra
// flags, into out, and returns its report.json.
func benchRig(t *testing.T, rigFile, model, out string, flags ...string) testbed.Report {
	t.Helper()
	args := append([]string{"bench", "rig", "-via", "local", "-rig", rigFile, "-model", model, "-out", out, "-log-level", "warn"}, flags...)
	so, se, code := run(t, "", args...)
	if code != 0 {
		t.Fatalf("bench rig exit %d:\n%s\n%s", code, so, se)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep testbed.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestBenchRigOnLoopbackProcesses runs the rig benchmark end to end with
// real processes on loopback (-via local: no namespaces needed): every
// mode runs every case, matches local mode bit for bit, and the report,
// the table and the timelines are written from what was measured.
func TestBenchRigOnLoopbackProcesses(t *testing.T) {
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := loopbackRig(t, dir, 4, "-device-mem 64MiB -host-cache 16MiB")
	out := filepath.Join(dir, "out")
	rep := benchRig(t, rigFile, model, out, "-cases", "6x5,12x4", "-trace-iters", "2:3")
	if len(rep.Runs) != 8 || len(rep.Nodes) != 6 || rep.Machine.CPUs < 1 {
		t.Fatalf("report: %d runs, %d nodes, machine %+v", len(rep.Runs), len(rep.Nodes), rep.Machine)
	}
	for i, r := range rep.Runs {
		wantMode := testbed.AllModes[i/2]
		var st struct {
			Generated int              `json:"generated_tokens"`
			Prompt    int              `json:"prompt_tokens"`
			Decode    float64          `json:"decode_tokens_per_s"`
			Loads     int              `json:"expert_loads"`
			Recall    *float64         `json:"recall"`
			Peak      map[string]int64 `json:"peak_memory_bytes"`
		}
		if err := json.Unmarshal(r.Stats, &st); err != nil {
			t.Fatal(err)
		}
		// /proc/stat counts CPU time in 10 ms ticks: a run shorter than a
		// few of them (local mode's ~10 ms on a quiet machine) may see none
		busyMeasured := r.CPUBusy > 0 || r.WallS < 0.05
		if r.Mode != wantMode || !r.Identical || st.Generated != r.Output || st.Prompt != r.Prompt || st.Decode <= 0 || !busyMeasured {
			t.Errorf("run %d: %+v, stats %s", i, r, r.Stats)
		}
		switch r.Mode {
		case testbed.ModeResident:
			if st.Loads != 0 {
				t.Errorf("the resident swarm loaded %d experts", st.Loads)
			}
		case testbed.ModeShadow:
			if st.Recall == nil || st.Peak["shadow"] <= 0 {
				t.Errorf("shadow run without recall or shadow memory: %s", r.Stats)
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(md), "| mode |"); n != 2 || !strings.Contains(string(md), "of the resident (fully cached) swarm's tokens/s") {
		t.Errorf("report.md has %d tables:\n%s", n, md)
	}
	for _, m := range []string{"resident", "reactive", "shadow"} {
		tf, err := trace.ReadFile(filepath.Join(out, "trace-"+m+".json"))
		if err != nil {
			t.Fatal(err)
		}
		nodes := 5 // main and the workers
		if m == "shadow" {
			nodes = 6
		}
		if tf.From != 2 || tf.To != 3 || len(tf.Nodes) != nodes {
			t.Errorf("%s trace: passes %d..%d, nodes %v", m, tf.From, tf.To, tf.Nodes)
		}
	}
	svg, err := os.ReadFile(filepath.Join(out, "timeline.svg"))
	if err != nil || !strings.Contains(string(svg), `class="span EC`) || !strings.Contains(string(svg), `class="span S`) {
		t.Errorf("timeline.svg without expert computes or shadow spans (%v)", err)
	}
}

// TestBenchRigRepeatsInRoundsWithTheResidentShadow: -repeat runs every
// mode once per round (a drifting machine weighs on all alike), each
// kept run carrying every round's rate; resident-shadow runs the shadow
// beside the pinned workers: predictions scored, nothing loaded.
func TestBenchRigRepeatsInRoundsWithTheResidentShadow(t *testing.T) {
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := loopbackRig(t, dir, 2, "-device-mem 64MiB")
	out := filepath.Join(dir, "out")
	rep := benchRig(t, rigFile, model, out, "-cases", "6x4", "-modes", "resident-shadow,shadow", "-repeat", "2")
	modes := []testbed.Mode{testbed.ModeLocal, testbed.ModeResidentShadow, testbed.ModeShadow}
	if len(rep.Runs) != len(modes) {
		t.Fatalf("%d runs kept, want one per mode: %+v", len(rep.Runs), rep.Runs)
	}
	for i, r := range rep.Runs {
		var st struct {
			Loads     int                `json:"expert_loads"`
			Recall    *float64           `json:"recall"`
			DecodeCPU map[string]float64 `json:"decode_cpu_s"`
		}
		if err := json.Unmarshal(r.Stats, &st); err != nil {
			t.Fatal(err)
		}
		// each role's CPU over decode alone: some, and within the run's
		// (read from /proc in 10 ms ticks, a tick a process short at most)
		for role, whole := range r.CPUSeconds {
			if r.Mode == testbed.ModeLocal {
				role = "local" // the bench's split calls the one process main
			}
			if d := st.DecodeCPU[role]; d <= 0 || d > whole+0.02 {
				t.Errorf("%s: %s's CPU over decode %v s, over the whole run %v s", r.Mode, role, d, whole)
			}
		}
		if r.Mode != testbed.ModeLocal && len(st.DecodeCPU) != 3 {
			t.Errorf("%s: decode CPU by role %v, want main, workers and shadow", r.Mode, st.DecodeCPU)
		}
		if r.Mode != modes[i] || !r.Identical || len(r.DecodeRuns) != 2 || len(r.Repeats) != 2 {
			t.Errorf("run %d: mode %s, identical %v, %d rates, %d repeats; want %s, identical, 2 of each", i, r.Mode, r.Identical, len(r.DecodeRuns), len(r.Repeats), modes[i])
		}
		if r.Mode == testbed.ModeResidentShadow && (st.Loads != 0 || st.Recall == nil) {
			t.Errorf("resident-shadow: %d loads, recall %v; want none loaded and the predictions scored", st.Loads, st.Recall)
		}
	}
	// the runs, in the order they ended: round 1 of every mode, then round 2
	var last time.Time
	for _, dir := range []string{"local-p6-o4", "resident-shadow-p6-o4", "shadow-p6-o4", "local-p6-o4-r2", "resident-shadow-p6-o4-r2", "shadow-p6-o4-r2"} {
		fi, err := os.Stat(filepath.Join(out, "runs", dir, "stats.json"))
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().After(last) {
			t.Errorf("%s ended at %v, not after the run before it (%v): not in rounds", dir, fi.ModTime(), last)
		}
		last = fi.ModTime()
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil || !strings.Contains(string(md), "of resident-shadow's") {
		t.Errorf("report.md gives no shadow / resident-shadow ratio (%v):\n%s", err, md)
	}
}

// TestLaunchStartsARigAndStopsItOnInterrupt: odmoe launch (-via local)
// starts the workers and the shadow, prints a main-node command line
// that works as printed, and stops every node on SIGINT.
func TestLaunchStartsARigAndStopsItOnInterrupt(t *testing.T) {
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := loopbackRig(t, dir, 2, "")
	logs := filepath.Join(dir, "logs")
	cmd := exec.Command(odmoeBin(t), "launch", "-via", "local", "-rig", rigFile, "-model", model, "-mode", "shadow", "-logs", logs, "-log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	var line string
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, odmoeBin(t)+" run -role=main") {
			line = l
			break
		}
	}
	if line == "" {
		t.Fatal("launch printed no main-node command line")
	}
	// run the printed line as a user would paste it
	mainCmd := exec.Command("sh", "-c", line+" -n 5")
	out, err := mainCmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "generated tokens: 5") || !strings.Contains(string(out), "shadow: recall") {
		t.Fatalf("the printed main command (%s): %v\n%s", line, err, out)
	}
	go io.Copy(io.Discard, stdout)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("launch after SIGINT: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("launch did not stop its nodes within 30 s of SIGINT")
	}
	for _, n := range []string{"shadow", "w1", "w2"} {
		b, err := os.ReadFile(filepath.Join(logs, n+".log"))
		if err != nil {
			t.Fatal(err)
		}
		if n != "shadow" && !strings.Contains(string(b), "peer connected") {
			t.Errorf("%s's log shows no connection:\n%s", n, b)
		}
	}
}

// TestBenchFaultModeKillsAWorkerMidRun: bench rig's fault mode kills
// worker w2 during the decode of a shadow-driven run (loads paced so the
// decode lasts a few seconds); the run stays bit-identical, its stats
// count the lost worker, and report.md says what the fault cost.
func TestBenchFaultModeKillsAWorkerMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("two runs of a few seconds with real processes")
	}
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := loopbackRig(t, dir, 4, "-device-mem 64MiB -load-bw 8MB")
	out := filepath.Join(dir, "out")
	rep := benchRig(t, rigFile, model, out, "-modes", "fault", "-cases", "6x100")
	if len(rep.Runs) != 3 || rep.Runs[1].Mode != testbed.ModeShadow || rep.Runs[2].Mode != testbed.ModeFault {
		t.Fatalf("runs: %+v", rep.Runs)
	}
	fr := rep.Runs[2]
	var st struct {
		Faults map[string]int64 `json:"faults"`
	}
	json.Unmarshal(fr.Stats, &st)
	if !fr.Identical || fr.FaultNode != "w2" || fr.FaultAtS <= 0 || st.Faults["workers_lost"] != 1 {
		t.Fatalf("fault run: %+v, faults %v", fr, st.Faults)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "Fault: w2 killed (SIGKILL)") || !strings.Contains(string(md), "recovery **") {
		t.Errorf("report.md does not report the fault:\n%s", md)
	}
}

// fetchRig writes, in dir, a loopback rig whose main node serves the
// weights on a port of its own (-fetch): a stage of the tiny model's
// last layers, an int8 shadow and two workers.
func fetchRig(t *testing.T, dir string) string {
	t.Helper()
	var rig strings.Builder
	fmt.Fprintf(&rig, "main main %s\n", freeLoopbackAddr(t))
	fmt.Fprintf(&rig, "stage1 stage %s -layers 2-\n", freeLoopbackAddr(t))
	fmt.Fprintf(&rig, "shadow shadow %s -quant int8\n", freeLoopbackAddr(t))
	for i := range 2 {
		fmt.Fprintf(&rig, "w%d worker %s -device-mem 64MiB\n", i+1, freeLoopbackAddr(t))
	}
	path := filepath.Join(dir, "fetch.rig")
	if err := os.WriteFile(path, []byte(rig.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLaunchWithFetchStartsEveryNodeFromNothing: odmoe launch -fetch
// (-via local) starts a stage, the shadow and two workers on empty
// directories of their own; the printed main-node command serves the
// model and store on the rig's main address, the nodes fill their
// directories from it (the stage its layers, the shadow every layer
// and every layer's experts as the store's chunks, each worker its
// share of the store), and the run is
// local mode's bit for bit.
func TestLaunchWithFetchStartsEveryNodeFromNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes")
	}
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := fetchRig(t, dir)
	logs, nodes := filepath.Join(dir, "logs"), filepath.Join(dir, "nodes")
	cmd := exec.Command(odmoeBin(t), "launch", "-via", "local", "-fetch", "-node-files", nodes, "-rig", rigFile, "-model", model, "-mode", "shadow", "-logs", logs, "-log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	}()
	sc := bufio.NewScanner(stdout)
	var line string
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, odmoeBin(t)+" run -role=main") {
			line = l
			break
		}
	}
	go io.Copy(io.Discard, stdout)
	if line == "" || !strings.Contains(line, "-store-listen=") || !strings.Contains(line, "-store=") {
		t.Fatalf("launch printed no main-node command line serving the weights: %q", line)
	}
	local, swarm := filepath.Join(dir, "local"), filepath.Join(dir, "swarm")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", model, "-prompt", "Hello", "-n", "8", "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 { // the printed line's prompt
		t.Fatalf("local run: %s", se)
	}
	out, err := exec.Command("sh", "-c", line+" -n 8 -ignore-eos -dump "+swarm).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shadow: recall") {
		t.Fatalf("the printed main command (%s): %v\n%s", line, err, out)
	}
	sameDump(t, swarm, local)
	// (the shadow's experts come as the store's chunks)
	for name, file := range map[string]string{"stage1": "model/layer-002.safetensors", "shadow": "store/index.bin", "w1": "store/index.bin", "w2": "store/index.bin"} {
		if _, err := os.Stat(filepath.Join(nodes, name, file)); err != nil {
			b, _ := os.ReadFile(filepath.Join(logs, name+".log"))
			t.Errorf("%s did not fetch %s: %v\n%s", name, file, err, b)
		}
	}
}

// TestBenchRigFromEmptyDirectories: bench rig -fetch (-via local) starts
// a stage, the shadow and two workers on empty directories of their own,
// twice, with a main node serving the weights: the first start fetches
// each node's share once (a worker's share of the store, the stage's
// layers, the shadow's whole model), the second nothing; the report says
// so, and the run after is local mode's bit for bit.
func TestBenchRigFromEmptyDirectories(t *testing.T) {
	if testing.Short() {
		t.Skip("a swarm of processes, started three times")
	}
	dir, model := t.TempDir(), tinyModel(t)
	rigFile := fetchRig(t, dir)
	out := filepath.Join(dir, "out")
	rep := benchRig(t, rigFile, model, out, "-fetch", "-node-files", filepath.Join(dir, "nodes"), "-modes", "shadow", "-cases", "6x4")
	if len(rep.Fill) != 2 || len(rep.Runs) != 2 || !rep.Runs[1].Identical {
		t.Fatalf("fill %+v, runs %+v", rep.Fill, rep.Runs)
	}
	for i, fs := range rep.Fill {
		if len(fs.Nodes) != 4 || fs.ReadyS <= 0 {
			t.Fatalf("start %d: %+v: want the four nodes' shares", i+1, fs)
		}
		for _, n := range fs.Nodes {
			switch {
			case n.ShareBytes <= 0:
				t.Errorf("start %d: %s's share is %d bytes", i+1, n.Name, n.ShareBytes)
			case i == 0 && (n.FetchedBytes < n.ShareBytes || float64(n.FetchedBytes) > 1.05*float64(n.ShareBytes)):
				t.Errorf("start 1: %s fetched %d bytes of a share of %d: want its share once", n.Name, n.FetchedBytes, n.ShareBytes)
			case i == 1 && n.FetchedBytes != 0:
				t.Errorf("start 2: %s fetched %d bytes: want nothing", n.Name, n.FetchedBytes)
			}
		}
	}
	// the shadow's experts came as the store's chunks: none of their
	// tensors in its checkpoint, its store whole
	if experts, _ := filepath.Glob(filepath.Join(dir, "nodes", "shadow", "model", "*-experts.safetensors")); len(experts) > 0 {
		t.Errorf("the shadow fetched expert tensors %v: want its experts as the store's chunks", experts)
	}
	if st, err := store.Open(filepath.Join(dir, "nodes", "shadow", "store"), store.Options{}); err != nil {
		t.Errorf("the shadow's store: %v", err)
	} else {
		if err := st.Verify(context.Background(), nil); err != nil {
			t.Errorf("the shadow's store does not hold every layer's experts: %v", err)
		}
		st.Close()
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	if err != nil || !strings.Contains(string(md), "## Start 2 from the nodes' own directories") {
		t.Errorf("report.md does not give the starts (%v):\n%s", err, md)
	}
}
