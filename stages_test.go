package main

import (
	"encoding/json"
	"fmt"
	"github.com/odmoe/odmoe/model"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/odmoe/odmoe/testbed"
)

// TestAStagedShadowIsTheWholeShadow runs a swarm (real processes, QUIC
// on loopback, two workers) whose shadow is split in two: a first stage
// holding layers 0-1 and the head, following the main node and dialing
// the workers, and a stage holding layers 2-3 (-layers, -stages). The
// main node's tokens and logits equal local mode's, and with -ahead 0
// (every guess waits for its alignment, so no timing enters the
// predictions) the staged shadow's recall equals one whole shadow's on
// the same swarm, exactly: the stages hand float32 rows on, so they
// compute what one node computes. The shadows are nf4, whose recall is
// below 1 here, so that equal recalls say something. A later stage of a
// shorter -context than the first's is refused, naming both.
func TestAStagedShadowIsTheWholeShadow(t *testing.T) {
	r := newChaosRig(t, 2)
	if _, se, code := run(t, "", "certs", "-out", filepath.Join(r.dir, "certs"), "-nodes", "shadow2=shadow", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	for i := range r.workers {
		r.startWorker(i)
	}
	const n = "48"
	local := filepath.Join(r.dir, "local")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	certs := filepath.Join(r.dir, "certs")
	shadowRun := func(name string, shadow ...string) float64 {
		t.Helper()
		r.start(shadow[0], shadow[1:]...)
		return shadowRecall(t, r, name, local, n)
	}
	shadowArgs := func(name string, extra ...string) []string {
		return append([]string{name, "run", "-role", "shadow", "-model", r.model, "-quant", "nf4", "-ahead", "0", "-group", "2",
			"-certs", certs, "-name", name, "-log-level", "info"}, extra...)
	}
	whole := shadowRun("whole", shadowArgs("shadow", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","))...)
	r.signal("shadow", syscall.SIGKILL)
	stageAddr := freeLoopbackAddr(t)
	r.start("shadow2", shadowArgs("shadow2", "-layers", "2-3", "-listen", stageAddr)[1:]...)
	staged := shadowRun("staged", shadowArgs("shadow", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","), "-layers", "0-1", "-stages", stageAddr)...)
	t.Logf("recall: one whole shadow %.4f, two shadow stages %.4f", whole, staged)
	if staged != whole || whole < 0.5 || whole == 1 {
		t.Fatalf("recall: two shadow stages %v, one whole shadow %v", staged, whole)
	}
	for _, s := range []string{"shadow stage ready", "shadow stage: serving"} {
		if !strings.Contains(r.logOf("shadow2"), s) {
			t.Fatalf("the stage's log does not say %q:\n%s", s, r.logs())
		}
	}
	// a later stage that follows shorter sequences than its first stage
	// is refused when the first dials it, and the first stage exits
	r.signal("shadow", syscall.SIGKILL)
	r.signal("shadow2", syscall.SIGKILL)
	r.start("shadow2", shadowArgs("shadow2", "-layers", "2-3", "-listen", stageAddr, "-context", "1024")[1:]...)
	first := r.start("shadow", shadowArgs("shadow", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","), "-layers", "0-1", "-stages", stageAddr)[1:]...)
	exited := make(chan error, 1)
	go func() { exited <- first.Wait() }()
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(r.logOf("shadow"), "follows sequences of at most 1024 positions (-context), its first stage 4096") {
			t.Fatalf("a first stage dialing a stage of -context 1024: %v, log:\n%s", err, r.logOf("shadow"))
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("a first stage dialing a stage of -context 1024 still runs:\n%s", r.logOf("shadow"))
	}
}

// TestAShadowStageKilledAndRestartedMidRun: the staged shadow's second
// stage is SIGKILLed while the main node decodes and started again: the
// first stage fails the pass it could not run, the main node loses the
// shadow (reactive loading meanwhile) and attaches it again once the
// stage answers; the run ends rc 0 with local mode's tokens and logits,
// and its stats count the shadow lost and re-attached.
func TestAShadowStageKilledAndRestartedMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of several seconds with real processes")
	}
	r := newChaosRig(t, 2)
	if _, se, code := run(t, "", "certs", "-out", filepath.Join(r.dir, "certs"), "-nodes", "shadow2=shadow", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	for i := range r.workers {
		r.startWorker(i)
	}
	const tokens = 400
	n := strconv.Itoa(tokens)
	local, swarm, stats := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm"), filepath.Join(r.dir, "stats.json")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	certs := filepath.Join(r.dir, "certs")
	stageAddr := freeLoopbackAddr(t)
	startStage := func() {
		r.start("shadow2", "run", "-role", "shadow", "-model", r.model, "-quant", "int8", "-layers", "2-3", "-listen", stageAddr,
			"-certs", certs, "-name", "shadow2", "-log-level", "info")
	}
	startStage()
	r.start("shadow", "run", "-role", "shadow", "-model", r.model, "-quant", "int8", "-layers", "0-1", "-stages", stageAddr, "-listen", r.shadow,
		"-workers", strings.Join(r.workers, ","), "-group", "2", "-certs", certs, "-name", "shadow", "-log-level", "info")
	mainCmd := r.start("main", "run", "-role", "main", "-model", r.model, "-workers", strings.Join(r.workers, ","), "-group", "2",
		"-prefetch", "shadow", "-shadow", r.shadow, "-certs", certs, "-name", "main",
		"-n", n, "-ignore-eos", "-dump", swarm, "-stats", stats, "-log-level", "info")
	exited := make(chan error, 1)
	go func() { exited <- mainCmd.Wait() }()
	// the kill comes once the main node decodes on the shadow's hints
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(r.logOf("shadow2"), "shadow stage: serving") || !strings.Contains(r.logOf("main"), "shadow") {
		if time.Now().After(deadline) {
			t.Fatalf("the staged shadow never served\n%s", r.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	select {
	case err := <-exited:
		t.Fatalf("the main node ended (%v) before the stage was killed: the run is too short\n%s", err, r.logs())
	default:
	}
	r.signal("shadow2", syscall.SIGKILL)
	time.Sleep(time.Second)
	startStage()
	st := finishedAsLocal(t, r, exited, swarm, local, stats)
	if st.Generated != tokens || st.Faults["shadow_lost"] < 1 || st.Faults["shadow_reattached"] < 1 {
		t.Fatalf("stats: %d generated, faults %v: want the shadow lost and re-attached\n%s", st.Generated, st.Faults, r.logs())
	}
}

// shadowRecall runs the main node on r's shadow (n tokens, its extra
// flags), which must give local mode's dump (local), and returns the
// shadow's recall from its -stats.
func shadowRecall(t *testing.T, r *chaosRig, name, local, n string, extra ...string) float64 {
	recall, _ := shadowRun(t, r, name, local, n, extra...)
	return recall
}

// shadowRun is shadowRecall with the run's decode CPU by role.
func shadowRun(t *testing.T, r *chaosRig, name, local, n string, extra ...string) (float64, map[string]float64) {
	t.Helper()
	dump, stats := filepath.Join(r.dir, name), filepath.Join(r.dir, name+".json")
	args := append([]string{"-prefetch", "shadow", "-shadow", r.shadow, "-n", n, "-ignore-eos", "-dump", dump, "-stats", stats, "-dial-timeout", "60s"}, extra...)
	if se, code := r.runMain(args...); code != 0 {
		t.Fatalf("%s: the main node: exit %d\n%s\n%s", name, code, se, r.logs())
	}
	sameDump(t, dump, local)
	var st struct {
		Recall    *float64
		DecodeCPU map[string]float64 `json:"decode_cpu_s"`
	}
	b, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Recall == nil {
		t.Fatalf("%s: stats %s: %v", name, b, err)
	}
	return *st.Recall, st.DecodeCPU
}

// faultRun is what a run's -stats say of its faults.
type faultRun struct {
	Generated int `json:"generated_tokens"`
	Faults    map[string]int64
}

// finishedAsLocal waits (3 minutes at most) for the main node to exit,
// which must be rc 0 with its dump (swarm) equal to local mode's, and
// reads its -stats file.
func finishedAsLocal(t *testing.T, r *chaosRig, exited <-chan error, swarm, local, stats string) faultRun {
	t.Helper()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("main node: %v\n%s\n%s\n%s", err, r.logs(), r.logOf("stage1"), r.logOf("stage2"))
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the main node did not finish within 3 minutes\n%s", r.logs())
	}
	sameDump(t, swarm, local)
	var st faultRun
	b, err := os.ReadFile(stats)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("faults: %v", st.Faults)
	return st
}

// TestANodeBeyondItsMemRefusesToStart: local mode, a main node and a
// stage whose share of the model passes -mem exit 1 at once with one line
// naming the shortfall (before dialing any worker); within it they run.
func TestANodeBeyondItsMemRefusesToStart(t *testing.T) {
	m := tinyModel(t)
	for _, args := range [][]string{
		{"run", "-role", "local", "-model", m, "-prompt", "hi", "-n", "2", "-mem", "1MiB"},
		{"run", "-role", "main", "-model", m, "-workers", "127.0.0.1:1", "-prompt", "hi", "-n", "2", "-mem", "1MiB", "-insecure"},
		{"run", "-role", "stage", "-model", m, "-layers", "1-3", "-workers", "127.0.0.1:1", "-mem", "1MiB", "-insecure"},
	} {
		_, se, code := run(t, "", args...)
		if code != 1 || !strings.Contains(se, "-mem allows 1.0 MiB") || !strings.Contains(se, "short") {
			t.Errorf("%v: exit %d, stderr %q", args[2], code, se)
		}
	}
	if _, se, code := run(t, "", "run", "-role", "local", "-model", m, "-prompt", "hi", "-n", "2", "-mem", "1GiB", "-log-level", "warn"); code != 0 {
		t.Errorf("local mode within 1 GiB: exit %d, %s", code, se)
	}
}

// stagedMainRig writes dir/stages.rig: a main node that holds none of the
// layers, a stage holding layers 0-1 and one holding the rest (-layers
// 2-), a shadow staged the same way (int8), and four workers, on free
// loopback ports.
func stagedMainRig(t *testing.T, dir string) string {
	t.Helper()
	var rig strings.Builder
	fmt.Fprintln(&rig, "main main 127.0.0.1")
	fmt.Fprintf(&rig, "stage1 stage %s -layers 0-1\n", freeLoopbackAddr(t))
	fmt.Fprintf(&rig, "stage2 stage %s -layers 2-\n", freeLoopbackAddr(t))
	fmt.Fprintf(&rig, "shadow shadow %s -quant int8 -layers 0-1\n", freeLoopbackAddr(t))
	fmt.Fprintf(&rig, "shadow2 shadow %s -quant int8 -layers 2-\n", freeLoopbackAddr(t))
	for i := range 4 {
		fmt.Fprintf(&rig, "w%d worker %s -device-mem 64MiB\n", i+1, freeLoopbackAddr(t))
	}
	path := filepath.Join(dir, "stages.rig")
	if err := os.WriteFile(path, []byte(rig.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestAStagedMainNodeIsLocalModeOnEveryFamily: bench rig (real processes
// on loopback) on a rig whose main node holds no layer, its layers on two
// stages that each run their experts on the four workers, and whose
// shadow is two shadow stages: every family's output equals local mode's
// bit for bit (bench rig compares the logits), reactive and
// shadow-driven; the figures of the stages' layers reach the main node's
// report (reactive loads experts, each stage's peak memory is under its
// name), and the shadow follows: its recall is scored and well above
// chance, and far fewer of its loads miss than reactive's. (That the
// stages place on the predictions handed on is not told apart here: with
// a recall this high the layout's own rule lands on the hinted workers
// too; TestForwardedPredictionsAreTakenOncePerPassAndLayer checks the
// stage's side.)
func TestAStagedMainNodeIsLocalModeOnEveryFamily(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "deepseek-v3-tiny-fp8", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) {
			dir := t.TempDir()
			m := filepath.Join(dir, preset)
			if _, se, code := run(t, "", "gen-tiny", "-out", m, "-preset", preset, "-log-level", "warn"); code != 0 {
				t.Fatalf("gen-tiny: %s", se)
			}
			rep := benchRig(t, stagedMainRig(t, dir), m, filepath.Join(dir, "out"), "-modes", "reactive,shadow", "-cases", "9x12")
			if len(rep.Runs) != 3 || !slices.Contains(rep.Nodes, "stage2 stage "+strings.Fields(rep.Nodes[2])[2]) {
				t.Fatalf("%d runs, nodes %q", len(rep.Runs), rep.Nodes)
			}
			misses := map[testbed.Mode]float64{}
			for _, r := range rep.Runs {
				var st struct {
					Loads  int              `json:"expert_loads"`
					Misses int              `json:"misses"`
					Recall *float64         `json:"recall"`
					Peak   map[string]int64 `json:"peak_memory_bytes"`
				}
				if err := json.Unmarshal(r.Stats, &st); err != nil {
					t.Fatal(err)
				}
				if !r.Identical {
					t.Errorf("%s: differs from local mode: %s", r.Mode, r.Diff)
				}
				if r.Mode == testbed.ModeReactive && (st.Loads == 0 || st.Peak["stage1"] <= 0 || st.Peak["stage2"] <= 0) {
					t.Errorf("reactive: %d loads, peak memory %v: want the stages' loads and memory", st.Loads, st.Peak)
				}
				if r.Mode == testbed.ModeShadow && (st.Recall == nil || *st.Recall < 0.6) {
					t.Errorf("shadow: recall %v: want the stages' layers predicted", st.Recall)
				}
				if st.Loads > 0 {
					misses[r.Mode] = float64(st.Misses) / float64(st.Loads)
				}
				t.Logf("%s: %d loads, %d misses", r.Mode, st.Loads, st.Misses)
			}
			if misses[testbed.ModeShadow] > misses[testbed.ModeReactive]/2 {
				t.Errorf("misses: shadow %.3f of its loads, reactive %.3f: the stages did not place on the predictions", misses[testbed.ModeShadow], misses[testbed.ModeReactive])
			}
		})
	}
}

// TestAStagedMainNodeAlignsTheShadowAsAWholeOne runs one nf4 shadow
// (-ahead 0: every guess waits for its alignment, so no timing enters its
// predictions) beside a main node that holds every layer, and then beside
// one whose layers are on two stages (real processes, two workers): the
// shadow's recall is the same, exactly, so its KV alignments carried the
// same rows, the stages' layers' from the stages; both runs give local
// mode's tokens and logits.
func TestAStagedMainNodeAlignsTheShadowAsAWholeOne(t *testing.T) {
	r := newChaosRig(t, 2)
	certs := filepath.Join(r.dir, "certs")
	if _, se, code := run(t, "", "certs", "-out", certs, "-nodes", "stage1,stage2", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	for i := range r.workers {
		r.startWorker(i)
	}
	const n = "32"
	local := filepath.Join(r.dir, "local")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	r.start("shadow", "run", "-role", "shadow", "-model", r.model, "-quant", "nf4", "-ahead", "0", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","),
		"-group", "2", "-certs", certs, "-name", "shadow", "-log-level", "info")
	whole := shadowRecall(t, r, "whole", local, n)
	var stages []string
	for i, layers := range []string{"0-1", "2-"} {
		name, addr := fmt.Sprintf("stage%d", i+1), freeLoopbackAddr(t)
		r.start(name, "run", "-role", "stage", "-model", r.model, "-layers", layers, "-listen", addr, "-workers", strings.Join(r.workers, ","),
			"-group", "2", "-prefetch", "shadow", "-certs", certs, "-name", name, "-log-level", "info")
		stages = append(stages, addr)
	}
	staged, cpu := shadowRun(t, r, "staged", local, n, "-stages", strings.Join(stages, ","))
	t.Logf("recall: beside one main node %.4f, beside a main node and two stages %.4f", whole, staged)
	if staged != whole || whole < 0.5 || whole == 1 {
		t.Fatalf("recall: beside the stages %v, beside one main node %v", staged, whole)
	}
	// the stages' CPU over decode, as their rows said it, beside the
	// main node's own
	if cpu["stages"] <= 0 || cpu["main"] <= 0 || cpu["workers"] <= 0 || cpu["shadow"] <= 0 {
		t.Fatalf("decode CPU by role %v: want the main node's, the stages', the workers' and the shadow's", cpu)
	}
}

// TestAMainStageKilledAndRestartedMidRun: a main node whose layers are on
// two stages decodes 48 tokens (text mode, real processes, two workers
// whose loads are paced: about 9 tokens a second);
// its second stage is SIGKILLed mid-run and started again on its address:
// the main node waits for it, every sequence runs again from its first
// token on the stages, and the run ends rc 0 with local mode's tokens and
// logits, its stats counting the stage lost and the sequence run again.
func TestAMainStageKilledAndRestartedMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of several seconds with real processes")
	}
	r := newChaosRig(t, 2)
	certs := filepath.Join(r.dir, "certs")
	if _, se, code := run(t, "", "certs", "-out", certs, "-nodes", "stage1,stage2", "-log-level", "warn"); code != 0 {
		t.Fatalf("certs: %s", se)
	}
	for i := range r.workers {
		r.startWorker(i)
	}
	const tokens = 48
	n := strconv.Itoa(tokens)
	local, swarm, stats := filepath.Join(r.dir, "local"), filepath.Join(r.dir, "swarm"), filepath.Join(r.dir, "stats.json")
	if _, se, code := run(t, "", "run", "-role", "local", "-model", r.model, "-n", n, "-ignore-eos", "-dump", local, "-log-level", "warn"); code != 0 {
		t.Fatalf("local run: %s", se)
	}
	addrs := []string{freeLoopbackAddr(t), freeLoopbackAddr(t)}
	startStage := func(i int, layers string) {
		name := fmt.Sprintf("stage%d", i+1)
		r.start(name, "run", "-role", "stage", "-model", r.model, "-layers", layers, "-listen", addrs[i], "-workers", strings.Join(r.workers, ","),
			"-group", "2", "-prefetch", "oracle-next", "-certs", certs, "-name", name, "-log-level", "info")
	}
	startStage(0, "0-1")
	startStage(1, "2-")
	mainCmd := r.start("main", "run", "-role", "main", "-model", r.model, "-workers", strings.Join(r.workers, ","), "-group", "2",
		"-prefetch", "oracle-next", "-stages", strings.Join(addrs, ","), "-certs", certs, "-name", "main",
		"-n", n, "-ignore-eos", "-dump", swarm, "-stats", stats, "-log-level", "info")
	exited := make(chan error, 1)
	go func() { exited <- mainCmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(r.logOf("stage2"), "stage: serving") {
		if time.Now().After(deadline) {
			t.Fatalf("the stage never served\n%s", r.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("the main node ended (%v) before the stage was killed: the run is too short\n%s", err, r.logs())
	default:
	}
	r.signal("stage2", syscall.SIGKILL)
	time.Sleep(time.Second)
	startStage(1, "2-")
	st := finishedAsLocal(t, r, exited, swarm, local, stats)
	if st.Generated != tokens || st.Faults["stages_lost"] < 1 || st.Faults["refills"] < 1 {
		t.Fatalf("stats: %d generated, faults %v: want a stage lost and the sequence run again\n%s", st.Generated, st.Faults, r.logs())
	}
}

// TestAShorterContextFitsANodeItsFullContextWouldNot: -context sizes a
// node's KV cache and so what -mem counts: a budget the tiny model's
// whole context (4096 positions) passes refuses a local node without it
// and takes it with -context 512, which then answers; a prompt and
// answer past that context are refused naming -context, and a context
// past the model's is refused at start.
func TestAShorterContextFitsANodeItsFullContextWouldNot(t *testing.T) {
	m := tinyModel(t)
	mm, err := model.Load(m, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := mm.FootprintOf(mm.HeldLayers(), model.FootprintOptions{Experts: true, Head: true})
	mm.Close()
	if err != nil {
		t.Fatal(err)
	}
	mem := fmt.Sprint(f.Weights() + f.KV/2) // under the whole context's, over 512 positions'
	local := func(args ...string) (string, int) {
		_, se, code := run(t, "", append([]string{"run", "-role", "local", "-model", m, "-prompt", "hi", "-mem", mem, "-log-level", "warn"}, args...)...)
		return se, code
	}
	if se, code := local("-n", "2"); code != 1 || !strings.Contains(se, "short") {
		t.Fatalf("-mem %s at the whole context: exit %d, %q; want a refusal", mem, code, se)
	}
	if se, code := local("-n", "2", "-context", "512"); code != 0 {
		t.Fatalf("-mem %s with -context 512: exit %d, %s", mem, code, se)
	}
	if se, code := local("-n", "600", "-context", "512"); code == 0 || !strings.Contains(se, "context of 512") {
		t.Fatalf("600 tokens under -context 512: exit %d, %q; want a refusal naming the context", code, se)
	}
	if se, code := local("-n", "2", "-context", "5000"); code == 0 || !strings.Contains(se, "-context 5000") {
		t.Fatalf("-context past the model's: exit %d, %q", code, se)
	}
}
