package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/shadow"
	"github.com/odmoe/odmoe/wire"
	"github.com/odmoe/odmoe/worker"
	"github.com/rs/zerolog"
)

func runMain(ctx context.Context, f *runFlags, stdout io.Writer, log zerolog.Logger) error {
	if err := f.checkGenerate(); err != nil {
		return err
	}
	if f.Workers == "" {
		return usagef("-workers is required for -role main")
	}
	workers, err := f.WorkerList()
	if err != nil {
		return usagef("%v", err)
	}
	policy, err := mainnode.ParsePrefetch(f.Prefetch)
	if err != nil {
		return usagef("-prefetch: %v", err)
	}
	pol := align.Policy{TokenPeriod: f.AlignToken, KVPeriod: f.AlignKV, Adaptive: f.AlignAdaptive}
	switch {
	case policy == mainnode.Shadow && f.Shadow == "":
		return usagef("-prefetch shadow needs -shadow ADDR")
	case policy != mainnode.Shadow && policy != mainnode.Resident && f.Shadow != "":
		return usagef("-shadow is only used with -prefetch shadow or resident")
	}
	if err := pol.Validate(); err != nil {
		return usagef("%v", err)
	}
	if f.Store != "" && f.StoreListen == "" {
		return usagef("-store on the main node is the store it serves: give -store-listen ADDR too")
	}
	var shadowDial time.Duration
	if f.StoreListen != "" && f.DialTimeout == wire.DefaultStartDialTimeout {
		// its workers and stages may be fetching their weights from it
		// first; the shadow (fetching its whole copy, then quantizing
		// it) is not waited for as long: the swarm serves without its
		// predictions until it attaches
		f.DialTimeout, shadowDial = fetchingDialTimeout, wire.DefaultStartDialTimeout
	}
	drafting, err := mainnode.ParseDraft(f.Draft)
	if err != nil {
		return usagef("-draft %v", err)
	}
	if drafting.K > 0 && f.Shadow == "" {
		return usagef("-draft %v checks the shadow's guesses: it needs -shadow ADDR", drafting)
	}
	residency, err := runflags.ParseResidency(f.Residency)
	if err != nil {
		return usagef("%v", err)
	}
	if residency && policy == mainnode.Resident {
		return usagef("-residency on with -prefetch resident: the resident swarm keeps every expert already")
	}
	if f.Placement != "activation" && f.Placement != "uniform" {
		return usagef("-placement %q: activation or uniform", f.Placement)
	}
	var stages []string
	if f.Stages != "" {
		stages = strings.Split(f.Stages, ",")
		if residency {
			return usagef("-stages with -residency on: each stage would place its layers' experts on its own")
		}
	}
	sv := f.serving()
	if err := sv.Listen(); err != nil {
		return err
	}
	cfg := mainnode.Config{Residency: residency, UniformPlacement: f.Placement == "uniform", Model: f.Model, Text: f.text(), Serve: sv, Workers: workers, Group: f.Group,
		Prefetch: policy, MiniBatch: f.MiniBatch, Shadow: f.Shadow, Stages: stages, Align: pol, Draft: drafting, Store: f.Store, StoreListen: f.StoreListen, StoreRelays: listOf(f.StoreRelays), TraceFile: f.Trace, PeerTimeout: f.PeerTimeout, DialTimeout: f.DialTimeout, ShadowDialTimeout: shadowDial, Context: f.Context, Log: log}
	if f.PeerTimeout < 100*time.Millisecond {
		return usagef("-peer-timeout %v: at least 100ms (QUIC keep-alives go out every half of it)", f.PeerTimeout)
	}
	if cfg.Mem, err = f.memBytes(); err != nil {
		return err
	}
	if cfg.Weights, err = f.weights(); err != nil {
		return err
	}
	if f.Trace != "" {
		if cfg.TraceFrom, cfg.TraceTo, err = runflags.ParseIters(f.TraceIters); err != nil {
			return usagef("-trace-iters: %v", err)
		}
	}
	if cfg.Wire, err = clusterConfig(f.Cluster, wire.RoleMain, log); err != nil {
		return err
	}
	if f.Group < 0 || (f.Group > 0 && len(cfg.Workers)%f.Group != 0) {
		return usagef("-workers/-group: %d workers do not split into groups of %d", len(cfg.Workers), f.Group)
	}
	return mainnode.Run(ctx, cfg, stdout)
}

func runStage(ctx context.Context, f *runFlags, log zerolog.Logger) error {
	switch {
	case f.Model == "":
		return usagef("-model is required for -role stage")
	case f.Layers == "":
		return usagef("-layers A-B is required for -role stage: the layers it holds of the main node's")
	case f.Workers == "":
		return usagef("-workers is required for -role stage (the main node's list, in the same order)")
	}
	if _, err := model.ReadLayerRange(f.Layers); err != nil {
		return usagef("-layers: %v", err)
	}
	workers, err := f.WorkerList()
	if err != nil {
		return usagef("%v", err)
	}
	policy, err := mainnode.ParsePrefetch(f.Prefetch)
	if err != nil {
		return usagef("-prefetch: %v", err)
	}
	if f.Group < 0 || (f.Group > 0 && len(workers)%f.Group != 0) {
		return usagef("-workers/-group: %d workers do not split into groups of %d", len(workers), f.Group)
	}
	if f.PeerTimeout < 100*time.Millisecond {
		return usagef("-peer-timeout %v: at least 100ms (QUIC keep-alives go out every half of it)", f.PeerTimeout)
	}
	mem, err := f.memBytes()
	if err != nil {
		return err
	}
	weights, err := f.weights()
	if err != nil {
		return err
	}
	cfg := mainnode.StageConfig{Model: f.Model, Layers: f.Layers, Listen: f.Listen, Workers: workers, Group: f.Group, Prefetch: policy, MiniBatch: f.MiniBatch,
		PeerTimeout: f.PeerTimeout, DialTimeout: f.DialTimeout, Mem: mem, Weights: weights, Context: f.Context, StoreRelays: listOf(f.StoreRelays), Log: log}
	if f.Cluster.Name == "" {
		f.Cluster.Name = "stage"
	}
	if cfg.Wire, err = clusterConfig(f.Cluster, wire.RoleMain, log); err != nil { // a stage meets the workers as its main node does
		return err
	}
	if f.FetchFrom != "" {
		if err := fetchCheckpoint(ctx, f, cfg.Wire, "stage", func(c model.Config) (fetch.Need, error) {
			r, err := model.ParseLayerRange(f.Layers, c.NumLayers)
			return fetch.Need{Layers: r, Embedding: r.First == 0}, err // a stage from layer 0 binds the embedding
		}, nil, log); err != nil {
			return err
		}
	}
	return mainnode.RunStage(ctx, cfg)
}

func runShadow(ctx context.Context, f *runFlags, log zerolog.Logger) error {
	if f.Model == "" {
		return usagef("-model is required for -role shadow")
	}
	// a stage after the first (-layers not from 0) serves its first
	// stage, and dials no workers
	var laterStage bool
	if f.Layers != "" {
		r, err := model.ReadLayerRange(f.Layers)
		if err != nil {
			return usagef("-layers: %v", err)
		}
		laterStage = r.First > 0
	}
	if f.Workers == "" && !laterStage {
		return usagef("-workers is required for -role shadow (the same list, in the same order, as the main node's)")
	}
	var workers []string
	var err error
	if f.Workers != "" {
		if workers, err = f.WorkerList(); err != nil {
			return usagef("%v", err)
		}
	}
	var stages []string
	if f.Stages != "" {
		stages = strings.Split(f.Stages, ",")
	}
	dt, err := runflags.ParseQuant(f.Quant)
	if err != nil {
		return usagef("-quant: %v", err)
	}
	if f.prefixCacheBytes, err = runflags.ParseBytes(f.PrefixCache); err != nil || f.prefixCacheBytes < 0 {
		return usagef("-prefix-cache: want a size such as 512MiB or 0, got %q", f.PrefixCache)
	}
	mem, err := f.memBytes()
	if err != nil {
		return err
	}
	if f.FetchFrom != "" && f.DialTimeout == wire.DefaultStartDialTimeout {
		f.DialTimeout = fetchingDialTimeout // its later stages may be fetching their weights first
	}
	cfg := shadow.Config{Model: f.Model, Quant: dt, Workers: workers, Group: f.Group, Listen: f.Listen, Ahead: f.Ahead,
		PrefixBytes: f.prefixCacheBytes, PeerTimeout: f.PeerTimeout, DialTimeout: f.DialTimeout, Layers: f.Layers, Stages: stages, Mem: mem, Context: f.Context, Log: log}
	if cfg.Wire, err = clusterConfig(f.Cluster, wire.RoleShadow, log); err != nil {
		return err
	}
	var experts *fetch.Filling // its store, served to the workers from the start, as it fills
	if f.Store != "" {
		experts = fetch.NewFilling()
		defer experts.Close()
		stop, err := shadow.ServeStore(ctx, f.Listen, cfg.Wire, experts, log)
		if err != nil {
			return err
		}
		defer stop()
		if f.FetchFrom == "" {
			if err := experts.Open(f.Store); err != nil {
				return fmt.Errorf("shadow: -store: %w", err)
			}
		}
	}
	if f.FetchFrom != "" {
		if err := fetchCheckpoint(ctx, f, cfg.Wire, "shadow", func(c model.Config) (fetch.Need, error) {
			held := model.AllLayers(c.NumLayers)
			var err error
			if f.Layers != "" {
				held, err = model.ParseLayerRange(f.Layers, c.NumLayers)
			}
			// it quantizes its layers' experts too; the first stage samples
			first := held.First == 0
			return fetch.Need{Layers: held, Experts: true, Embedding: first, Head: first}, err
		}, experts, log); err != nil {
			return err
		}
	}
	cfg.Store = f.Store
	return shadow.Run(ctx, cfg)
}

// listOf is a comma-separated list's items, trimmed, the empty left out.
func listOf(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// fetchingDialTimeout is how long a node dials at start (-dial-timeout
// left at its default) where the nodes it dials may be fetching their
// weights first: the main node serving them (-store-listen), a shadow
// fetching its own (-fetch-from).
const fetchingDialTimeout = 10 * time.Minute

func runWorker(ctx context.Context, f *runFlags, log zerolog.Logger) error {
	if f.Store == "" {
		return usagef("-store is required for -role worker")
	}
	cfg := worker.Config{Listen: f.Listen, Store: f.Store, Device: f.Device, HostPreload: f.HostPreload, Log: log}
	if f.FetchFrom != "" {
		for _, a := range strings.Split(f.FetchFrom, ",") {
			cfg.FetchFrom = append(cfg.FetchFrom, strings.TrimSpace(a))
		}
	}
	if r, err := runflags.ParseBytes(f.FetchRate); err != nil || r < 0 {
		return usagef("-fetch-rate %q: want bytes a second such as 50MB, or 0", f.FetchRate)
	} else {
		cfg.FetchRate = float64(r)
	}
	var err error
	if cfg.DeviceMemBytes, err = runflags.ParseBytes(f.DeviceMem); err != nil || cfg.DeviceMemBytes <= 0 {
		return usagef("-device-mem %q: want a positive size such as 1GiB", f.DeviceMem)
	}
	bw, err := runflags.ParseBytes(f.LoadBW)
	if err != nil || bw < 0 {
		return usagef("-load-bw %q: want bytes per second such as 4GB, or 0", f.LoadBW)
	}
	cfg.LoadBytesSec = float64(bw)
	if cfg.HostCacheBytes, err = runflags.ParseBytes(f.HostCache); err != nil || cfg.HostCacheBytes < 0 {
		return usagef("-host-cache %q: want a size such as 2GiB, or 0", f.HostCache)
	}
	if f.HostPreload && cfg.HostCacheBytes == 0 {
		return usagef("-host-preload needs -host-cache SIZE")
	}
	if cfg.HostCompressedBytes, err = runflags.ParseBytes(f.HostCompressed); err != nil || cfg.HostCompressedBytes < 0 {
		return usagef("-host-compressed %q: want a size such as 1GiB, or 0", f.HostCompressed)
	}
	if f.Resident != "" {
		var idx, n int
		if _, err := fmt.Sscanf(f.Resident, "%d/%d", &idx, &n); err != nil || n < 1 || idx < 0 || idx >= n {
			return usagef("-resident %q: want I/W with 0 <= I < W, e.g. 3/8", f.Resident)
		}
		cfg.ResidentIndex, cfg.ResidentOf = idx, n
	}
	if cfg.Wire, err = clusterConfig(f.Cluster, wire.RoleWorker, log); err != nil {
		return err
	}
	return worker.Run(ctx, cfg)
}
