package mainnode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"github.com/odmoe/odmoe/passloop"
	"net"
	"os"
	"path/filepath"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/chat"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/serve"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Serving is how a node serves the OpenAI-compatible API instead of
// answering one prompt (`odmoe run -http ADDR`).
type Serving struct {
	Addr string // TCP address to listen on; "" = answer Text once and exit
	// Listener, if set, is Addr already open (Listen), served in its place
	Listener  net.Listener
	ModelName string // the model's name in the API; "" = the model directory's base name
	// MaxBatch sequences generate at once; MaxQueue more requests wait
	// (0: serve's defaults).
	MaxBatch, MaxQueue int
	// MaxStops is the most stop strings a request may give (0: 4).
	MaxStops int
	// PrefixCacheBytes is the memory for finished requests' KV rows,
	// which later prompts starting with the same tokens reuse
	// (Batcher.KeepPrefixes); 0: none.
	PrefixCacheBytes int64
	// PrefillChunk is the most prompt tokens one pass carries, over all
	// the prompts being fed beside the running streams' decode steps
	// (Batcher.ChunkPrompts); 0: passes.DefaultChunk; negative: every
	// prompt in one pass.
	PrefillChunk int
	// APIKey, if set, is required on every route but /healthz
	// (serve.Config.APIKey).
	APIKey string
	// CORSOrigin is serve.Config.CORSOrigin.
	CORSOrigin string
	// NoConsole is serve.Config.NoConsole.
	NoConsole bool
	// Timeline, set by the swarm, is serve.Config.Timeline.
	Timeline func() any
	// Ready, if set, gets the bound address once the API listens.
	Ready func(net.Addr)
}

// configure sets b up as sv says: its prefix cache and prompt chunks.
func (sv Serving) configure(b *passloop.Batcher) {
	b.KeepPrefixes(sv.PrefixCacheBytes)
	switch {
	case sv.PrefillChunk > 0:
		b.ChunkPrompts(sv.PrefillChunk)
	case sv.PrefillChunk < 0:
		b.ChunkPrompts(0)
	}
}

// Batcher batches m's generations on the swarm (continuous batching):
// each layer's experts load once for every sequence in a decode pass.
// Close it before the swarm.
func (s *Swarm) Batcher(m *model.Model) *passloop.Batcher {
	hooks := passloop.Hooks{BeforePass: s.BeforeBatch, EndSequence: s.EndSequence, Figures: s.SequenceFigures}
	if s.opt.Stages != nil {
		hooks.Recover = s.recoverStages
		if s.shadow != nil {
			hooks.OnRoute = s.stageRouted // the stages' layers' routing, to score the shadow's predictions of them
		}
	}
	var b *passloop.Batcher
	if s.drafter != nil {
		hooks.Draft = func(seq uint64, pos, last, most int) []int { return s.draftFor(b.Seq(), seq, pos, last, most) }
	}
	b = passloop.New(m, s, hooks)
	if s.drafter != nil {
		b.DraftUpTo(s.drafter.mode.K)
	}
	s.mu.Lock()
	s.batches[b.Seq()] = true
	s.mu.Unlock()
	return b
}

// draftFor is the Batcher's Hooks.Draft: the shadow's guesses of the
// tokens after member seq's last one, last at position pos, as many as
// the drafting policy has the pass check (at most most), and how many
// the shadow is to guess for its next pass.
func (s *Swarm) draftFor(batch, seq uint64, pos, last, most int) []int {
	use, ask := s.drafter.choose(seq, batch, pos, most, s.shadow.guessRate())
	g := s.shadow.draftsFor(seq, pos, last, use, ask)
	s.drafter.given(seq, len(g))
	return g
}

// NewLocalBatcher batches generations of the resident model m (local
// mode).
func NewLocalBatcher(m *model.Model) *passloop.Batcher {
	return passloop.New(m, model.NewResidentExperts(m), passloop.Hooks{})
}

// Health reports which of the swarm's nodes are down: a lost worker (its
// experts run elsewhere meanwhile; degraded too, with why it was lost) or
// a lost shadow (loads are reactive meanwhile). The swarm is ready while
// a worker answers: its answers are the same bits whichever nodes are
// down, so a load balancer should keep sending it requests. A worker that
// failed to load an expert from its store is degraded (named with what
// failed): still serving, its failed loads answered by other workers.
func (s *Swarm) Health() serve.Health {
	var h serve.Health
	var lost []string
	for _, l := range s.workers {
		l.mu.Lock()
		err, filling := l.err, l.shareIn != nil
		l.mu.Unlock()
		switch {
		case err != nil:
			lost = append(lost, l.name+": lost: "+err.Error())
			h.Down = append(h.Down, l.name)
		case filling:
			lost = append(lost, l.name+": back, filling its share of the store: it takes experts again once its share is in")
		}
	}
	if s.shadow != nil && !s.shadow.isUp() {
		h.Down = append(h.Down, "shadow")
	}
	h.Ready = s.planner.Live() > 0
	h.Degraded = append(lost, s.Degraded()...)
	return h
}

// serveAPI serves the API for the model in modelDir with gen until ctx
// ends.
func serveAPI(ctx context.Context, modelDir string, m *model.Model, gen serve.Generator, health func() serve.Health, reg *prometheus.Registry, sv Serving, log zerolog.Logger) error {
	tok, err := tokenizer.LoadDir(modelDir)
	if err != nil {
		return err
	}
	name := sv.ModelName
	if name == "" {
		name = filepath.Base(filepath.Clean(modelDir))
	}
	var tmpl serve.ChatTemplate
	switch t, err := chat.Load(modelDir); {
	case err == nil:
		tmpl = t
	case errors.Is(err, chat.ErrNoTemplate):
		log.Warn().Str("model", modelDir).Msg("the model has no chat template (tokenizer_config.json chat_template): /v1/chat/completions refuses requests, /v1/completions serves")
	default:
		return err
	}
	config, err := os.ReadFile(filepath.Join(modelDir, "config.json"))
	if err != nil {
		return err
	}
	identity := sha256.Sum256(config)
	srv, err := serve.New(serve.Config{
		Model: name, ModelIdentity: hex.EncodeToString(identity[:]), Tokenizer: tok, Chat: tmpl, Context: m.Config.MaxPositions, Generator: gen, Health: health,
		MaxBatch: sv.MaxBatch, MaxQueue: sv.MaxQueue, MaxStops: sv.MaxStops, Registry: reg, APIKey: sv.APIKey, CORSOrigin: sv.CORSOrigin, NoConsole: sv.NoConsole, Timeline: sv.Timeline, Log: log,
	})
	if err != nil {
		return err
	}
	if err := sv.Listen(); err != nil {
		return err
	}
	return srv.ServeOn(ctx, sv.Listener, sv.Ready)
}

// Listen opens sv.Addr for the API before anything loads, so that an
// address in use is said at once with what to do; the listener is then
// sv.Listener. It does nothing without an address.
func (sv *Serving) Listen() error {
	if sv.Addr == "" || sv.Listener != nil {
		return nil
	}
	ln, err := serve.Listen(sv.Addr)
	sv.Listener = ln
	return err
}
