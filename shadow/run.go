package shadow

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
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
	// Ahead is how many iterations a sequence may run past the main
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
	Wire        *wire.Config // this node's identity and transport settings
	Log         zerolog.Logger
}

// Run quantizes the model, connects to the workers and follows one main
// node after another until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Log
	full, err := model.Load(cfg.Model, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer func() {
		if full != nil {
			full.Close()
		}
	}()
	group := cfg.Group
	if group == 0 {
		group = sched.DefaultGroup(len(cfg.Workers), full.Config.TopK)
	}
	layout, err := sched.NewLayout(len(cfg.Workers), group)
	if err != nil {
		return err
	}
	id, err := store.IdentityOf(cfg.Model, full) // from the checkpoint, before it is let go
	if err != nil {
		return err
	}
	t0 := time.Now()
	bar := progress.New("quantize "+cfg.Quant.String(), full.NonExpertBytes()+full.ExpertBytes())
	qm, err := full.Quantized(cfg.Quant, func(done, total int64) { bar.Set(done) })
	bar.Finish()
	if err != nil {
		return err
	}
	// the quantized copy owns its memory: unmapping the full-precision
	// checkpoint gives its pages back, so the shadow holds only its copy
	full.Close()
	full = nil
	log.Info().Str("quant", cfg.Quant.String()).Str("holds", progress.Bytes(qm.NonExpertBytes()+qm.ExpertBytes())).
		Dur("quantize", time.Since(t0)).Msg("shadow model ready")
	wcfg := *cfg.Wire
	wcfg.PeerRoles = []wire.Role{wire.RoleWorker}
	wcfg.Hello.Model = id.String()
	wcfg.CheckHello = wire.SameModel(true)
	// workers may still be pinning or preloading experts
	wcfg.DialAttempts, wcfg.MaxDialBackoff, wcfg.DialTimeout = 1<<20, time.Second, cmp.Or(cfg.DialTimeout, wire.DefaultStartDialTimeout)
	wcfg.IdleTimeout = cmp.Or(cfg.PeerTimeout, wire.DefaultPeerTimeout)
	wcfg.KeepAlivePeriod = wcfg.IdleTimeout / 4
	var peers []*wire.Peer
	closeAll := func() {
		for _, p := range peers {
			p.Close()
		}
	}
	for _, a := range cfg.Workers {
		p, err := wire.Dial(ctx, a, &wcfg)
		if err != nil {
			closeAll()
			return fmt.Errorf("dialing worker %s: %w", a, err)
		}
		peers = append(peers, p)
	}
	rcfg := wcfg
	rcfg.DialAttempts, rcfg.DialTimeout = 1, 0 // the node retries, and logs each attempt
	redial := func(ctx context.Context, w int) (*wire.Peer, error) { return wire.Dial(ctx, cfg.Workers[w], &rcfg) }
	node, err := NewNode(qm, peers, layout, redial, log)
	if err != nil {
		closeAll()
		return err
	}
	defer node.Close()
	node.Ahead, node.Prefixes = cfg.Ahead, kvcache.NewPrefixes(cfg.PrefixBytes)
	mcfg := *cfg.Wire
	mcfg.PeerRoles = []wire.Role{wire.RoleMain}
	mcfg.Hello.Model, mcfg.CheckHello = id.String(), wire.SameModel(true)
	mcfg.Hello.Group = layout.Group // the main node checks that it runs the same layout
	for _, p := range peers {
		mcfg.Hello.Layout = append(mcfg.Hello.Layout, p.Identity().Name)
	}
	ln, err := wire.Listen(ctx, cfg.Listen, &mcfg)
	if err != nil {
		return err
	}
	defer ln.Close()
	log.Info().Str("listen", ln.Addr().String()).Int("workers", len(peers)).Msg("shadow ready")
	for {
		p, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		err = node.ServeMain(ctx, p)
		p.Close()
		if ctx.Err() != nil {
			return nil
		}
		log.Info().Err(err).Msg("main node gone; waiting for the next")
	}
}
