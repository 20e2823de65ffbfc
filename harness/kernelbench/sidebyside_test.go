package kernelbench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
)

// standIn writes a shell script that speaks token_times' stepped protocol
// (llama.cpp cannot be built here): "ready" once, then for each line N
// the times of N steps, each step ms of a step, in ms. It logs its
// arguments to args.
func standIn(t *testing.T, body string) (bin, args string) {
	dir := t.TempDir()
	bin, args = filepath.Join(dir, "token_times"), filepath.Join(dir, "args")
	script := "#!/bin/sh\necho \"$@\" > " + args + "\n" + body
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, args
}

const steppedStandIn = `echo ready
while read n; do
  i=0; line=""
  while [ $i -lt $n ]; do line="$line 20.0"; i=$((i+1)); done
  echo $line
done
`

// TestSideBySideRunsBothEnginesInBlocks: a side-by-side run decodes its
// steps in blocks with llama.cpp's steps between them, and reads its
// figures as they were timed: llama.cpp at 20 ms a step is 50 tok/s with
// no spread, odmoe's rate over it is the ratio, the roofline fraction the
// decode's GB/s over the probes'.
func TestSideBySideRunsBothEnginesInBlocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Generate(dir, synth.Options{Preset: "tiny", Seed: 5}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	defer kernels.SetThreads(kernels.SetThreads(2))
	bin, args := standIn(t, steppedStandIn)
	ctx := context.Background()
	const steps = 19 // two full blocks and a short one
	l, err := startLlama(ctx, LlamaOptions{Times: bin, GGUF: "model.gguf"}, 4, steps, 2)
	if err != nil {
		t.Fatal(err)
	}
	s := model.NewSession(m, model.NewResidentExperts(m), 4+steps)
	logits, err := s.Forward(ctx, []int{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	res, err := sideBySideRun(ctx, s, logits, steps, m.DecodeBytesPerToken(), newDRAMProbe(4), l)
	if cerr := l.close(); cerr != nil {
		t.Fatalf("closing the stand-in: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(args); strings.TrimSpace(string(b)) != "model.gguf 4 19 2 stepped" {
		t.Errorf("token_times started with %q, want the GGUF, prompt, steps, threads and stepped", b)
	}
	if s.Len() != 4+steps {
		t.Errorf("the session holds %d tokens, want the prompt and %d steps", s.Len(), steps)
	}
	if res.Tokens != steps || res.Block != sideBlock || res.Passes.Passes != steps || res.Threads != 2 {
		t.Errorf("run %+v: want %d steps timed in blocks of %d at 2 threads", res, steps, sideBlock)
	}
	if res.Llama == nil || res.Llama.TokPerS != 50 || res.Llama.Passes.Spread != 1 || res.Llama.BlockSpread != 1 || res.Llama.Passes.Passes != steps {
		t.Fatalf("llama.cpp's side %+v: want %d steps at 50 tok/s, spread 1", res.Llama, steps)
	}
	if got, want := res.Llama.OdmoeOverLlama, res.TokPerS/50; math.Abs(got-want) > 1e-12 {
		t.Errorf("odmoe over llama.cpp %v, want %v", got, want)
	}
	// llama.cpp's steps are a constant 20 ms: odmoe's plus a constant
	// would spread as odmoe's p10 and p90 do with 20 - p10 ms added
	if got, want := res.Llama.SpreadAsOdmoes, (res.Passes.P90+20-res.Passes.P10)/20; math.Abs(got-want) > 1e-12 {
		t.Errorf("llama.cpp's spread as odmoe's plus a constant %v, want %v", got, want)
	}
	if res.TokPerS <= 0 || res.RooflineGBps <= 0 || math.Abs(res.RooflineFraction-res.GBps/res.RooflineGBps) > 1e-12 ||
		math.Abs(res.GBps-float64(m.DecodeBytesPerToken())*res.TokPerS/1e9) > 1e-9 {
		t.Errorf("run %+v: the roofline fraction is not the decode's GB/s over the probes'", res)
	}
}

// TestLlamaStepsSayWhatWentWrong: a token_times that never gets ready,
// or answers with the wrong number of steps or a time that is not one,
// is an error that says so.
func TestLlamaStepsSayWhatWentWrong(t *testing.T) {
	ctx := context.Background()
	bin, _ := standIn(t, "echo 'cannot load model.gguf' >&2; exit 1\n")
	if _, err := startLlama(ctx, LlamaOptions{Times: bin, GGUF: "model.gguf"}, 4, 8, 1); err == nil || !strings.Contains(err.Error(), "cannot load model.gguf") {
		t.Errorf("a token_times that fails to load: %v, want its own words", err)
	}
	if _, err := startLlama(ctx, LlamaOptions{Times: filepath.Join(t.TempDir(), "absent"), GGUF: "model.gguf"}, 4, 8, 1); err == nil {
		t.Error("an absent token_times started")
	}
	for _, c := range []struct{ answer, want string }{
		{"echo 1.0 2.0", "asked for 3 steps"},
		{"echo 1.0 x 2.0", `step 1's time "x"`},
		{"echo 1.0 -2.0 2.0", `step 1's time "-2.0"`},
		{"exit 0", "EOF"},
		{"echo 'decode failed at step 3' >&2; exit 1", "decode failed at step 3"},
	} {
		bin, _ := standIn(t, "echo ready\nread n\n"+c.answer+"\n")
		l, err := startLlama(ctx, LlamaOptions{Times: bin, GGUF: "model.gguf"}, 4, 8, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.steps(3); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("answer %q: %v, want an error saying %q", c.answer, err, c.want)
		}
		l.close()
	}
	// a token_times that dies by a signal is not taken for one the
	// run's context killed
	bin, _ = standIn(t, "echo ready\nread n\nkill -SEGV $$\n")
	l, err := startLlama(ctx, LlamaOptions{Times: bin, GGUF: "model.gguf"}, 4, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.steps(3); err == nil {
		t.Error("steps from a token_times that crashed")
	}
	if err := l.close(); err == nil || !strings.Contains(err.Error(), "signal") {
		t.Errorf("closing a token_times that crashed: %v, want its signal", err)
	}
}

// TestSpreadPlusIsTheSpreadWithAConstantAdded: steps of 10 to 13 ms
// (p10 10, p90 13) with 4 ms added to each spread 17/14; none added, as
// they did; a constant that leaves no time is no spread.
func TestSpreadPlusIsTheSpreadWithAConstantAdded(t *testing.T) {
	s := model.PassSpread{Passes: 10, P10: 10, P50: 11, P90: 13, Spread: 1.3}
	if got := spreadPlus(s, 4); math.Abs(got-17.0/14) > 1e-12 {
		t.Errorf("4 ms added: %v, want 17/14", got)
	}
	if got := spreadPlus(s, 0); math.Abs(got-1.3) > 1e-12 {
		t.Errorf("none added: %v, want 1.3", got)
	}
	if got := spreadPlus(s, -10); got != 0 {
		t.Errorf("10 ms taken from a 10 ms p10: %v, want 0", got)
	}
}

// TestBlockSpreadLeavesOutTheStretchesBetweenBlocks: two blocks of 10
// steps, one at 10 ms and one at 20 (the machine slower for the second)
// spread 2 over the run and not at all within the blocks; a block with
// every other step 1.5 times its neighbour spreads 1.5 within it.
func TestBlockSpreadLeavesOutTheStretchesBetweenBlocks(t *testing.T) {
	var steps []time.Duration
	for i := range 20 {
		steps = append(steps, time.Duration(10+10*(i/10))*time.Millisecond)
	}
	if got := model.SpreadOf(steps).Spread; got != 2 {
		t.Fatalf("the run's spread %v, want 2", got)
	}
	if got := blockSpread(steps, 10); got != 1 {
		t.Errorf("within blocks %v, want 1", got)
	}
	steps = steps[:0]
	for i := range 21 { // the last block one step long
		steps = append(steps, time.Duration(20+10*(i%2))*time.Millisecond)
	}
	if got := blockSpread(steps, 10); math.Abs(got-1.5) > 1e-12 {
		t.Errorf("alternating 20 and 30 ms: within blocks %v, want 1.5", got)
	}
	if got := blockSpread(nil, 8); got != 0 {
		t.Errorf("no steps: %v", got)
	}
}
