// Package tunealign is `odmoe tune-align`: the same prompt run with every
// token/KV alignment period pair (and the adaptive policy) on a swarm in
// this process, and the recall, misses, late departure and decode speed
// of each: what OD-MoE's figures 9 and 10 show, for this machine.
package tunealign

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Options say what Run sweeps, on what.
type Options struct {
	ModelDir, StoreDir string        // the model; its store ("": converted into a temporary directory)
	Quant              kernels.DType // the shadow's weight format
	QuantName          string        // as -quant names it (int8, fp16, nf4), for the table's heading
	Periods            []int         // the periods tried for T and K (0: never)
	Workers, Group     int           // Group 0: sched.DefaultGroup
	LoadBytesSec       float64       // the workers' load pacing; 0: unpaced
	Prompt             string
	N, Repeat          int // tokens a run generates; runs of each pair, interleaved
}

// Run runs the sweep and prints its table and verdict to stdout.
func Run(ctx context.Context, o Options, stdout io.Writer, log zerolog.Logger) error {
	tmp, err := os.MkdirTemp("", "odmoe-tune-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.StoreDir == "" {
		o.StoreDir = filepath.Join(tmp, "store")
		log.Info().Msg("converting the experts into a temporary store")
		if err := store.Convert(ctx, o.ModelDir, o.StoreDir, store.ConvertOptions{}); err != nil {
			return err
		}
	}
	certDir := filepath.Join(tmp, "certs")
	if err := inproc.EnsureCerts(certDir, o.Workers); err != nil {
		return err
	}
	full, err := model.Load(o.ModelDir, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer full.Close()
	c := full.Config
	if o.Group == 0 {
		o.Group = sched.DefaultGroup(o.Workers, c.TopK)
	}
	layout, err := sched.NewLayout(o.Workers, o.Group)
	if err != nil {
		return fmt.Errorf("-workers/-group: %w", err)
	}
	tok, err := tokenizer.LoadDir(o.ModelDir)
	if err != nil {
		return err
	}
	ids := tok.Encode(o.Prompt, true)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	files := inproc.Files{Model: o.ModelDir, Store: o.StoreDir, Certs: certDir}
	st, err := store.Open(o.StoreDir, store.Options{})
	if err != nil {
		return err
	}
	expertBytes, err := st.ExpertBytes(st.Layers()[0], 0)
	st.Close()
	if err != nil {
		return err
	}
	// room for a few experts and their compute buffers: what a worker holds
	// at once in decode (the layer it runs and the hints for the next)
	budget := 4*int64(expertBytes) + 16<<20
	addrs, stopWorkers, err := inproc.StartWorkers(ctx, files, inproc.WorkerOptions{Count: o.Workers, BudgetBytes: budget, LoadBytesSec: o.LoadBytesSec, Log: log})
	if err != nil {
		return err
	}
	defer stopWorkers()
	qm, err := full.Quantized(o.Quant, nil)
	if err != nil {
		return err
	}
	id, err := files.Identity()
	if err != nil {
		return err
	}
	shadowAddr, stopShadow, err := inproc.StartShadow(ctx, inproc.ShadowOptions{Model: qm, Identity: id, Certs: certDir, Workers: addrs, Layout: layout, Ahead: shadow.DefaultAhead, Listen: "127.0.0.1:0", Log: log})
	if err != nil {
		return err
	}
	defer stopShadow()
	mainModel, err := model.Load(o.ModelDir, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return err
	}
	defer mainModel.Close()
	certs, err := wire.LoadCerts(certDir, "main")
	if err != nil {
		return err
	}
	mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop()}
	mcfg.Hello.Model, mcfg.CheckHello = id, wire.SameModel(true)
	scfg := *mcfg
	scfg.PeerRoles = []wire.Role{wire.RoleShadow}

	fmt.Fprintf(stdout, "tune-align: %s shadow, %d workers in groups of %d, loads paced to %s/s, %d prompt + %d generated tokens, %d runs per pair\n\n",
		o.QuantName, o.Workers, o.Group, progress.Bytes(int64(o.LoadBytesSec)), len(ids), o.N, o.Repeat)
	type pair struct {
		pol    align.Policy
		rates  []float64 // decode tokens/s, one per run
		recall float64   // mean over runs
		misses []int64
		lateMs float64
		chosen []string // an adaptive policy's choice, per run
	}
	var pairs []*pair
	for _, tp := range o.Periods {
		for _, kp := range o.Periods {
			pairs = append(pairs, &pair{pol: align.Policy{TokenPeriod: tp, KVPeriod: kp}})
		}
	}
	// the adaptive policy, bounded by the longest periods swept (when
	// they allow it a choice): what it picks, and what that decodes at
	var adaptive *pair
	if maxP := slices.Max(o.Periods); maxP >= 1 {
		adaptive = &pair{pol: align.Policy{TokenPeriod: maxP, KVPeriod: maxP, Adaptive: true}}
	}
	run := func(p *pair) error {
		sp, err := wire.Dial(ctx, shadowAddr, &scfg)
		if err != nil {
			return err
		}
		defer sp.Close()
		sw, err := mainnode.Dial(ctx, addrs, mcfg, mainnode.Options{Layout: layout, Prefetch: mainnode.Shadow, Shadow: sp, Align: p.pol,
			Hidden: c.HiddenSize, Layers: c.ExpertLayers(), Experts: c.NumExperts, TopK: c.TopK, Log: zerolog.Nop()})
		if err != nil {
			return err
		}
		defer sw.Close()
		b := sw.Batcher(mainModel) // a batch of one, as text mode runs
		b.ChunkPrompts(0)
		_, st, err := b.Generate(ctx, ids, model.GenerateOptions{MaxTokens: o.N})
		b.Close()
		if err != nil {
			return fmt.Errorf("%v: %w", p.pol, err)
		}
		sh, _ := sw.ShadowStats(30 * time.Second)
		for _, l := range sh.LateDepartureMs {
			p.lateMs += l / float64(len(sh.LateDepartureMs)) / float64(o.Repeat)
		}
		p.recall += sh.Recall / float64(o.Repeat)
		if p.pol.Adaptive {
			p.chosen = append(p.chosen, sh.Align.String())
		}
		p.misses = append(p.misses, mainnode.Total(sw.Stats().Decode).Misses)
		p.rates = append(p.rates, st.DecodeTokensPerSec())
		return nil
	}
	// interleaved: a pair's runs are spread over the sweep, so that a
	// slow stretch of a shared machine does not fall on one pair alone
	all := pairs
	if adaptive != nil {
		all = append(slices.Clone(pairs), adaptive)
	}
	for range o.Repeat {
		for _, p := range all {
			if err := run(p); err != nil {
				return err
			}
		}
	}
	median := func(v []float64) float64 {
		w := slices.Clone(v)
		slices.Sort(w)
		return w[len(w)/2]
	}
	fmt.Fprintf(stdout, "%-10s %9s %7s %12s %10s %17s\n", "periods", "recall", "misses", "late ms/it", "tok/s med", "min-max")
	var best *pair
	for _, p := range all {
		ms := make([]float64, len(p.misses))
		for i, m := range p.misses {
			ms[i] = float64(m)
		}
		fmt.Fprintf(stdout, "%-10s %8.2f%% %7.0f %12.3f %10.2f %8.2f-%-8.2f\n", p.pol, 100*p.recall, median(ms), p.lateMs, median(p.rates), slices.Min(p.rates), slices.Max(p.rates))
		if !p.pol.Adaptive && (best == nil || median(p.rates) > median(best.rates)) {
			best = p
		}
	}
	// pairs whose median reaches into the best's spread are a tie: the
	// machine's noise cannot tell them apart
	var ties []string
	for _, p := range pairs {
		if p != best && median(p.rates) >= slices.Min(best.rates) {
			ties = append(ties, p.pol.String())
		}
	}
	fmt.Fprintf(stdout, "\nbest: %s, %.2f tokens/s (median of %d runs)", best.pol, median(best.rates), o.Repeat)
	if len(ties) > 0 {
		fmt.Fprintf(stdout, "; within its spread, so as good on this evidence: %s", strings.Join(ties, ", "))
	}
	fmt.Fprintf(stdout, "\nmain node flags: -prefetch shadow -align-token %d -align-kv %d\n", best.pol.TokenPeriod, best.pol.KVPeriod)
	if adaptive != nil {
		// the choice is judged in the sweep: the fixed pair it chose most
		// often, against the best's spread (the adaptive runs themselves
		// also pay for the windows spent finding it)
		counts := map[string]int{}
		for _, c := range adaptive.chosen {
			counts[c]++
		}
		choice := slices.MaxFunc(adaptive.chosen, func(a, b string) int { return counts[a] - counts[b] })
		verdict := "not in the sweep"
		for _, p := range pairs {
			if p.pol.String() == choice {
				verdict = fmt.Sprintf("%s decodes at %.2f tokens/s median in the sweep: ", choice, median(p.rates))
				if median(p.rates) >= slices.Min(best.rates) {
					verdict += "within the best's spread, as good on this evidence"
				} else {
					verdict += "below the best's spread"
				}
			}
		}
		fmt.Fprintf(stdout, "adaptive (-align-adaptive, %s): chose %s (per run, the periods most decode steps ran under); %s; its own runs %.2f tokens/s median\n",
			adaptive.pol, strings.Join(adaptive.chosen, ", "), verdict, median(adaptive.rates))
	}
	return nil
}
