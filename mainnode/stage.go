package mainnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/passloop"
	"slices"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// StageConfig is what a main stage runs on (`odmoe run -role stage`): the
// attention, norms and dense MLPs of a range of layers and those layers'
// KV rows, which it runs for a main node's passes, each MoE layer's
// experts on its workers as the main node would run them.
type StageConfig struct {
	Model   string
	Layers  string   // -layers A-B
	Listen  string   // where the main node dials it
	Workers []string // worker addresses, in the main node's order
	Group   int      // workers per group; 0: the router's top-k
	// Prefetch is the main node's policy, which the stage's layers run
	// under too (shadow: on the predictions its main node hands on)
	Prefetch    Prefetch
	MiniBatch   int
	PeerTimeout time.Duration
	DialTimeout time.Duration
	Wire        *wire.Config
	Mem         int64
	Weights     model.Weights // where the layers' weights live (Config.Weights)
	Context     int           // -context: model.LoadOptions.Context
	// StoreRelays are the nodes that serve the store as they fill theirs
	// (the shadow and its stages), told to the workers with their place
	// (wire.Place.Holders), as the main node does
	StoreRelays []string
	Log         zerolog.Logger
	// Ready, if set, gets the address the stage listens on, once it does
	Ready func(addr string)
}

// RunStage loads cfg's layers and serves them to one main node after
// another until ctx ends.
func RunStage(ctx context.Context, cfg StageConfig) error {
	log := cfg.Log
	mc, err := model.LoadConfig(cfg.Model)
	if err != nil {
		return err
	}
	r, err := model.ParseLayerRange(cfg.Layers, mc.NumLayers)
	if err != nil {
		return fmt.Errorf("stage: -layers: %w", err)
	}
	t0 := time.Now()
	m, err := model.Load(cfg.Model, nodeLoad(model.LoadOptions{SkipExperts: true, Layers: &r, SkipHead: true, Context: cfg.Context}, cfg.Weights, "stage", Serving{}, cfg.Mem, log))
	if err != nil {
		return err
	}
	defer m.Close()
	log.Info().Str("model", cfg.Model).Stringer("layers", r).Str("holds", progress.Bytes(m.NonExpertBytes())).Str("weights", weightsWhere(m)).Dur("load", time.Since(t0)).Msg("stage: layers loaded")
	id, err := store.ModelIdentity(cfg.Model) // the whole checkpoint's: every router
	if err != nil {
		return err
	}
	d := dialing(id, cfg.Wire, cfg.PeerTimeout, cfg.DialTimeout)
	// with -prefetch shadow, the shadow's predictions of its layers come
	// from the main node, as it hears them
	sw, err := d.swarm(ctx, m, cfg.Workers, cfg.Group, Options{Prefetch: cfg.Prefetch, MiniBatch: cfg.MiniBatch, Forwarded: cfg.Prefetch == Shadow, Holders: cfg.StoreRelays, Log: log})
	if err != nil {
		return err
	}
	defer sw.Close()
	lcfg := d.base
	lcfg.PeerRoles = []wire.Role{wire.RoleMain}
	lcfg.Hello.Layers, lcfg.Hello.Context = []int{r.First, r.End}, m.Config.MaxPositions
	lcfg.Hello.Layout, lcfg.Hello.Group = sw.workerNames(), sw.opt.Layout.Group // what its main node checks
	ln, err := wire.Listen(ctx, cfg.Listen, &lcfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Stringer("layers", r).Int("workers", len(cfg.Workers)).Msg("stage ready")
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	layers := stage.NewLayersOn(m, stageRunner{sw})
	return stage.ServeEach(ctx, ln, func(ctx context.Context, p *wire.Peer) error {
		log.Info().Str("main", p.Identity().Name).Msg("stage: serving")
		return stage.Serve(ctx, p, layers)
	}, func(err error) {
		log.Info().Err(err).Msg("stage: the main node is gone; waiting for the next")
	})
}

// workerNames are the Swarm's workers' names, in layout order.
func (s *Swarm) workerNames() []string {
	names := make([]string, len(s.workers))
	for i, l := range s.workers {
		names[i] = l.name
	}
	return names
}

// checkStages refuses stages that serve shorter sequences than the main
// node (contextLen: their long requests would fail midway), or whose
// workers, or groups, are not the main node's (names, in layout order,
// in groups of group): each would run its layers' experts elsewhere than
// the shadow hints, and its figures would count under other workers'
// names.
func checkStages(stages *stage.Client, names []string, group, contextLen int) error {
	for _, h := range stages.Hellos() {
		if h.Context < contextLen {
			return fmt.Errorf("stage %s serves sequences of at most %d positions (-context), the main node %d: give every stage at least the main node's -context", h.Name, h.Context, contextLen)
		}
		if !slices.Equal(h.Layout, names) || h.Group != group {
			return fmt.Errorf("stage %s runs workers %v in groups of %d, the main node %v in groups of %d: give both the same -workers, in the same order, and the same -group",
				h.Name, h.Layout, h.Group, names, group)
		}
	}
	return nil
}

// stageRunner runs a main stage's experts on its Swarm, each pass under
// its main node's step, as the main node's own would run.
type stageRunner struct{ sw *Swarm }

func (r stageRunner) RunExperts(ctx context.Context, step model.Step, layer int, x []float32, n int, routes []model.Route, out []float32) error {
	return r.sw.RunExperts(ctx, step, layer, x, n, routes, out)
}

// BeforePass tells the Swarm the pass's rows, as the main node's pass
// loop tells its own (BeforeBatch): the pass is a batch's, prefill if it
// feeds prompt chunks, and each row is its member's.
func (r stageRunner) BeforePass(ctx context.Context, step model.Step, spans []model.RowSpan, prefill bool) error {
	r.sw.mu.Lock()
	r.sw.batches[step.Seq] = true
	r.sw.mu.Unlock()
	rows := make([]passloop.Row, len(spans))
	most := 0
	for _, sp := range spans {
		most = max(most, sp.Count)
	}
	tokens := make([]int, most) // BeforeBatch counts the rows; their tokens stay with the main node
	for i, sp := range spans {
		rows[i] = passloop.Row{Step: model.Step{Seq: sp.Seq}, Tokens: tokens[:sp.Count], Prompt: prefill}
	}
	return r.sw.BeforeBatch(ctx, step, rows)
}

// Figures are what layers r's experts have cost on the Swarm so far.
func (r stageRunner) Figures(l model.LayerRange) *wire.StageFigures {
	f := &wire.StageFigures{First: l.First}
	r.sw.mu.Lock()
	defer r.sw.mu.Unlock()
	at := func(ls []LayerStats, i int) wire.LayerFigures {
		if i < len(ls) {
			return ls[i].figures()
		}
		return wire.LayerFigures{}
	}
	for i := l.First; i < l.End; i++ {
		f.Decode, f.Prefill = append(f.Decode, at(r.sw.stats.Decode, i)), append(f.Prefill, at(r.sw.stats.Prefill, i))
	}
	for _, w := range r.sw.workers {
		f.Workers = append(f.Workers, w.counts.figures())
	}
	return f
}

// Predicted hands a shadow's prediction, or withdrawal, that the main
// node heard on to the Swarm's placement (-prefetch shadow).
func (r stageRunner) Predicted(m wire.Message) {
	if r.sw.forwarded != nil {
		r.sw.forwarded.heard(m)
	}
}

func (r stageRunner) EndSequence(ctx context.Context, seq uint64) error {
	r.sw.mu.Lock()
	delete(r.sw.batches, seq)
	r.sw.mu.Unlock()
	return r.sw.EndSequence(ctx, seq)
}

// stageRouted scores the shadow's prediction of a layer the stages ran
// (its routing as they handed it back) as RunExperts scores the main
// node's own: decode passes only.
func (s *Swarm) stageRouted(step model.Step, layer int, routes []model.Route) {
	if !s.opt.Stages.Layers().Contains(layer) || !s.shadow.isUp() {
		return // the main node's own (RunExperts scored it), or nothing to score
	}
	q := s.sequence(step)
	if q.prompt || len(routes) == 0 || len(routes)%s.opt.TopK != 0 {
		return
	}
	experts := make([]int, 0, len(routes))
	for _, r := range routes {
		experts = append(experts, r.Expert)
	}
	slices.Sort(experts)
	s.shadow.routed(step, layer, nil, slices.Compact(experts), q.members(len(routes)/s.opt.TopK), routes)
}

// StageRecoverTimeout bounds the wait for a lost stage to answer again
// (restarted from its own files) before the pass it failed fails.
var StageRecoverTimeout = 2 * time.Minute

// recoverStages is the pass loop's Recover: a pass that failed because a
// stage was lost waits for the stage to answer again and has every stage
// forget every sequence, and the loop runs its refills sequences again
// from their first tokens.
func (s *Swarm) recoverStages(ctx context.Context, step model.Step, err error, refills int) bool {
	if !errors.Is(err, stage.ErrLost) {
		return false
	}
	s.opt.Log.Warn().Err(err).Dur("wait", StageRecoverTimeout).Msg("mainnode: a stage is lost; waiting for it to answer again")
	ctx, cancel := context.WithTimeout(ctx, StageRecoverTimeout)
	defer cancel()
	lost, rerr := s.opt.Stages.Recover(ctx)
	if rerr != nil {
		s.opt.Log.Error().Err(rerr).Msg("mainnode: the stage did not come back")
		return false
	}
	s.mu.Lock()
	s.stats.Faults.StagesLost += int64(max(lost, 1))
	s.stats.Faults.Refills += int64(refills)
	s.mu.Unlock()
	// the pass runs again over every member's history: a prompt's, for
	// the plan (prefill), the stages and the shadow's scoring (none)
	s.sequence(step).prompt = true
	s.opt.Stages.Prefill(step)
	s.opt.Log.Info().Int("sequences", refills).Msg("mainnode: the stage is back; its sequences run again from their first tokens")
	return true
}

// workerDialing is how a node that runs experts (the main node, a main
// stage) meets its workers: the model's identity, which a worker of
// another model is refused by, and the timeouts.
type workerDialing struct {
	base  wire.Config // a redial's, and what the node's other connections start from
	start wire.Config // the first dial's: workers may still be pinning or preloading experts
	id    store.Identity
}

// dialing is the workerDialing of a node of the model of identity id,
// its own identity and transport in w.
func dialing(id store.Identity, w *wire.Config, peerTimeout, dialTimeout time.Duration) workerDialing {
	timeout := cmp.Or(peerTimeout, wire.DefaultPeerTimeout)
	base := *w
	base.IdleTimeout, base.KeepAlivePeriod = timeout, timeout/4
	base.Hello.Model = id.String()
	base.CheckHello = wire.SameModel(true) // a worker of another model would change the output
	start := base
	start.DialAttempts, start.MaxDialBackoff, start.DialTimeout = 1<<20, time.Second, cmp.Or(dialTimeout, wire.DefaultStartDialTimeout)
	return workerDialing{base: base, start: start, id: id}
}

// swarm dials workers and returns the Swarm over them for m's experts,
// opt completed (swarmOptions).
func (d workerDialing) swarm(ctx context.Context, m *model.Model, workers []string, group int, opt Options) (*Swarm, error) {
	opt, err := swarmOptions(m, len(workers), group, opt)
	if err != nil {
		return nil, err
	}
	peers, err := d.dialWorkers(ctx, workers, &opt)
	if err != nil {
		return nil, err
	}
	return newSwarm(peers, opt)
}

// dialWorkers connects to the workers at addrs, in layout order, waiting
// for them at start, and sets opt's Redial to dial a lost one again.
func (d workerDialing) dialWorkers(ctx context.Context, addrs []string, opt *Options) ([]*wire.Peer, error) {
	peers, err := DialWorkers(ctx, addrs, &d.start)
	if err != nil {
		return nil, err
	}
	opt.Redial, opt.WorkerAddrs = RedialWorkers(addrs, &d.base), addrs
	return peers, nil
}

// swarmOptions completes opt for m's experts on workers workers in
// groups of group (0: the router's top-k): the layout and the model's
// shapes.
func swarmOptions(m *model.Model, workers, group int, opt Options) (Options, error) {
	c := m.Config
	layout, err := sched.NewLayout(workers, cmp.Or(group, sched.DefaultGroup(workers, c.TopK)))
	if err != nil {
		return opt, err
	}
	opt.Layout, opt.Hidden, opt.Intermediate = layout, c.HiddenSize, c.IntermediateSize
	// every layer with experts, the stages' too: the random policy hints
	// the next one wherever it runs
	opt.Layers, opt.Experts, opt.TopK = c.ExpertLayers(), c.NumExperts, c.TopK
	return opt, nil
}

// newSwarm is NewSwarm, which on failure closes the connections it was
// given.
func newSwarm(peers []*wire.Peer, opt Options) (*Swarm, error) {
	sw, err := NewSwarm(peers, opt)
	if err != nil {
		for _, p := range peers {
			p.Close()
		}
		if opt.Shadow != nil {
			opt.Shadow.Close()
		}
		return nil, err
	}
	return sw, nil
}

// DialStages connects to a main node's stages at addrs, in order, as cfg
// says (the main node's identity; its dial attempts and timeout, a
// redial's one attempt), and returns the client that runs the layers
// they hold (those of a model of layers layers from the first stage's
// first layer on) and that layer.
func DialStages(ctx context.Context, addrs []string, cfg *wire.Config, layers int) (*stage.Client, int, error) {
	start, redial := *cfg, *cfg
	start.PeerRoles, redial.PeerRoles = []wire.Role{wire.RoleMain}, []wire.Role{wire.RoleMain}
	redial.DialAttempts, redial.DialTimeout = 1, 0
	var peers []*wire.Peer
	closeAll := func() {
		for _, p := range peers {
			p.Close()
		}
	}
	for _, a := range addrs {
		p, err := wire.Dial(ctx, a, &start)
		if err != nil {
			closeAll()
			return nil, 0, fmt.Errorf("dialing stage %s: %w", a, err)
		}
		peers = append(peers, p)
	}
	first, err := stage.LayersOf(peers[0].Hello())
	if err != nil {
		closeAll()
		return nil, 0, err
	}
	c, err := stage.NewClient(ctx, peers, first.First, layers, "", func(ctx context.Context, i int) (*wire.Peer, error) {
		return wire.Dial(ctx, addrs[i], &redial)
	})
	if err != nil {
		closeAll()
		return nil, 0, err
	}
	return c, first.First, nil
}
