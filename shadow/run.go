package shadow

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/odmoe/odmoe/grammar"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/stage"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// Config is what the shadow node runs on (`odmoe run -role shadow`).
type Config struct {
	Model   string        // Hugging Face model directory (the full-precision weights)
	Quant   kernels.DType // the shadow's weight format: F16, Q8 or NF4
	Workers []string      // worker addresses, in the main node's order
	Group   int           // workers per group; 0: the router's top-k
	Listen  string        // UDP address the main node dials
	// Ahead is how many passes a sequence may run past the main
	// node's latest alignment on the shadow's own tokens (Node.Ahead).
	Ahead int
	// PrefixBytes is the memory for finished sequences' KV rows, which a
	// sequence starting with the same tokens reuses (Node.Prefixes); 0:
	// none.
	PrefixBytes int64
	// PeerTimeout is how long a worker may stay silent before it is lost
	// (its hints dropped until it answers again); 0: wire.DefaultPeerTimeout.
	PeerTimeout time.Duration
	// DialTimeout bounds the wait for the workers to answer at start; 0:
	// wire.DefaultStartDialTimeout.
	DialTimeout time.Duration
	// Layers ("A-B", the first and last, 0-based) are the layers this
	// node holds of a staged shadow, "" all of them. A node whose layers
	// begin at the first is the first stage: it follows the main node and
	// has its Stages run the rest. Any other is a stage: it serves the
	// first stage its layers (package stage), and needs no workers.
	Layers string
	// Stages are the addresses of the stages that hold the layers after
	// a first stage's, in order.
	Stages []string
	// Mem, when set, is the node's memory budget in bytes: it refuses to
	// start when what it will hold (its weights, quantized, and the KV
	// cache of one sequence at its context) passes it.
	Mem int64
	// Context, when positive, is the longest sequence followed instead
	// of the model's (-context: model.LoadOptions.Context).
	Context int
	// Store, if set, is an expert store holding (at least) this node's
	// layers' experts: they are read from it and quantized, and Model
	// need not hold their tensors (a shadow that fetched them as the
	// store's chunks: a third fewer bytes than their bf16 tensors).
	Store string
	Wire  *wire.Config // this node's identity and transport settings
	Log   zerolog.Logger
}

// Run quantizes the model, builds the shadow on it (New: connected to
// the workers) and follows one main node after another until ctx ends;
// or, for a stage of a staged shadow (Config.Layers), serves its first
// stage its layers.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	mcfg, err := model.LoadConfig(cfg.Model)
	if err != nil {
		return err
	}
	held := model.AllLayers(mcfg.NumLayers)
	if cfg.Layers != "" {
		if held, err = model.ParseLayerRange(cfg.Layers, mcfg.NumLayers); err != nil {
			return err
		}
	}
	staged := held != model.AllLayers(mcfg.NumLayers)
	switch {
	case held.First == 0 && staged && len(cfg.Stages) == 0:
		return fmt.Errorf("shadow: layers %s: the first stage needs -stages, the addresses of the stages holding layers %d to %d", held, held.End, mcfg.NumLayers-1)
	case !staged && len(cfg.Stages) > 0:
		return fmt.Errorf("shadow: -stages without -layers: say which layers this first stage holds")
	case held.First > 0 && len(cfg.Stages) > 0:
		return fmt.Errorf("shadow: layers %s: a stage after the first has no -stages (the first stage dials each)", held)
	}
	id, qm, err := load(cfg, held)
	if err != nil {
		return err
	}
	if held.First > 0 {
		return serveStage(ctx, cfg, qm, id.String())
	}
	var stages *stage.Client
	if staged {
		if stages, err = dialStages(ctx, cfg, id.String(), held.End, mcfg.NumLayers, qm.Config.MaxPositions); err != nil {
			return err
		}
		defer stages.Close()
		if err := qm.SetLayerRunner(stages); err != nil {
			return err
		}
		if cfg.PrefixBytes > 0 {
			log.Info().Msg("shadow: no prefix cache on a staged shadow (yet): every sequence's history runs through the stages")
			cfg.PrefixBytes = 0
		}
	}
	node, err := New(ctx, Deps{Model: qm, Identity: id.String(), Workers: cfg.Workers, Wire: cfg.Wire, Log: log},
		Options{Group: cfg.Group, Ahead: cfg.Ahead, PrefixBytes: cfg.PrefixBytes, PeerTimeout: cfg.PeerTimeout, DialTimeout: cfg.DialTimeout,
			Vocabulary: VocabularyOf(cfg.Model)})
	if err != nil {
		return err
	}
	defer node.Close()
	if stages != nil {
		node.Stages = stages
	}
	ln, err := node.Listen(ctx, cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Int("workers", len(cfg.Workers)).Stringer("layers", held).Msg("shadow ready")
	return node.Serve(ctx, ln)
}

// load checks cfg's footprint (checkFootprint) and quantizes the layers
// held (quantized), their experts read from cfg.Store where it is set;
// it returns the model's identity and the quantized copy.
func load(cfg Config, held model.LayerRange) (store.Identity, *model.Model, error) {
	var experts *store.Store
	if cfg.Store != "" {
		id, err := store.ModelIdentity(cfg.Model)
		if err != nil {
			return store.Identity{}, nil, err
		}
		if experts, err = store.Open(cfg.Store, store.Options{Identity: id}); err != nil {
			return store.Identity{}, nil, fmt.Errorf("shadow: -store: %w", err)
		}
		defer experts.Close() // quantized: not read again
	}
	id, err := checkFootprint(cfg, held, experts)
	if err != nil {
		return store.Identity{}, nil, err
	}
	qm, err := quantized(cfg.Model, cfg.Quant, held, cfg.Context, experts, cfg.Log)
	return id, qm, err
}

// checkFootprint reads the checkpoint's mapping (nothing is paged in
// but what the identity hashes), says what this node will hold of it
// (layers held, quantized as cfg says) and refuses, naming the
// shortfall and how many stages would fit, where that passes cfg.Mem;
// it returns the checkpoint's identity (store.IdentityOf).
func checkFootprint(cfg Config, held model.LayerRange, experts *store.Store) (store.Identity, error) {
	// held's layers alone: a stage's directory may hold no other (fetched
	// with -fetch-from); their experts from the store where there is one
	m, err := model.Load(cfg.Model, model.LoadOptions{Layers: &held, Head: held.First == 0, SkipHead: held.First > 0, Context: cfg.Context, SkipExperts: experts != nil})
	if err != nil {
		return store.Identity{}, err
	}
	defer m.Close()
	opt := model.FootprintOptions{Quantized: true, Quant: cfg.Quant, Experts: true, Head: held.First == 0, SkipHead: held.First > 0}
	if experts != nil {
		opt.ExpertsFrom = experts
	}
	f, err := m.FootprintOf(held, opt)
	if err != nil {
		return store.Identity{}, err
	}
	cfg.Log.Info().Stringer("layers", held).Str("quant", cfg.Quant.String()).Str("holds", f.String()).Msg("shadow: what this node will hold")
	if cfg.Mem > 0 && f.Total() > cfg.Mem {
		return store.Identity{}, fmt.Errorf("shadow: layers %s need %s, -mem allows %s: %s short%s", held, f, progress.Bytes(cfg.Mem),
			progress.Bytes(f.Total()-cfg.Mem), stagesThatFit(m, held, opt, cfg.Mem))
	}
	switch {
	case experts != nil:
		return experts.Identity(), nil // opened as the checkpoint's (load)
	case held != model.AllLayers(m.Config.NumLayers):
		return store.ModelIdentity(cfg.Model) // every router's, which this node does not hold
	}
	return store.IdentityOf(cfg.Model, m)
}

// stagesThatFit says how many stages of consecutive layers (split as
// evenly as held's divide, the first with the head) would each fit mem,
// or that none would.
func stagesThatFit(m *model.Model, held model.LayerRange, opt model.FootprintOptions, mem int64) string {
	n := held.End - held.First
	for k := 2; k <= n; k++ {
		most := int64(0)
		for i, r := range held.Split(k) {
			o := opt
			o.Head, o.SkipHead = opt.Head && i == 0, i > 0
			f, err := m.FootprintOf(r, o)
			if err != nil {
				return ""
			}
			most = max(most, f.Total())
		}
		if most <= mem {
			size := fmt.Sprintf("%d-%d layers", n/k, (n+k-1)/k)
			switch {
			case n == k:
				size = "1 layer"
			case n%k == 0:
				size = fmt.Sprintf("%d layers", n/k)
			}
			return fmt.Sprintf("; as %d stages of %s each (-layers), the largest would need %s", k, size, progress.Bytes(most))
		}
	}
	return "; not even a stage of one layer would fit"
}

// quantized loads layers held of the checkpoint in dir (with the head,
// where they begin at the first: a first stage samples) and quantizes
// them to dt; the copy owns its memory, the checkpoint let go.
func quantized(dir string, dt kernels.DType, held model.LayerRange, contextLen int, experts *store.Store, log zerolog.Logger) (*model.Model, error) {
	full, err := model.Load(dir, model.LoadOptions{Layers: &held, Head: held.First == 0, SkipHead: held.First > 0, Context: contextLen, SkipExperts: experts != nil}) // the first stage samples
	if err != nil {
		return nil, err
	}
	// the quantized copy owns its memory: unmapping the full-precision
	// checkpoint gives its pages back, so the shadow holds only its copy
	defer full.Close()
	t0 := time.Now()
	var reader model.ExpertReader // nil (not a typed nil): the experts are bound from the checkpoint
	if experts != nil {
		reader = experts
	}
	update, finish := progress.Reporter("quantize " + dt.String())
	qm, err := full.QuantizedWith(dt, reader, update)
	finish()
	if err != nil {
		return nil, err
	}
	log.Info().Str("quant", dt.String()).Stringer("layers", held).Str("holds", progress.Bytes(qm.NonExpertBytes()+qm.ExpertBytes())).
		Dur("quantize", time.Since(t0)).Msg("shadow model ready")
	return qm, nil
}

// dialing is how the shadow dials peers of role, its model id said and
// theirs checked: at start waiting for them as they come up (up to
// dialTimeout, 0 the default), and, redialing, once a call.
func dialing(base wire.Config, role wire.Role, id string, dialTimeout time.Duration) (start, redial wire.Config) {
	start = base
	start.PeerRoles = []wire.Role{role}
	start.Hello.Model, start.CheckHello = id, wire.SameModel(true)
	start.DialAttempts, start.MaxDialBackoff, start.DialTimeout = 1<<20, time.Second, cmp.Or(dialTimeout, wire.DefaultStartDialTimeout)
	redial = start
	redial.DialAttempts, redial.DialTimeout = 1, 0
	return start, redial
}

// serveStage serves the layers qm holds to one first stage after
// another, as they connect.
func serveStage(ctx context.Context, cfg Config, qm *model.Model, id string) error {
	wcfg := *cfg.Wire
	wcfg.PeerRoles = []wire.Role{wire.RoleShadow}
	wcfg.Hello.Model, wcfg.CheckHello = id, wire.SameModel(true)
	held := qm.HeldLayers()
	wcfg.Hello.Layers, wcfg.Hello.Quant, wcfg.Hello.Context = []int{held.First, held.End}, cfg.Quant.String(), qm.Config.MaxPositions
	ln, err := wire.Listen(ctx, cfg.Listen, &wcfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	cfg.Log.Info().Str("listen", ln.Addr().String()).Stringer("layers", held).Msg("shadow stage ready")
	layers := stage.NewLayers(qm)
	return stage.ServeEach(ctx, ln, func(ctx context.Context, p *wire.Peer) error {
		cfg.Log.Info().Str("first stage", p.Identity().Name).Msg("shadow stage: serving")
		return stage.Serve(ctx, p, layers)
	}, func(err error) {
		cfg.Log.Info().Err(err).Msg("shadow stage: the first stage is gone; waiting for the next")
	})
}

// dialStages dials the stages of a first stage whose own layers end
// before first, waiting for them while they quantize; one that follows
// shorter sequences than contextLen (its -context) is refused.
func dialStages(ctx context.Context, cfg Config, id string, first, layers, contextLen int) (*stage.Client, error) {
	wcfg, rcfg := dialing(*cfg.Wire, wire.RoleShadow, id, cfg.DialTimeout) // a redial: a main node's next attach tries again
	redial := func(ctx context.Context, i int) (*wire.Peer, error) { return wire.Dial(ctx, cfg.Stages[i], &rcfg) }
	var peers []*wire.Peer
	for _, a := range cfg.Stages {
		p, err := wire.Dial(ctx, a, &wcfg)
		if err != nil {
			for _, p := range peers {
				p.Close()
			}
			return nil, fmt.Errorf("dialing shadow stage %s: %w", a, err)
		}
		peers = append(peers, p)
		if h := p.Hello(); h.Context < contextLen {
			for _, p := range peers {
				p.Close()
			}
			return nil, fmt.Errorf("shadow stage %s follows sequences of at most %d positions (-context), its first stage %d: give every shadow stage at least the first's -context", a, h.Context, contextLen)
		}
	}
	c, err := stage.NewClient(ctx, peers, first, layers, cfg.Quant.String(), redial)
	if err != nil {
		for _, p := range peers {
			p.Close()
		}
	}
	return c, err
}

// Deps are what a shadow runs on, already made.
type Deps struct {
	Model *model.Model // the quantized copy
	// Identity is the checkpoint's (store.IdentityOf): the shadow tells
	// it to its peers and refuses one of another model.
	Identity string
	Workers  []string // worker addresses, in the main node's order
	// Wire is the shadow's identity (its certificates) and transport
	// settings; New adds what a shadow tells its peers.
	Wire *wire.Config
	Log  zerolog.Logger
}

// Options say how a shadow runs.
type Options struct {
	Group int // workers per group; 0: the router's top-k
	// Ahead is how many passes a sequence may run past the main
	// node's latest alignment on the shadow's own tokens (Node.Ahead).
	Ahead int
	// PrefixBytes is the memory for finished sequences' KV rows (Node.Prefixes); 0: none.
	PrefixBytes int64
	// PeerTimeout is how long a worker may stay silent before it is lost;
	// 0: wire.DefaultPeerTimeout.
	PeerTimeout time.Duration
	// DialTimeout bounds the wait for the workers to answer at start; 0:
	// wire.DefaultStartDialTimeout.
	DialTimeout time.Duration
	// Vocabulary, when set, gives the model's vocabulary (on first use):
	// the shadow keeps its guesses of a constrained request's tokens
	// inside the request's grammar. nil: it guesses them without.
	Vocabulary func() (*grammar.Vocabulary, error)
}

// VocabularyOf gives the vocabulary of the model in dir, read on first
// use (Options.Vocabulary).
func VocabularyOf(dir string) func() (*grammar.Vocabulary, error) {
	return sync.OnceValues(func() (*grammar.Vocabulary, error) {
		tok, err := tokenizer.LoadDir(dir)
		if err != nil {
			return nil, err
		}
		return grammar.NewVocabulary(tok.VocabSize(), tok.TokenBytes, tok.EOS()), nil
	})
}

// New builds a shadow the one way both a process (`odmoe run -role
// shadow`, Run) and an in-process swarm (internal/inproc) build it:
// connected to d's workers (waiting for them while they start, and
// refusing one of another model), with its layout, run-ahead and prefix
// cache as o says. It does not listen yet.
func New(ctx context.Context, d Deps, o Options) (*Node, error) {
	group := o.Group
	if group == 0 {
		group = sched.DefaultGroup(len(d.Workers), d.Model.Config.TopK)
	}
	layout, err := sched.NewLayout(len(d.Workers), group)
	if err != nil {
		return nil, err
	}
	// workers may still be pinning or preloading experts
	wcfg, rcfg := dialing(*d.Wire, wire.RoleWorker, d.Identity, o.DialTimeout) // a redial: the node retries, and logs each attempt
	wcfg.IdleTimeout = cmp.Or(o.PeerTimeout, wire.DefaultPeerTimeout)
	wcfg.KeepAlivePeriod = wcfg.IdleTimeout / 4
	var peers []*wire.Peer
	closeAll := func() {
		for _, p := range peers {
			p.Close()
		}
	}
	for _, a := range d.Workers {
		p, err := wire.Dial(ctx, a, &wcfg)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("dialing worker %s: %w", a, err)
		}
		peers = append(peers, p)
	}
	rcfg.IdleTimeout, rcfg.KeepAlivePeriod = wcfg.IdleTimeout, wcfg.KeepAlivePeriod
	redial := func(ctx context.Context, w int) (*wire.Peer, error) { return wire.Dial(ctx, d.Workers[w], &rcfg) }
	node, err := newNode(d.Model, peers, layout, redial, d.Log)
	if err != nil {
		closeAll()
		return nil, err
	}
	node.Ahead, node.Prefixes, node.vocabulary = o.Ahead, kvcache.NewPrefixes(o.PrefixBytes), o.Vocabulary
	node.mainWire = *d.Wire
	node.mainWire.PeerRoles = []wire.Role{wire.RoleMain}
	node.mainWire.Hello.Model, node.mainWire.CheckHello = d.Identity, wire.SameModel(true)
	node.mainWire.Hello.Group = layout.Group                  // the main node checks that it runs the same layout
	node.mainWire.Hello.Context = d.Model.Config.MaxPositions // and that it follows sequences as long as its own
	for _, p := range peers {
		node.mainWire.Hello.Layout = append(node.mainWire.Hello.Layout, p.Identity().Name)
	}
	return node, nil
}

// Listen listens on addr (UDP) for the main node, as this shadow.
func (n *Node) Listen(ctx context.Context, addr string) (*wire.Listener, error) {
	return wire.Listen(ctx, addr, &n.mainWire)
}

// Serve follows one main node after another, as they connect on ln,
// until ctx ends.
func (n *Node) Serve(ctx context.Context, ln *wire.Listener) error {
	return stage.ServeEach(ctx, ln, n.ServeMain, func(err error) { n.log.Info().Err(err).Msg("main node gone; waiting for the next") })
}
