package mainnode

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// serveStore serves the expert store in dir (checked to be of the node's
// model) on addr to worker nodes fetching their share of it, each piece
// checked on their side (fetch.Serve), until the returned stop is
// called: the main node is where a swarm's weights start, and a worker
// started on an empty -store with -fetch-from this address fills it.
func serveStore(ctx context.Context, dir, addr string, d workerDialing, log zerolog.Logger) (stop func(), err error) {
	st, err := store.Open(dir, store.Options{Identity: d.id})
	if err != nil {
		return nil, fmt.Errorf("mainnode: -store: %w", err)
	}
	cfg := d.base
	cfg.PeerRoles = []wire.Role{wire.RoleWorker}
	cfg.CheckHello = wire.SameModel(false) // a node with no store yet names no model; one of another model is refused
	ctx, cancel := context.WithCancel(ctx)
	ln, err := wire.Listen(ctx, addr, &cfg)
	if err != nil {
		cancel()
		st.Close()
		return nil, fmt.Errorf("mainnode: -store-listen: %w", err)
	}
	var served atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			p, err := ln.Accept(ctx)
			if err != nil {
				return
			}
			wg.Go(func() {
				defer p.Close()
				log.Info().Str("peer", p.Identity().Name).Msg("main node: a node fetches from its store")
				before := served.Load()
				err := fetch.Serve(ctx, p, st, &served)
				if ctx.Err() == nil {
					log.Info().Str("peer", p.Identity().Name).Str("served", progress.Bytes(served.Load()-before)).Err(err).Msg("main node: a fetching node is done")
				}
			})
		}
	})
	log.Info().Str("store", dir).Str("listen", ln.Addr().String()).Msg("main node: serving the expert store to fetching nodes")
	return func() {
		cancel()
		ln.Close()
		wg.Wait()
		st.Close()
		log.Info().Str("served", progress.Bytes(served.Load())).Msg("main node: stopped serving the expert store")
	}, nil
}

// logStoreTraffic says, a line per worker, what each fetched of its
// store and served of it to others, where it did either (ws as
// WorkerStats answered, in layout order).
func (s *Swarm) logStoreTraffic(ws []*wire.WorkerStats) {
	for i, w := range ws {
		if w == nil || i >= len(s.workers) || w.StoreFetched == 0 && w.StoreServed == 0 {
			continue
		}
		s.opt.Log.Info().Str("worker", s.workers[i].name).Str("fetched", progress.Bytes(w.StoreFetched)).Str("served", progress.Bytes(w.StoreServed)).
			Msg("main node: a worker's expert store, fetched and served")
	}
}
