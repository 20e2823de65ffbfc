// Package inproc runs a swarm inside one process: workers and a shadow on
// loopback QUIC with mutual TLS, each as the role's own code runs it, for
// tests, benchmarks and tune-align. The roles still talk only over wire;
// what this package saves is processes, not protocol.
//
// It also makes the files a swarm needs (a generated model, its store, a
// cluster's certificates), so a test or benchmark starts from nothing.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/odmoe/odmoe/worker"
	"github.com/rs/zerolog"
)

// Files are what a swarm runs on: a model directory, its expert store and
// a cluster's certificates (main, shadow, w1..wN).
type Files struct {
	Model, Store, Certs string
}

// Generate makes Files under dir: the synth preset with seed, its store,
// and certificates for workers workers.
func Generate(ctx context.Context, dir, preset string, seed uint64, workers int) (Files, error) {
	f := Files{filepath.Join(dir, preset), filepath.Join(dir, "store"), filepath.Join(dir, "certs")}
	if err := synth.Generate(f.Model, synth.Options{Preset: preset, Seed: seed}); err != nil {
		return f, err
	}
	if err := store.Convert(ctx, f.Model, f.Store, store.ConvertOptions{}); err != nil {
		return f, err
	}
	return f, EnsureCerts(f.Certs, workers)
}

// Cached is Generate for a model generated once into the user's cache
// directory (benchmarks: the small preset is ~1.4 GB); the certificates
// go to certDir.
func Cached(ctx context.Context, preset string, seed uint64, certDir string, workers int, log zerolog.Logger) (Files, error) {
	cache, err := synth.CacheDir()
	if err != nil {
		return Files{}, err
	}
	dir, err := synth.Cached(cache, preset, seed, nil)
	if err != nil {
		return Files{}, err
	}
	f := Files{Model: dir, Store: filepath.Join(cache, "bench", fmt.Sprintf("%s-seed%d", preset, seed), "store"), Certs: certDir}
	if err := EnsureStore(ctx, f.Model, f.Store, log); err != nil {
		return f, err
	}
	return f, EnsureCerts(certDir, workers)
}

// EnsureStore converts modelDir's experts into dir unless a valid store of
// that model is there already.
func EnsureStore(ctx context.Context, modelDir, dir string, log zerolog.Logger) error {
	m, err := model.Load(modelDir, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return err
	}
	id, err := store.IdentityOf(modelDir, m)
	m.Close()
	if err != nil {
		return err
	}
	if st, err := store.Open(dir, store.Options{Identity: id}); err == nil {
		return st.Close()
	}
	log.Info().Str("dir", dir).Msg("compressing the model's experts (once)")
	update, finish := progress.Reporter("store")
	defer finish()
	return store.Convert(ctx, modelDir, dir, store.ConvertOptions{Force: true, Progress: update})
}

// EnsureCerts makes certificates for main, shadow and w1..wN in dir,
// keeping the ones that exist (the CA is reused).
func EnsureCerts(dir string, workers int) error {
	names := []string{"main", "shadow"}
	for i := range workers {
		names = append(names, fmt.Sprintf("w%d", i+1))
	}
	var missing []string
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n+".pem")); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	specs, err := wire.ParseNodes(strings.Join(missing, ","))
	if err != nil {
		return err
	}
	_, err = wire.WriteCerts(dir, specs, wire.CertOptions{})
	return err
}

// WorkerOptions configure in-process workers.
type WorkerOptions struct {
	Count        int
	BudgetBytes  int64   // each worker's device memory
	LoadBytesSec float64 // pace loads to this rate; 0: unpaced
	// Resident has each worker hold for good the experts it owns in a
	// resident swarm (sched.Layout.Owner), loaded before it listens.
	Resident bool
	Log      zerolog.Logger
}

// StartWorkers runs o.Count workers (w1..wN of f.Certs) on loopback and
// returns their addresses in order; stop ends them and waits for them.
func StartWorkers(ctx context.Context, f Files, o WorkerOptions) (addrs []string, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	for i := range o.Count {
		addr, s, err := StartWorker(ctx, f, i, "127.0.0.1:0", o)
		if err != nil {
			stop()
			return nil, nil, err
		}
		addrs, stops = append(addrs, addr), append(stops, s)
	}
	return addrs, stop, nil
}

// StartWorker runs worker i (w<i+1> of f.Certs; its share of a resident
// swarm of o.Count) listening on addr, and returns the address it
// listens on; stop ends it, closing its connections, and waits for it.
// Starting it again on the same address is a restarted worker.
func StartWorker(ctx context.Context, f Files, i int, addr string, o WorkerOptions) (string, func(), error) {
	st, err := store.Open(f.Store, store.Options{})
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	ln, eng, err := startWorker(ctx, st, f.Certs, i, addr, o)
	if err != nil {
		cancel()
		st.Close()
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker.NewServer(eng, o.Log).Serve(ctx, ln)
		ln.Close()
		eng.Close()
		eng.Device().Close()
		st.Close()
	}()
	return ln.Addr().String(), func() { cancel(); <-done }, nil
}

func startWorker(ctx context.Context, st *store.Store, certDir string, i int, addr string, o WorkerOptions) (*wire.Listener, *worker.Engine, error) {
	hidden, _, err := st.ExpertShape(st.Layers()[0], 0)
	if err != nil {
		return nil, nil, err
	}
	arena, err := worker.NewArena(o.BudgetBytes)
	if err != nil {
		return nil, nil, err
	}
	certs, err := wire.LoadCerts(certDir, fmt.Sprintf("w%d", i+1))
	if err != nil {
		arena.Close()
		return nil, nil, err
	}
	eng := worker.NewEngine(st, hidden, worker.NewCPU(arena, worker.NewLink(o.LoadBytesSec)), o.Log)
	if o.Resident {
		err = eng.PinOwned(ctx, st.Layers(), st.Experts(), i, o.Count, nil)
	}
	var ln *wire.Listener
	if err == nil {
		ln, err = wire.Listen(ctx, addr, &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleMain, wire.RoleShadow}, Log: zerolog.Nop()})
	}
	if err != nil {
		eng.Close()
		arena.Close()
		return nil, nil, err
	}
	return ln, eng, nil
}

// StartShadow runs a shadow over qm (the model as the shadow holds it)
// listening on listen, connected to the workers at workerAddrs, running
// up to ahead iterations ahead of the main node (shadow.Node.Ahead),
// serving one main node connection after another; stop ends it and waits
// for it.
func StartShadow(ctx context.Context, qm *model.Model, certDir string, workerAddrs []string, layout sched.Layout, ahead int, listen string, log zerolog.Logger) (addr string, stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	certs, err := wire.LoadCerts(certDir, "shadow")
	if err != nil {
		cancel()
		return "", nil, err
	}
	var peers []*wire.Peer
	closeAll := func() {
		for _, p := range peers {
			p.Close()
		}
		cancel()
	}
	for _, a := range workerAddrs {
		p, err := wire.Dial(ctx, a, &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop()})
		if err != nil {
			closeAll()
			return "", nil, err
		}
		peers = append(peers, p)
	}
	redial := func(ctx context.Context, w int) (*wire.Peer, error) {
		return wire.Dial(ctx, workerAddrs[w], &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleWorker}, Log: zerolog.Nop(), DialAttempts: 1})
	}
	node, err := shadow.NewNode(qm, peers, layout, redial, log)
	if err != nil {
		closeAll()
		return "", nil, err
	}
	node.Ahead, node.Prefixes = ahead, kvcache.NewPrefixes(kvcache.DefaultPrefixBytes) // as -prefix-cache's default
	ln, err := wire.Listen(ctx, listen, &wire.Config{Certs: certs, PeerRoles: []wire.Role{wire.RoleMain}, Log: zerolog.Nop()})
	if err != nil {
		node.Close()
		cancel()
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			node.ServeMain(ctx, p)
			p.Close()
		}
	}()
	return ln.Addr().String(), func() { cancel(); <-done; node.Close() }, nil
}
