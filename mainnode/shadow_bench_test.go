package mainnode_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// BenchmarkShadowDecode measures in one run, on the model of
// ODMOE_BENCH_PRESET (`make bench`: small), decode after a 16-token prompt
// for local mode, a reactive 8-worker swarm, and the swarm driven by an
// fp16, int8 or nf4 shadow aligned every pass (T1_KV1) or never
// (T0_KV0); worker loads paced to benchLoadBW. It reports tokens/s, the
// stall fraction, recall (eq. 3) and the shadow's forward pass as a
// fraction of the main node's pass.
func BenchmarkShadowDecode(b *testing.B) {
	f := benchSwarmFixture(b)
	full, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer full.Close()
	mainModel, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		b.Fatal(err)
	}
	defer mainModel.Close()
	c := mainModel.Config
	prompt := testPrompt(16, 7919, 1, c.VocabSize)
	run := func(b *testing.B, m *model.Model, runner model.ExpertRunner) {
		benchDecode(context.Background(), b, m, runner, prompt, 0)
	}
	b.Run("local", func(b *testing.B) { run(b, full, model.NewResidentExperts(full)) })

	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		b.Fatal(err)
	}
	id, err := f.Identity()
	if err != nil {
		b.Fatal(err)
	}
	swarm := func(b *testing.B, opt mainnode.Options, quant kernels.DType) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		addrs := startBenchWorkers(b, ctx, f, 8, benchLoadBW)
		opt.Layout, _ = sched.NewLayout(8, 2)
		opt.Hidden, opt.Log = c.HiddenSize, zerolog.Nop()
		opt.Layers, opt.Experts, opt.TopK, opt.Seed = c.ExpertLayers(), c.NumExperts, c.TopK, 1
		mcfg := &wire.Config{Certs: certs, Log: zerolog.Nop(), CheckHello: wire.SameModel(true)} // as main.Run: its model said and checked
		mcfg.Hello.Model = id
		if opt.Prefetch == mainnode.Shadow {
			saddr := startShadow(b, ctx, f, quant, shadow.DefaultAhead, addrs, opt.Layout)
			scfg := *mcfg
			scfg.PeerRoles = []wire.Role{wire.RoleShadow}
			scfg.DialAttempts = 60
			if opt.Shadow, err = wire.Dial(ctx, saddr, &scfg); err != nil {
				b.Fatal(err)
			}
			defer opt.Shadow.Close()
		}
		sw, err := mainnode.Dial(ctx, addrs, mcfg, opt)
		if err != nil {
			b.Fatal(err)
		}
		defer sw.Close()
		run(b, mainModel, sw)
		dec := mainnode.Total(sw.Stats().Decode)
		b.ReportMetric(dec.Stall.Seconds()/b.Elapsed().Seconds(), "stall-fraction")
		if st, ok := sw.ShadowStats(30e9); ok {
			b.ReportMetric(st.Recall, "recall")
			b.ReportMetric(st.ForwardMs/(float64(b.Elapsed().Milliseconds())/float64(b.N)), "shadow/main-time")
		}
	}
	b.Run("swarm8/reactive", func(b *testing.B) { swarm(b, mainnode.Options{Prefetch: mainnode.Reactive}, 0) })
	for _, q := range []kernels.DType{kernels.F16, kernels.Q8, kernels.NF4} {
		for _, pol := range []align.Policy{{TokenPeriod: 1, KVPeriod: 1}, {}} {
			b.Run(fmt.Sprintf("swarm8/shadow-%v/%v", q, pol), func(b *testing.B) {
				swarm(b, mainnode.Options{Prefetch: mainnode.Shadow, Align: pol}, q)
			})
		}
	}
}
