package mainnode_test

import (
	"context"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/trace"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// TestSwarmTraceCoversEveryNodeAndHop: a traced run with the shadow
// yields, for the traced decode passes only, the main node's M_l, the
// shadow's S_l, the workers' loads and computes, and every activation,
// result, prediction and alignment as a hop whose two ends were both
// recorded, on one clock.
func TestSwarmTraceCoversEveryNodeAndHop(t *testing.T) {
	f := newSwarmFixture(t, 4)
	mainModel, err := model.Load(f.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mainModel.Close()
	layers := mainModel.Config.NumLayers
	prompt := []int{1, 50, 60, 70, 80}
	opt := mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}, Trace: trace.NewRecorder("main")}
	sw := dialSwarm(t, f, 4, opt, &shadowSpec{quant: kernels.F16})
	const from, to = 3, 4
	if err := sw.StartTrace(context.Background(), from, to); err != nil {
		t.Fatal(err)
	}
	generate(t, mainModel, sw, prompt, 6)
	sw.ShadowStats(10e9)
	tf, err := sw.CollectTrace(context.Background(), 10e9, layers)
	if err != nil {
		t.Fatal(err)
	}
	if tf.From != from || tf.To != to || tf.Layers != layers || len(tf.Nodes) != 6 || tf.Dropped != nil {
		t.Fatalf("trace covers %d..%d of %d layers, nodes %v, dropped %v", tf.From, tf.To, tf.Layers, tf.Nodes, tf.Dropped)
	}
	count := map[string]int{} // node/kind
	for _, e := range tf.Events {
		if e.Pass < from || e.Pass > to {
			t.Fatalf("event outside the window: %+v", e)
		}
		if err := e.Valid(); err != nil {
			t.Fatal(err)
		}
		node := e.Node
		if node[0] == 'w' {
			node = "w"
		}
		count[node+"/"+string(e.Kind)]++
	}
	iters := to - from + 1
	want := map[string]int{
		"main/M":       int(iters) * layers,              // every layer's main compute
		"shadow/S":     int(iters) * (layers + 1),        // up to each router, then the rest
		"shadow/align": int(iters),                       // one alignment applied per pass
		"main/send":    int(iters) * (1 + 2*layers),      // alignment + activations (two workers per layer here)
		"main/recv":    int(iters) * (2*layers + layers), // results (top-2) + the shadow's predictions
	}
	for k, n := range want {
		if count[k] != n {
			t.Errorf("%s: %d events, want %d (all: %v)", k, count[k], n, count)
		}
	}
	if count["w/EC"] != int(iters)*2*layers || count["w/EL"] == 0 {
		t.Errorf("workers: %d computes (want %d), %d loads", count["w/EC"], int(iters)*2*layers, count["w/EL"])
	}
	hops := map[string]int{}
	for _, h := range trace.Join(tf.Events) {
		hops[h.Msg]++
		// a hop takes between 0 and a second, up to the error of the two
		// nodes' clock offsets (half the round trip each was measured on)
		slack := (tf.ClockRTTNs[h.From] + tf.ClockRTTNs[h.To]) / 2
		if d := h.Received - h.Sent; d < -slack || d > 1e9 {
			t.Errorf("hop %+v takes %d ns (clock error up to %d ns)", h, d, slack)
		}
	}
	for msg, n := range map[string]int{trace.MsgActivation: int(iters) * 2 * layers, trace.MsgResult: int(iters) * 2 * layers,
		trace.MsgAlignment: int(iters), trace.MsgPrediction: int(iters) * layers * 3} {
		if hops[msg] != n {
			t.Errorf("%d %s hops, want %d", hops[msg], msg, n)
		}
	}
	for name, off := range tf.ClockOffsetNs {
		if off < -50e6 || off > 50e6 {
			t.Errorf("%s: clock offset %d ns on one machine", name, off)
		}
	}
}
