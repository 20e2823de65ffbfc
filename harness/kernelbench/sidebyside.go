package kernelbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/odmoe/odmoe/internal/procmem"
	"github.com/odmoe/odmoe/internal/quantile"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
)

// A side-by-side run times local decode in blocks of sideBlock steps
// with a DRAM read probe before each block and after the last, and, where
// llama.cpp is at hand, llama.cpp's own steps between the blocks, a probe
// before each of its blocks too (probe, odmoe, probe, llama.cpp, ...), so
// that each engine's tokens, and the probes they are held to, meet the
// same moments of the machine, and each engine's block starts alike:
// after a probe, from threads asleep. A shared host's
// bandwidth moves within a second (the Zen 4 VM's two-thread read 26-52
// GB/s from one 128 MiB probe to the next, 2026-11-30): a roofline read
// minutes before a decode run says as much about the host as about the
// decode.
const sideBlock = 8

// sideProbeMiB is what each probe between the blocks reads: a few ms,
// long enough for a stream's rate, short beside a block's ~100 ms.
const sideProbeMiB = 128

// settle is how long a side-by-side run waits after each probe: longer
// than the thread team's spin (kernels' spinFor, 100 us).
const settle = time.Millisecond

// sideBySide is one side-by-side run at one thread count.
type sideBySide struct {
	Threads int `json:"threads"`
	Tokens  int `json:"tokens"` // odmoe's steps timed (and llama.cpp's, where it ran)
	Block   int `json:"block"`  // steps a block
	// TokPerS is odmoe's steps over their time; GBps the weight bytes
	// they read over it; RooflineGBps the probes' bytes over their time
	// (every probe of the run, one before each block and one after the
	// last); RooflineFraction the one over the other.
	TokPerS          float64          `json:"tokens_per_s"`
	GBps             float64          `json:"gbps"`
	RooflineGBps     float64          `json:"roofline_gbps"`
	RooflineFraction float64          `json:"roofline_fraction"`
	Passes           model.PassSpread `json:"decode_pass_ms"`
	// BlockSpread is p90/p10 of every step's time over its block's
	// median: the spread within blocks, without the machine's slower
	// and faster stretches between them that Passes.Spread holds too.
	BlockSpread float64 `json:"block_spread"`
	// Llama is llama.cpp's steps between odmoe's blocks; nil where it
	// did not run.
	Llama *llamaSide `json:"llama_cpp,omitempty"`
}

type llamaSide struct {
	TokPerS     float64          `json:"tokens_per_s"`
	Passes      model.PassSpread `json:"decode_pass_ms"`
	BlockSpread float64          `json:"block_spread"`
	// OdmoeOverLlama is odmoe's tokens/s over llama.cpp's in the run.
	OdmoeOverLlama float64 `json:"odmoe_over_llama_cpp"`
	// SpreadAsOdmoes is the p90/p10 llama.cpp's steps would have had
	// were each of them odmoe's step plus a constant, llama.cpp's p10
	// less odmoe's (spreadPlus): the machine stretching odmoe's time and
	// not llama.cpp's added time. Where it matches Passes.Spread,
	// llama.cpp's narrower spread is that added time, not steadier steps.
	SpreadAsOdmoes float64 `json:"p90_over_p10_as_odmoe_plus_constant"`
	// QuietMs is how long, a block's mean, the run waited after
	// llama.cpp's last step for none of its threads to run (its OpenMP
	// threads spin before they sleep) before its next probe: a 1 ms poll
	// at least.
	QuietMs float64 `json:"quiet_ms"`
}

// LlamaOptions name llama.cpp's side of a side-by-side run:
// testbed/llama/token_times.cpp built against llama.cpp (testbed/
// decode-spread builds it into the llama-side-by-side tool's cache) and a
// GGUF of the same model.
type LlamaOptions struct {
	Times, GGUF string
}

// llamaSteps is llama.cpp decoding in blocks on demand: token_times in
// its stepped mode, its prompt decoded.
type llamaSteps struct {
	ctx    context.Context
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *strings.Builder // written by cmd's own goroutine: read after wait
	waited bool
	err    error // wait's
}

// startLlama starts token_times on o.GGUF with a prompt of prompt tokens,
// room for gen steps, on threads threads, and waits for its prompt and
// for its threads to go quiet after it.
func startLlama(ctx context.Context, o LlamaOptions, prompt, gen, threads int) (*llamaSteps, error) {
	cmd := exec.CommandContext(ctx, o.Times, o.GGUF, strconv.Itoa(prompt), strconv.Itoa(max(gen, 2)), strconv.Itoa(threads), "stepped")
	l := &llamaSteps{ctx: ctx, cmd: cmd, stderr: &strings.Builder{}}
	cmd.Stderr = l.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		in.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("llama.cpp's steps (%s): %w", o.Times, err)
	}
	l.in, l.out = in, bufio.NewReader(out)
	line, err := l.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		return nil, l.fail(fmt.Errorf("llama.cpp's steps (%s %s): got %q before its prompt was decoded (%v)", o.Times, o.GGUF, line, err))
	}
	l.quiet()
	return l, nil
}

// steps decodes n more steps and returns each one's time.
func (l *llamaSteps) steps(n int) ([]time.Duration, error) {
	if _, err := fmt.Fprintf(l.in, "%d\n", n); err != nil {
		return nil, l.fail(fmt.Errorf("llama.cpp's steps: %w", err))
	}
	line, err := l.out.ReadString('\n')
	if err != nil {
		return nil, l.fail(fmt.Errorf("llama.cpp's steps: %w", err))
	}
	f := strings.Fields(line)
	if len(f) != n {
		return nil, l.fail(fmt.Errorf("llama.cpp's steps: asked for %d steps, got %q", n, line))
	}
	ds := make([]time.Duration, n)
	for i, s := range f {
		ms, err := strconv.ParseFloat(s, 64)
		if err != nil || ms < 0 {
			return nil, l.fail(fmt.Errorf("llama.cpp's steps: step %d's time %q", i, s))
		}
		ds[i] = time.Duration(ms * 1e6)
	}
	return ds, nil
}

// fail ends the process (its stdin closed: token_times ends at EOF) and
// returns err with what it wrote to stderr.
func (l *llamaSteps) fail(err error) error {
	l.wait()
	return l.withStderr(err)
}

// withStderr is err with what the process wrote to stderr, once it has
// exited.
func (l *llamaSteps) withStderr(err error) error {
	if msg := strings.TrimSpace(l.stderr.String()); msg != "" {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// wait closes the process's stdin and waits for it to exit, once.
func (l *llamaSteps) wait() error {
	if !l.waited {
		if l.in != nil {
			l.in.Close()
		}
		l.err, l.waited = l.cmd.Wait(), true
	}
	return l.err
}

// quiet waits until no thread of llama.cpp's runs or waits to run (its
// OpenMP threads spin after a step before they sleep; at most 200 ms)
// and returns how long that took, one poll (~1 ms) at least.
func (l *llamaSteps) quiet() time.Duration {
	const poll, limit = time.Millisecond, 200 * time.Millisecond
	t0 := time.Now()
	for time.Since(t0) < limit {
		time.Sleep(poll)
		if n, ok := procmem.RunningThreads(l.cmd.Process.Pid); !ok || n == 0 {
			break
		}
	}
	return time.Since(t0)
}

// close ends the process and returns how it ended: nil where it exited
// cleanly, or was killed because the run's context ended.
func (l *llamaSteps) close() error {
	err := l.wait()
	if err == nil || l.ctx.Err() != nil {
		return nil
	}
	return l.withStderr(err)
}

// sideBySideRun decodes steps tokens on session s (its prompt done, its
// last logits given) at the current thread count in blocks, probing DRAM
// with probe before each block and after the last, and running llama's
// steps (if not nil) after each block; bytes is the weights a step reads.
func sideBySideRun(ctx context.Context, s *model.Session, logits []float32, steps int, bytes int64, probe *dramProbe, llama *llamaSteps) (*sideBySide, error) {
	if steps < 1 {
		return nil, fmt.Errorf("a side-by-side run of %d steps", steps)
	}
	th := kernels.Threads()
	res := &sideBySide{Threads: th, Tokens: steps, Block: min(sideBlock, steps)}
	var ours, theirs []time.Duration
	var probeTime, ourTime, theirTime, quiet time.Duration
	probes := 0
	read := func() {
		probeTime += probe.onTeam(th)
		probes++
		// the team's members spin after a region (100 us) before they
		// park: let them park, so that either engine's block starts
		// from threads asleep, and llama.cpp's with no spinning beside
		time.Sleep(settle)
	}
	blocks := 0
	for done := 0; done < steps; blocks++ {
		n := min(res.Block, steps-done)
		read()
		for range n {
			t0 := time.Now()
			var err error
			if logits, err = s.Forward(ctx, []int{model.Argmax(logits)}); err != nil {
				return nil, err
			}
			d := time.Since(t0)
			ours, ourTime = append(ours, d), ourTime+d
		}
		done += n
		if llama != nil {
			read()
			ds, err := llama.steps(n)
			if err != nil {
				return nil, err
			}
			for _, d := range ds {
				theirs, theirTime = append(theirs, d), theirTime+d
			}
			quiet += llama.quiet()
		}
	}
	read()
	res.TokPerS = float64(len(ours)) / ourTime.Seconds()
	res.GBps = float64(bytes) * res.TokPerS / 1e9
	res.RooflineGBps = float64(probes) * float64(len(probe.m.Data)) / probeTime.Seconds() / 1e9
	res.RooflineFraction = fraction(res.GBps, res.RooflineGBps)
	res.Passes, res.BlockSpread = *model.SpreadOf(ours), blockSpread(ours, res.Block)
	if llama != nil {
		l := &llamaSide{TokPerS: float64(len(theirs)) / theirTime.Seconds(), Passes: *model.SpreadOf(theirs), BlockSpread: blockSpread(theirs, res.Block),
			QuietMs: quiet.Seconds() * 1e3 / float64(blocks)}
		l.OdmoeOverLlama = res.TokPerS / l.TokPerS
		l.SpreadAsOdmoes = spreadPlus(res.Passes, l.Passes.P10-res.Passes.P10)
		res.Llama = l
	}
	return res, nil
}

// blockSpread is p90/p10 (nearest rank) of each step's time over the
// median of its block (steps block at a time, the last block possibly
// shorter).
func blockSpread(steps []time.Duration, block int) float64 {
	var rel []float64
	for b := 0; b < len(steps); b += block {
		in := steps[b:min(b+block, len(steps))]
		med := float64(quantile.Of(in, 0.5)[0])
		for _, d := range in {
			rel = append(rel, float64(d)/med)
		}
	}
	if len(rel) == 0 {
		return 0
	}
	q := quantile.Of(rel, 0.1, 0.9)
	return q[1] / q[0]
}

// spreadPlus is p90/p10 of steps s with extraMs added to each.
func spreadPlus(s model.PassSpread, extraMs float64) float64 {
	if s.P10+extraMs <= 0 {
		return 0
	}
	return (s.P90 + extraMs) / (s.P10 + extraMs)
}

func printSideBySide(w io.Writer, runs []sideBySide) {
	if len(runs) == 0 {
		return
	}
	llama := runs[0].Llama != nil
	fmt.Fprintf(w, "Side by side: blocks of %d steps, a %d MiB DRAM read probe (the faster of one stream a thread and four) before each block (odmoe's and llama.cpp's) and after the last, then 1 ms for the team to park", runs[0].Block, sideProbeMiB)
	if llama {
		fmt.Fprint(w, ", llama.cpp's steps after each block")
	}
	fmt.Fprintln(w, "; the roofline is the probes' bytes over their time; \"in blocks\" is p90/p10 of each step over its block's median:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "  threads\ttok/s\tGB/s\troofline GB/s\tof it\tms a step p10/p50/p90\tp90/p10\tin blocks"
	if llama {
		head += "\tllama.cpp tok/s\tms a step p10/p50/p90\tp90/p10\tin blocks\tp90/p10 were it odmoe's + a constant\todmoe/llama.cpp\tllama.cpp quiet ms"
	}
	fmt.Fprintln(tw, head)
	for _, r := range runs {
		fmt.Fprintf(tw, "  %d\t%.2f\t%.1f\t%.1f\t%.2f\t%.2f/%.2f/%.2f\t%.2f\t%.2f", r.Threads, r.TokPerS, r.GBps, r.RooflineGBps, r.RooflineFraction,
			r.Passes.P10, r.Passes.P50, r.Passes.P90, r.Passes.Spread, r.BlockSpread)
		if l := r.Llama; l != nil {
			fmt.Fprintf(tw, "\t%.2f\t%.2f/%.2f/%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.1f", l.TokPerS, l.Passes.P10, l.Passes.P50, l.Passes.P90, l.Passes.Spread, l.BlockSpread, l.SpreadAsOdmoes, l.OdmoeOverLlama, l.QuietMs)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
