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
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/odmoe/odmoe/grammar"
	"os"
	"path/filepath"
	"strings"

	"github.com/odmoe/odmoe/kvcache"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/testbed"
	"github.com/odmoe/odmoe/wire"
	"github.com/odmoe/odmoe/worker"
	"github.com/rs/zerolog"
)

// Files are what a swarm runs on: a model directory, its expert store and
// a cluster's certificates (main, shadow, w1..wN).
type Files struct {
	Model, Store, Certs string
}

// Identity is the identity of f's model (store.ModelIdentity), which
// every node of its swarm says in its Hello and checks in its peers'.
func (f Files) Identity() (string, error) {
	id, err := store.ModelIdentity(f.Model)
	return id.String(), err
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

// OtherExperts makes, under dir, a copy of f's model that differs from it
// only in the weights of layer's expert (its gate's first weight, whose
// bits are flipped), and that copy's store: what a worker holds when its
// store was converted from a fine-tune of the same config and routers.
// The certificates stay f's.
func OtherExperts(ctx context.Context, dir string, f Files, layer, expert int) (Files, error) {
	o := Files{Model: filepath.Join(dir, "model"), Store: filepath.Join(dir, "store"), Certs: f.Certs}
	if err := os.MkdirAll(o.Model, 0o755); err != nil {
		return o, err
	}
	files, err := os.ReadDir(f.Model)
	if err != nil {
		return o, err
	}
	for _, e := range files {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(f.Model, e.Name()))
		if err != nil {
			return o, err
		}
		if err := os.WriteFile(filepath.Join(o.Model, e.Name()), b, 0o644); err != nil {
			return o, err
		}
	}
	m, err := model.Load(o.Model, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return o, err
	}
	names, stacked := m.ExpertTensors(layer, expert)
	part, parts := 0, 1 // the expert's slice of the tensor
	if stacked {
		part, parts = expert, m.Config.NumExperts
	}
	m.Close()
	if err := flipFirstByte(o.Model, names[0], part, parts); err != nil {
		return o, err
	}
	return o, store.Convert(ctx, o.Model, o.Store, store.ConvertOptions{})
}

// flipFirstByte inverts the first byte of slice part of parts of tensor
// name's data in the checkpoint in dir (8 bytes of header length, the
// JSON header, then the data section the tensors' offsets count from).
func flipFirstByte(dir, name string, part, parts int) error {
	set, err := safetensors.Open(dir)
	if err != nil {
		return err
	}
	info, ok := set.Info(name)
	set.Close()
	if !ok {
		return fmt.Errorf("inproc: no tensor %q in %s", name, dir)
	}
	paths, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(paths) != 1 {
		return fmt.Errorf("inproc: %s: want one safetensors file, have %d", dir, len(paths))
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		return err
	}
	at := 8 + int64(binary.LittleEndian.Uint64(b[:8])) + info.Begin + (info.End-info.Begin)/int64(parts)*int64(part)
	b[at] ^= 0xff
	return os.WriteFile(paths[0], b, 0o644)
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
	if err := testbed.EnsureStore(ctx, f.Model, f.Store, log); err != nil {
		return f, err
	}
	return f, EnsureCerts(certDir, workers)
}

// EnsureCerts makes certificates for main, shadow and w1..wN in dir,
// keeping the ones that exist (the CA is reused).
func EnsureCerts(dir string, workers int) error {
	names := []string{"main", "shadow"}
	for i := range workers {
		names = append(names, fmt.Sprintf("w%d", i+1))
	}
	return EnsureNodes(dir, names...)
}

// EnsureNodes makes the certificates of the nodes names (their roles
// inferred from the names: wire.InferRole) in dir where they are
// missing, under the cluster's authority there (made if missing).
func EnsureNodes(dir string, names ...string) error {
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
	// Devices[i] is worker i's device (worker.OpenDevice: "cuda:0", say);
	// "cpu" where empty or absent.
	Devices []string
	// Stats, if set, counts the workers' wire traffic (wire.Config.Stats).
	Stats *wire.Stats
	Log   zerolog.Logger
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
// swarm of o.Count) listening on addr, built as a worker process builds
// itself (worker.New: the budget check, its model's identity, budget and
// load bandwidth in its Hello), and returns the address it listens on;
// stop ends it, closing its connections, and waits for it. Starting it
// again on the same address is a restarted worker.
func StartWorker(ctx context.Context, f Files, i int, addr string, o WorkerOptions) (string, func(), error) {
	return StartWorkerOn(ctx, f.Store, f.Certs, i, addr, o)
}

// StartWorkerOn is StartWorker on the store in storeDir (another
// model's, say) with the certificates in certDir.
func StartWorkerOn(ctx context.Context, storeDir, certDir string, i int, addr string, o WorkerOptions) (string, func(), error) {
	certs, err := wire.LoadCerts(certDir, fmt.Sprintf("w%d", i+1))
	if err != nil {
		return "", nil, err
	}
	st, err := store.Open(storeDir, store.Options{})
	if err != nil {
		return "", nil, err
	}
	spec := ""
	if i < len(o.Devices) {
		spec = o.Devices[i]
	}
	dev, err := worker.OpenDevice(spec, o.BudgetBytes, worker.NewLink(o.LoadBytesSec))
	if err != nil {
		st.Close()
		return "", nil, err
	}
	closeDeps := func() {
		dev.Close()
		st.Close()
	}
	ctx, cancel := context.WithCancel(ctx)
	opt := worker.Options{LoadBytesSec: o.LoadBytesSec, Quiet: true}
	if o.Resident {
		opt.ResidentIndex, opt.ResidentOf = i, o.Count
	}
	n, err := worker.New(ctx, worker.Deps{Store: st, Device: dev, Wire: &wire.Config{Certs: certs, Stats: o.Stats, Log: zerolog.Nop()}, Log: o.Log}, opt)
	if err != nil {
		cancel()
		closeDeps()
		return "", nil, err
	}
	ln, err := n.Listen(ctx, addr)
	if err != nil {
		cancel()
		n.Close()
		closeDeps()
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Serve(ctx, ln)
		ln.Close()
		n.Close()
		closeDeps()
	}()
	return ln.Addr().String(), func() { cancel(); <-done }, nil
}

// ShadowOptions configure an in-process shadow.
type ShadowOptions struct {
	Model *model.Model // the model as the shadow holds it (quantized)
	// Identity is the checkpoint's (store.ModelIdentity of the model
	// directory), which the shadow and its peers check each other by.
	Identity string
	Certs    string       // the cluster's certificates (the shadow's)
	Workers  []string     // the workers' addresses, in layout order
	Layout   sched.Layout // as the main node runs it
	Ahead    int          // shadow.Node.Ahead
	Listen   string       // the address it listens on for the main node
	// Dir, when set, is the model's directory: the shadow reads its
	// vocabulary there for constrained requests' grammars
	// (shadow.VocabularyOf), as a shadow process does.
	Dir string
	Log zerolog.Logger
}

// StartShadow runs a shadow built as a shadow process builds itself
// (shadow.New: connected to the workers, its prefix cache at
// -prefix-cache's default), serving one main node connection after
// another; stop ends it and waits for it.
func StartShadow(ctx context.Context, o ShadowOptions) (addr string, stop func(), err error) {
	certs, err := wire.LoadCerts(o.Certs, "shadow")
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	node, err := shadow.New(ctx, shadow.Deps{Model: o.Model, Identity: o.Identity, Workers: o.Workers, Wire: &wire.Config{Certs: certs, Log: zerolog.Nop()}, Log: o.Log},
		shadow.Options{Group: o.Layout.Group, Ahead: o.Ahead, PrefixBytes: kvcache.DefaultPrefixBytes, Vocabulary: vocabularyOf(o.Dir)})
	if err != nil {
		cancel()
		return "", nil, err
	}
	ln, err := node.Listen(ctx, o.Listen)
	if err != nil {
		node.Close()
		cancel()
		return "", nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer ln.Close()
		node.Serve(ctx, ln)
	}()
	return ln.Addr().String(), func() { cancel(); <-done; node.Close() }, nil
}

// vocabularyOf is shadow.VocabularyOf(dir), nil without a directory.
func vocabularyOf(dir string) func() (*grammar.Vocabulary, error) {
	if dir == "" {
		return nil
	}
	return shadow.VocabularyOf(dir)
}
