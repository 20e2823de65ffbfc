package shadow_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// shadowRig is a shadow node over the tiny model's int8 copy and two
// workers, with this test as its main node.
type shadowRig struct {
	qm      *model.Model
	main    *wire.Peer   // the test's connection to the shadow, as the main node
	workers []*wire.Peer // the test's connections to the workers, as the main node
	layout  sched.Layout

	ctx        context.Context
	files      inproc.Files
	addrs      []string // the workers'
	stopWorker []func()
	workerOpt  inproc.WorkerOptions
	dialAsMain func(addr string, role wire.Role) *wire.Peer
}

func newShadowRig(t *testing.T) *shadowRig {
	t.Helper()
	return newShadowRigAhead(t, 0)
}

// newShadowRigAhead is newShadowRig with a shadow that runs up to ahead
// passes ahead of its alignments.
func newShadowRigAhead(t *testing.T, ahead int) *shadowRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f, err := inproc.Generate(ctx, t.TempDir(), "tiny", 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	full, err := model.Load(f.Model, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { full.Close() })
	qm, err := full.Quantized(kernels.Q8, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &shadowRig{qm: qm, ctx: ctx, files: f, workerOpt: inproc.WorkerOptions{Count: 2, BudgetBytes: 64 << 20, Log: zerolog.Nop()}}
	for i := range r.workerOpt.Count {
		addr, stop, err := inproc.StartWorker(ctx, f, i, "127.0.0.1:0", r.workerOpt)
		if err != nil {
			t.Fatal(err)
		}
		r.addrs, r.stopWorker = append(r.addrs, addr), append(r.stopWorker, stop)
	}
	t.Cleanup(func() {
		for _, stop := range r.stopWorker {
			stop()
		}
	})
	addrs := r.addrs
	layout, _ := sched.NewLayout(2, 2)
	r.layout = layout
	id, err := f.Identity()
	if err != nil {
		t.Fatal(err)
	}
	saddr, stopShadow, err := inproc.StartShadow(ctx, inproc.ShadowOptions{Model: qm, Identity: id, Certs: f.Certs, Workers: addrs, Layout: layout, Ahead: ahead, Listen: "127.0.0.1:0", Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopShadow)
	certs, err := wire.LoadCerts(f.Certs, "main")
	if err != nil {
		t.Fatal(err)
	}
	dial := func(addr string, role wire.Role) *wire.Peer {
		cfg := &wire.Config{Certs: certs, PeerRoles: []wire.Role{role}, Log: zerolog.Nop()}
		cfg.Hello.Model = id // as a main node says its model
		p, err := wire.Dial(ctx, addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	r.dialAsMain = dial
	r.main = dial(saddr, wire.RoleShadow)
	for _, a := range addrs {
		r.workers = append(r.workers, dial(a, wire.RoleWorker))
	}
	return r
}

// reference decodes prompt then token on the shadow's own weights in
// this process and returns each decode layer's distinct experts, sorted:
// what the shadow must predict. Each of feed is fed after the prompt, one
// token at a time, before token.
func (r *shadowRig) reference(t *testing.T, prompt []int, token int, feed ...int) [][]int {
	t.Helper()
	s := model.NewSession(r.qm, model.NewResidentExperts(r.qm), 0)
	if _, err := s.Forward(context.Background(), prompt); err != nil {
		t.Fatal(err)
	}
	for _, tok := range feed {
		if _, err := s.Forward(context.Background(), []int{tok}); err != nil {
			t.Fatal(err)
		}
	}
	want := make([][]int, r.qm.Config.NumLayers)
	s.OnRoute = func(_ model.Step, l int, _ []float32, routes []model.Route) {
		for _, rt := range routes {
			if !slices.Contains(want[l], rt.Expert) {
				want[l] = append(want[l], rt.Expert)
			}
		}
		slices.Sort(want[l])
	}
	if _, err := s.Forward(context.Background(), []int{token}); err != nil {
		t.Fatal(err)
	}
	return want
}

// predictions reads the shadow's messages to the main node until it
// reports pass it of every sequence of seqs done, and returns their
// predictions by sequence and layer; a prediction of another sequence or
// pass fails the test.
func (r *shadowRig) predictions(t *testing.T, it int64, seqs ...uint64) map[uint64][][]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := map[uint64][][]int{}
	for _, s := range seqs {
		got[s] = make([][]int, r.qm.Config.NumLayers)
	}
	for done := 0; done < len(seqs); {
		m, err := r.main.Recv(ctx)
		if err != nil {
			t.Fatalf("waiting for pass %d of sequences %v: %v", it, seqs, err)
		}
		switch m := m.(type) {
		case *wire.Prediction:
			if got[m.Seq] == nil || m.Pass != it {
				t.Fatalf("prediction for sequence %d pass %d, want pass %d of %v", m.Seq, m.Pass, it, seqs)
			}
			for _, e := range m.Experts {
				got[m.Seq][m.Layer] = append(got[m.Seq][m.Layer], int(e))
			}
		case *wire.ShadowDone:
			if m.Pass == 1 && it > 1 {
				continue // a prompt's pass: no predictions
			}
			if got[m.Seq] == nil || m.Pass != it || m.Forward <= 0 || m.RSSPeak <= 0 {
				t.Fatalf("shadow reports %+v, want pass %d of one of %v", m, it, seqs)
			}
			done++
		}
	}
	return got
}

// batchOf is the batch a lone sequence runs in, as text mode runs it
// (a batch of one): its predictions and reports are the batch's.
func batchOf(seq uint64) uint64 { return seq | 1<<62 }

// alone is the alignment of pass it of seq, run as a batch of one:
// feeding prompt (a whole prompt in one pass) or token.
func alone(seq uint64, it int64, token int, prompt ...int) *wire.Alignment {
	a := &wire.Alignment{Seq: seq, Pass: it, Token: int32(token), Batch: batchOf(seq), BatchPass: it, BatchSize: 1}
	if len(prompt) > 0 {
		a.Token, a.Chunk = -1, int32s(prompt)
	}
	return a
}

func (r *shadowRig) send(t *testing.T, m wire.Message) {
	t.Helper()
	if err := r.main.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
}

// TestShadowPredictsWhatItsModelRoutes: departed by alignments as the main
// node departs it, the shadow predicts, for every decode layer, exactly
// the experts its quantized model routes to (computed here independently),
// tells the main node under the main node's sequence id, and hints the
// workers, which load them. It follows two sequences at once, and after
// SequenceEnd alignments for the ended one are dropped.
func TestShadowPredictsWhatItsModelRoutes(t *testing.T) {
	r := newShadowRig(t)
	prompt := []int{1, 17, 33, 49, 65, 81}
	const a, b = 1 << 40, 1<<40 + 1
	tokens := map[uint64]int{a: 100, b: 7}
	for _, seq := range []uint64{a, b} { // both prompts first: the shadow follows both
		r.send(t, alone(seq, 1, -1, prompt...))
	}
	for _, seq := range []uint64{b, a} {
		r.send(t, alone(seq, 2, tokens[seq]))
	}
	got := r.predictions(t, 2, batchOf(a), batchOf(b))
	for seq, tok := range tokens {
		want := r.reference(t, prompt, tok)
		for l := range want {
			if !slices.Equal(got[batchOf(seq)][l], want[l]) {
				t.Errorf("sequence %d layer %d: predicted %v, the shadow's model routes %v", seq, l, got[batchOf(seq)][l], want[l])
			}
		}
	}
	// a ends and b goes on; an alignment of a that comes after a's end
	// (here: after b's next pass, by which time the end has surely
	// arrived, messages on different streams having no order) must come to
	// nothing: predictions for a in b's pass after it fail the test
	r.send(t, &wire.SequenceEnd{Seq: a})
	r.send(t, &wire.SequenceEnd{Seq: batchOf(a)})
	r.send(t, alone(b, 3, 9))
	if got := r.predictions(t, 3, batchOf(b)); len(got[batchOf(b)][0]) == 0 {
		t.Error("no prediction for sequence b after a ended")
	}
	r.send(t, alone(a, 3, 5))
	r.send(t, alone(b, 4, 11))
	r.predictions(t, 4, batchOf(b))
	// the hints travel on their own connections and loads run in the
	// background: the workers have loaded something by now, or soon
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var loads int64
		for i, w := range r.workers {
			if err := w.Send(context.Background(), &wire.StatsRequest{}); err != nil {
				t.Fatal(err)
			}
			m, err := w.Recv(context.Background())
			if err != nil {
				t.Fatalf("worker %d stats: %v", i, err)
			}
			loads += m.(*wire.WorkerStats).Loads
		}
		if loads > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the workers loaded nothing on the shadow's hints within 5 s")
		}
	}
}

// TestShadowJoinsASequenceInTheMiddle: a shadow that attaches while a
// sequence is under way (it was lost, or started late) gets every token so
// far as its prompt and the token to feed; it predicts at once what its
// model routes after that history.
func TestShadowJoinsASequenceInTheMiddle(t *testing.T) {
	r := newShadowRig(t)
	history := []int{1, 17, 33, 49, 65, 81, 4, 300, 12} // prompt 6 tokens, then 3 fed in passes 2..4
	joined := alone(9, 5, 77)
	joined.History = int32s(history)
	r.send(t, joined)
	got := r.predictions(t, 5, batchOf(9))
	want := r.reference(t, history[:6], 77, history[6:]...)
	for l := range want {
		if !slices.Equal(got[batchOf(9)][l], want[l]) {
			t.Errorf("layer %d: predicted %v, the shadow's model routes %v after the history", l, got[batchOf(9)][l], want[l])
		}
	}
	r.send(t, alone(9, 6, 5))
	r.predictions(t, 6, batchOf(9)) // and it goes on from there
}

// TestShadowDialsARestartedWorkerAgain: a worker that restarts (on the
// same address) is dialed again by the shadow, which hints it as before,
// and the shadow keeps following the main node meanwhile.
func TestShadowDialsARestartedWorkerAgain(t *testing.T) {
	r := newShadowRig(t)
	r.send(t, alone(3, 1, -1, 1, 17, 33, 49, 65, 81))
	r.stopWorker[0]()
	r.stopWorker[0] = func() {}
	r.send(t, alone(3, 2, 100))
	r.predictions(t, 2, batchOf(3)) // the worker is gone: the shadow goes on
	addr, stop, err := inproc.StartWorker(r.ctx, r.files, 0, r.addrs[0], r.workerOpt)
	if err != nil {
		t.Fatal(err)
	}
	r.stopWorker[0] = stop
	w := r.dialAsMain(addr, wire.RoleWorker)
	deadline := time.Now().Add(15 * time.Second)
	for it := int64(3); ; it++ {
		r.send(t, alone(3, it, int(it)))
		r.predictions(t, it, batchOf(3))
		if err := w.Send(context.Background(), &wire.StatsRequest{}); err != nil {
			t.Fatal(err)
		}
		m, err := w.Recv(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st := m.(*wire.WorkerStats); st.Loads > 0 {
			break // the restarted worker has loaded on the shadow's hints
		}
		if time.Now().After(deadline) {
			t.Fatal("the restarted worker got no hint from the shadow within 15 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestShadowRunsAheadAndRewinds: a shadow allowed one pass ahead
// predicts pass 2 on the token it samples itself, with no alignment
// for it. An alignment with that token is met (nothing runs again) and
// the shadow goes on to pass 3; one with another token rewinds it:
// it withdraws pass 3's predictions, from the main node and the
// workers, and predicts pass 3 again as its model routes after the
// main node's token.
func TestShadowRunsAheadAndRewinds(t *testing.T) {
	r := newShadowRigAhead(t, 1)
	prompt := []int{5, 200, 7, 300, 11, 90}
	const seq = 12
	r.send(t, alone(seq, 1, -1, prompt...))
	own := r.greedy(t, prompt) // the shadow's own token after the prompt
	got, done := r.readUntilDone(t, batchOf(seq), 2)
	first2 := got
	if done.Ahead != 1 {
		t.Fatalf("pass 2 reported %d ahead, want 1 (no alignment for it was sent)", done.Ahead)
	}
	want := r.reference(t, prompt, own)
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) || got[l].token != int32(own) {
			t.Errorf("ahead, layer %d: predicted %v on token %d, the shadow's model routes %v after its own token %d", l, got[l].experts, got[l].token, want[l], own)
		}
	}
	// the main node samples the same token: met, and pass 3 runs ahead
	r.send(t, alone(seq, 2, own))
	own3 := r.greedy(t, append(slices.Clone(prompt), own))
	first3, done := r.readUntilDone(t, batchOf(seq), 3)
	if done.Ahead != 1 || done.Agreed != 1 || done.Rewound != 0 {
		t.Fatalf("pass 3: %+v, want 1 ahead, 1 agreed, 0 rewound", done)
	}
	// the main node samples another token for pass 3: a rewind
	other := (own3 + 1) % r.qm.Config.VocabSize
	r.send(t, alone(seq, 3, other))
	r.awaitWithdraw(t, batchOf(seq), 3)
	got, done = r.readUntilDone(t, batchOf(seq), 3)
	if done.Ahead != 0 || done.Rewound != 1 {
		t.Fatalf("pass 3 again: %+v, want 0 ahead (it departed on the alignment), 1 rewound", done)
	}
	want = r.reference(t, prompt, other, own)
	for l := range want {
		if !slices.Equal(got[l].experts, want[l]) || got[l].token != int32(other) {
			t.Errorf("after the rewind, layer %d: predicted %v on token %d, the shadow's model routes %v after the main node's token %d", l, got[l].experts, got[l].token, want[l], other)
		}
	}
	// the workers dropped what only pass 3's first path held: each
	// predicted expert is hinted to one worker of its group, and nothing
	// ran, so what pass 2 did not predict too
	var onlyThird int64
	for l := range first3 {
		for _, e := range first3[l].experts {
			if !slices.Contains(first2[l].experts, e) {
				onlyThird++
			}
		}
	}
	if onlyThird == 0 {
		t.Fatal("pass 3's first path predicted nothing pass 2 did not: pick another prompt")
	}
	var withdrawnLoads int64
	for deadline := time.Now().Add(5 * time.Second); withdrawnLoads != onlyThird && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		withdrawnLoads = 0
		for _, w := range r.workers {
			if err := w.Send(context.Background(), &wire.StatsRequest{}); err != nil {
				t.Fatal(err)
			}
			m, err := w.Recv(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			withdrawnLoads += m.(*wire.WorkerStats).WithdrawnLoads
		}
	}
	if withdrawnLoads != onlyThird {
		t.Fatalf("workers dropped %d withdrawn loads, want %d (what only pass 3's first path predicted)", withdrawnLoads, onlyThird)
	}
}

// layerPrediction is what the shadow predicted for one layer.
type layerPrediction struct {
	experts []int   // the latest prediction's
	on      []int32 // the worker each was hinted to
	token   int32
	all     [][]int // every prediction's experts, in order (a revised pass has more than one)
	msgs    []*wire.Prediction
}

// recv is the shadow's next message to the main node.
func (r *shadowRig) recv(t *testing.T) wire.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := r.main.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readUntilDone reads the shadow's predictions for pass it of seq
// until its ShadowDone, which it returns with them by layer (a later
// prediction of a layer replacing an earlier, as on the main node); a
// message of another pass, or a withdrawal, fails the test.
func (r *shadowRig) readUntilDone(t *testing.T, seq uint64, it int64) ([]layerPrediction, *wire.ShadowDone) {
	t.Helper()
	return r.readPass(t, seq, it, false)
}

// readPassAfterRewinds is readUntilDone for pass it of seq where the
// shadow may have run an earlier pass ahead on its own guess before the
// main node's alignment for it came, then taken it back (a Withdraw from
// that pass) and run it again: what precedes pass it's own messages is
// passed over.
func (r *shadowRig) readPassAfterRewinds(t *testing.T, seq uint64, it int64) ([]layerPrediction, *wire.ShadowDone) {
	t.Helper()
	return r.readPass(t, seq, it, true)
}

// readPass is readUntilDone, passing over an earlier pass's withdrawal
// and rerun where rewinds is set.
func (r *shadowRig) readPass(t *testing.T, seq uint64, it int64, rewinds bool) ([]layerPrediction, *wire.ShadowDone) {
	t.Helper()
	got := make([]layerPrediction, r.qm.Config.NumLayers)
	earlier := func(s uint64, pass int64) bool { return rewinds && s == seq && pass < it }
	for {
		switch m := r.recv(t).(type) {
		case *wire.Prediction:
			if earlier(m.Seq, m.Pass) {
				continue // the earlier pass run again
			}
			if m.Seq != seq || m.Pass != it {
				t.Fatalf("prediction for sequence %d pass %d, want pass %d of %d", m.Seq, m.Pass, it, seq)
			}
			lp := &got[m.Layer]
			lp.experts = nil
			for _, e := range m.Experts {
				lp.experts = append(lp.experts, int(e))
			}
			lp.on, lp.token, lp.all, lp.msgs = m.Workers, m.Token, append(lp.all, lp.experts), append(lp.msgs, m)
		case *wire.ShadowDone:
			if m.Pass == 1 && it > 1 || earlier(m.Seq, m.Pass) {
				continue // a prompt's pass (no predictions), or the earlier pass run again
			}
			if m.Seq != seq || m.Pass != it {
				t.Fatalf("shadow reports %+v, want pass %d of %d", m, it, seq)
			}
			return got, m
		case *wire.Withdraw:
			if !earlier(m.Seq, m.From) {
				t.Fatalf("withdraw %+v while reading pass %d", m, it)
			}
			got = make([]layerPrediction, r.qm.Config.NumLayers)
		}
	}
}

// awaitWithdraw reads the shadow's messages until a Withdraw, which must
// take back seq's passes from on; a prediction or a report before it
// fails the test.
func (r *shadowRig) awaitWithdraw(t *testing.T, seq uint64, from int64) {
	t.Helper()
	for {
		switch m := r.recv(t).(type) {
		case *wire.Withdraw:
			if m.Seq != seq || m.From != from {
				t.Fatalf("withdraw %+v, want %d from %d", m, seq, from)
			}
			return
		case *wire.Prediction, *wire.ShadowDone:
			t.Fatalf("%T %+v before the withdrawal", m, m)
		}
	}
}

func int32s(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = int32(id)
	}
	return out
}

// greedy is the token the shadow's own model samples after tokens.
func (r *shadowRig) greedy(t *testing.T, tokens []int) int {
	t.Helper()
	s := model.NewSession(r.qm, model.NewResidentExperts(r.qm), 0)
	logits, err := s.Forward(context.Background(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	return model.Argmax(logits)
}
