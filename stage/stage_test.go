package stage_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// stagedRig is a model's first layers and head in this process, its other
// layers on stages behind real QUIC connections on loopback, and the
// whole model beside it to compare with.
type stagedRig struct {
	whole, first *model.Model
	client       *stage.Client
	stages       []*stage.Layers
}

// checkpoint generates preset's model with seed and the cluster's
// certificates, and returns a loader of the model's layers (each closed
// with the test) and the shadow's certificates, which both ends of a
// stage's connection use.
func checkpoint(t *testing.T, preset string, seed uint64) (func(model.LoadOptions) *model.Model, *wire.Certs) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), preset)
	if err := synth.Generate(dir, synth.Options{Preset: preset, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(t.TempDir(), "certs")
	if err := inproc.EnsureCerts(certs, 0); err != nil {
		t.Fatal(err)
	}
	shadowCerts, err := wire.LoadCerts(certs, "shadow")
	if err != nil {
		t.Fatal(err)
	}
	return func(opt model.LoadOptions) *model.Model {
		m, err := model.Load(dir, opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}, shadowCerts
}

// newStagedRig splits preset's model after layer split and after every
// later layer (a stage a layer), each stage served in this process.
func newStagedRig(t *testing.T, preset string, split int) *stagedRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	load, shadowCerts := checkpoint(t, preset, 31)
	r := &stagedRig{}
	var err error
	r.whole = load(model.LoadOptions{})
	L := r.whole.Config.NumLayers
	r.first = load(model.LoadOptions{Layers: &model.LayerRange{First: 0, End: split}, Head: true})
	var peers []*wire.Peer
	for l := split; l < L; l++ {
		layers := stage.NewLayers(load(model.LoadOptions{Layers: &model.LayerRange{First: l, End: l + 1}}))
		r.stages = append(r.stages, layers)
		cfg := &wire.Config{Certs: shadowCerts, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop()}
		cfg.Hello.Layers, cfg.Hello.Quant = []int{l, l + 1}, ""
		ln, err := wire.Listen(ctx, "127.0.0.1:0", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			p, err := ln.Accept(ctx)
			if err == nil {
				stage.Serve(ctx, p, layers)
			}
		}()
		p, err := wire.Dial(ctx, ln.Addr().String(), &wire.Config{Certs: shadowCerts, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		peers = append(peers, p)
	}
	if r.client, err = stage.NewClient(ctx, peers, split, L, "", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.client.Close() })
	if err := r.first.SetLayerRunner(r.client); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestStagesOverTheWireComputeTheWholeModel: every family's tiny preset
// with its first layer here and each later layer on a stage of its own
// (real QUIC, loopback) decodes three sequences in one batch (prompt
// chunks beside decode steps, a history run alone, a rewind of two rows
// and a KV alignment on the way), its rows cut into runs of two: the
// logits and each layer's routes equal the whole model's, bit for bit.
func TestStagesOverTheWireComputeTheWholeModel(t *testing.T) {
	for _, preset := range []string{"tiny", "qwen3-moe-tiny", "deepseek-v3-tiny-fp8", "gpt-oss-tiny-mxfp4"} {
		t.Run(preset, func(t *testing.T) {
			r := newStagedRig(t, preset, 1)
			// runs of at most two rows: a prompt's chunk and the history
			// go in several, each a stage's pass
			defer stage.SetMaxRunBytes(2 * 4 * r.whole.Config.HiddenSize)()
			ctx := context.Background()
			wholeB, firstB := model.NewBatch(r.whole, model.NewResidentExperts(r.whole)), model.NewBatch(r.first, model.NewResidentExperts(r.first))
			type routed struct {
				layer   int
				experts []int
			}
			var wantRoutes, gotRoutes []routed
			record := func(to *[]routed) func(model.Step, int, []float32, []model.Route) {
				return func(_ model.Step, l int, _ []float32, rs []model.Route) {
					var es []int
					for _, x := range rs {
						es = append(es, x.Expert)
					}
					*to = append(*to, routed{l, es})
				}
			}
			wholeB.SetOnRoute(record(&wantRoutes))
			firstB.SetOnRoute(record(&gotRoutes))
			prompts := [][]int{{1, 17, 300, 42, 8, 9, 10}, {5, 77, 6}, {9, 250, 100, 64, 3}}
			ws, fs := make([]*model.Session, 3), make([]*model.Session, 3)
			for i := range prompts {
				ws[i], fs[i] = model.NewSession(r.whole, model.NewResidentExperts(r.whole), 8), model.NewSession(r.first, model.NewResidentExperts(r.first), 8)
			}
			// sequence 2's history runs alone first (a shadow's start)
			if _, err := ws[2].Forward(ctx, prompts[2]); err != nil {
				t.Fatal(err)
			}
			if _, err := fs[2].Forward(ctx, prompts[2]); err != nil {
				t.Fatal(err)
			}
			fed := []int{0, 0, len(prompts[2])}
			for pass := range 9 {
				if pass == 5 { // a rewind: sequence 0 forgets its last two rows, in both
					for _, s := range []*model.Session{ws[0], fs[0]} {
						s.Cache().Truncate(s.Len() - 2)
					}
				}
				if pass == 6 { // a KV alignment of sequence 1's first rows (fp16: to both)
					kv, err := align.PackKV(ws[1].Cache(), 0, 2)
					if err != nil {
						t.Fatal(err)
					}
					for _, s := range []*model.Session{ws[1], fs[1]} {
						if err := kv.Apply(s.Cache()); err != nil {
							t.Fatal(err)
						}
					}
					if err := r.client.ApplyKV(ctx, fs[1].Seq(), kv); err != nil {
						t.Fatal(err)
					}
				}
				var wm, fm []*model.Session
				var feeds [][]int
				for i, p := range prompts {
					var feed []int
					if fed[i] < len(p) {
						feed = p[fed[i]:min(fed[i]+3, len(p))]
					} else {
						feed = []int{model.Argmax(ws[i].Logits())}
					}
					fed[i] += len(feed)
					wm, fm, feeds = append(wm, ws[i]), append(fm, fs[i]), append(feeds, feed)
				}
				if err := wholeB.Forward(ctx, wm, feeds); err != nil {
					t.Fatal(err)
				}
				if err := firstB.Forward(ctx, fm, feeds); err != nil {
					t.Fatalf("pass %d: %v", pass, err)
				}
				for i := range prompts {
					if !slices.Equal(fs[i].Logits(), ws[i].Logits()) {
						t.Fatalf("pass %d sequence %d: the staged logits differ from the whole model's", pass, i)
					}
				}
			}
			if len(gotRoutes) == 0 || !slices.EqualFunc(gotRoutes, wantRoutes, func(a, b routed) bool { return a.layer == b.layer && slices.Equal(a.experts, b.experts) }) {
				t.Fatalf("the staged passes routed %d layers, the whole model's %d, differently", len(gotRoutes), len(wantRoutes))
			}
			for _, s := range fs {
				if err := r.client.End(ctx, s.Seq()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestAStageLostIsDialedAgainOnReset: a stage whose connection is gone
// fails the run under way (naming it), and the next Reset dials it again
// (restarted on its address, holding nothing); the runs after compute the
// whole model's logits again.
func TestAStageLostIsDialedAgainOnReset(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	load, shadowCerts := checkpoint(t, "tiny", 32)
	whole := load(model.LoadOptions{})
	L := whole.Config.NumLayers
	first := load(model.LoadOptions{Layers: &model.LayerRange{First: 0, End: 2}, Head: true})
	rest := load(model.LoadOptions{Layers: &model.LayerRange{First: 2, End: L}})
	serveOn := func(addr string) (string, func()) {
		cfg := &wire.Config{Certs: shadowCerts, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop()}
		cfg.Hello.Layers = []int{2, L}
		sctx, stop := context.WithCancel(ctx)
		ln, err := wire.Listen(sctx, addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		layers := stage.NewLayers(rest)
		go func() {
			for {
				p, err := ln.Accept(sctx)
				if err != nil {
					return
				}
				stage.Serve(sctx, p, layers)
				p.Close()
			}
		}()
		return ln.Addr().String(), func() { stop(); ln.Close() }
	}
	addr, stop := serveOn("127.0.0.1:0")
	dcfg := &wire.Config{Certs: shadowCerts, PeerRoles: []wire.Role{wire.RoleShadow}, Log: zerolog.Nop()}
	p, err := wire.Dial(ctx, addr, dcfg)
	if err != nil {
		t.Fatal(err)
	}
	redials := 0
	client, err := stage.NewClient(ctx, []*wire.Peer{p}, 2, L, "", func(ctx context.Context, i int) (*wire.Peer, error) {
		redials++
		return wire.Dial(ctx, addr, dcfg)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if err := first.SetLayerRunner(client); err != nil {
		t.Fatal(err)
	}
	decode := func() error {
		ws := model.NewSession(whole, model.NewResidentExperts(whole), 8)
		fs := model.NewSession(first, model.NewResidentExperts(first), 8)
		want, err := ws.Forward(ctx, []int{3, 1, 4, 1, 5})
		if err != nil {
			t.Fatal(err)
		}
		got, err := fs.Forward(ctx, []int{3, 1, 4, 1, 5})
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			t.Fatal("the staged logits differ from the whole model's")
		}
		return nil
	}
	if err := decode(); err != nil {
		t.Fatal(err)
	}
	stop() // the stage goes away: its end of the connection closes it
	if err := decode(); err == nil || !strings.Contains(err.Error(), "layers 2-3") {
		t.Fatalf("a run on a lost stage: %v", err)
	}
	_, stop = serveOn(addr) // back on its address, holding nothing
	defer stop()
	if err := client.Reset(ctx); err != nil || redials != 1 {
		t.Fatalf("Reset: %v (%d redials)", err, redials)
	}
	if err := decode(); err != nil {
		t.Fatalf("after the stage came back: %v", err)
	}
}
