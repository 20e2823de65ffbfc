package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
// below 1 here, so that equal recalls say something.
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
		dump, stats := filepath.Join(r.dir, name), filepath.Join(r.dir, name+".json")
		if se, code := r.runMain("-prefetch", "shadow", "-shadow", r.shadow, "-n", n, "-ignore-eos", "-dump", dump, "-stats", stats, "-dial-timeout", "60s"); code != 0 {
			t.Fatalf("%s: the main node: exit %d\n%s\n%s", name, code, se, r.logs())
		}
		sameDump(t, dump, local)
		var st struct{ Recall *float64 }
		b, err := os.ReadFile(stats)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &st); err != nil || st.Recall == nil {
			t.Fatalf("%s: stats %s: %v", name, b, err)
		}
		return *st.Recall
	}
	shadowArgs := func(name string, extra ...string) []string {
		return append([]string{name, "run", "-role", "shadow", "-model", r.model, "-quant", "nf4", "-ahead", "0", "-group", "2",
			"-certs", certs, "-name", name, "-log-level", "info"}, extra...)
	}
	whole := shadowRun("whole", shadowArgs("shadow", "-listen", r.shadow, "-workers", strings.Join(r.workers, ","))...)
	r.signal("shadow", syscall.SIGKILL)
	stageAddr := freeLoopbackUDP(t)
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
}
