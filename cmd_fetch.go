package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/wire"
)

// runFetch fills a store directory with this node's share of the store
// that other nodes hold (package fetch): as a worker of the cluster, it
// dials them and asks each piece of the first that answers.
func runFetch(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("fetch", stderr)
	from := fs.String("from", "", "comma-separated `ADDRS` (HOST:PORT) of nodes holding the store, or part of it (workers): the chunks are asked of them in turn, a chunk one does not hold of the next (required)")
	dir := fs.String("store", "", "store `DIR` to fill with this node's share: made if missing; the chunks it holds already are checked and kept (required)")
	layers := fs.String("layers", "", "the layers whose experts are the share: comma-separated ranges `A-B` (0-based, inclusive; A- to the last), e.g. 1-1,5-5 for a worker of group 1 of 4 on an 8-layer model (default: every layer)")
	worker := fs.Int("worker", -1, "this node's place `I` (0-based) in the main node's -workers list: the share is the experts the layout has it run (its group's decode layers whole, its prefill experts at every layer); with -workers and -group")
	workers := fs.Int("workers", 0, "with -worker: how many workers the swarm has")
	group := fs.Int("group", 0, "with -worker: workers per group (the main node's -group, or its default: the router's top-k where the workers split into such groups)")
	parallel := fs.Int("parallel", 4, "chunks fetched at once")
	rate := fs.String("fetch-rate", "0", "cap the bytes fetched a second (e.g. 50MB: a running swarm's links keep room for its requests); 0 = no cap")
	var cf runflags.Cluster
	cf.Register(fs)
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	switch {
	case *from == "":
		return usagef("-from is required: the nodes that hold the store")
	case *dir == "":
		return usagef("-store is required: the directory to fill")
	case *parallel < 1:
		return usagef("-parallel must be at least 1, got %d", *parallel)
	}
	opt := fetch.Options{Parallel: *parallel, Spread: true, Log: log}
	if r, err := runflags.ParseBytes(*rate); err != nil || r < 0 {
		return usagef("-fetch-rate %q: want bytes a second such as 50MB, or 0", *rate)
	} else {
		opt.Rate = float64(r)
	}
	if *layers != "" {
		var ranges []model.LayerRange
		for _, part := range strings.Split(*layers, ",") {
			r, err := model.ReadLayerRange(part)
			if err != nil {
				return usagef("-layers: %v", err)
			}
			ranges = append(ranges, r)
		}
		opt.Layers = func(l int) bool {
			return slices.ContainsFunc(ranges, func(r model.LayerRange) bool { return r.Contains(l) })
		}
	}
	if *worker >= 0 {
		l, err := sched.NewLayout(*workers, *group)
		if err != nil {
			return usagef("-worker needs -workers and -group: %v", err)
		}
		if *worker >= l.Workers {
			return usagef("-worker %d of %d workers (0-based)", *worker, l.Workers)
		}
		opt.Experts = func(layer, expert int) bool { return l.Holds(*worker, layer, expert) }
	} else if *workers != 0 || *group != 0 {
		return usagef("-workers and -group say the layout of -worker's share: give -worker too")
	}
	cfg, err := clusterConfig(cf, wire.RoleWorker, log)
	if err != nil {
		return err
	}
	cfg.PeerRoles = []wire.Role{wire.RoleWorker, wire.RoleMain} // workers holding the store, or the main node serving it
	var sources []fetch.Source
	for _, addr := range strings.Split(*from, ",") {
		p, err := wire.DialStream(ctx, strings.TrimSpace(addr), cfg)
		if err != nil {
			log.Warn().Str("addr", addr).Err(err).Msg("fetch: a source did not answer; fetching from the others")
			continue
		}
		src := fetch.NewPeerSource(p)
		defer src.Close()
		sources = append(sources, src)
	}
	if len(sources) == 0 {
		return fmt.Errorf("fetch: none of %s answered", *from)
	}
	update, finish := progress.Reporter("fetch")
	var mu sync.Mutex
	opt.Progress = func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		update(done, total)
	}
	t0 := time.Now()
	res, err := fetch.Share(ctx, *dir, sources, opt)
	finish()
	if err != nil {
		return err
	}
	took := time.Since(t0)
	fmt.Fprintf(stdout, "share of %s in %d chunks: %s kept (already there, checked), %s fetched in %v (%s/s)\n", progress.Bytes(res.Share), res.Chunks,
		progress.Bytes(res.Kept), progress.Bytes(res.Fetched), took.Round(time.Millisecond), progress.Bytes(int64(float64(res.Fetched)/max(took.Seconds(), 1e-9))))
	if res.Bad > 0 {
		fmt.Fprintf(stdout, "%d chunks came wrong (fetched again from the next source) from %s\n", res.Bad, strings.Join(res.BadSources, ", "))
	}
	return nil
}
