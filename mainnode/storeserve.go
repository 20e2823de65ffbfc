package mainnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// serveStore serves the model's checkpoint (cfg.Model) and its expert
// store (cfg.Store, if set; checked to be of the model) on
// cfg.StoreListen to the nodes fetching their share of them, each piece
// checked on their side (fetch.Serve), until the returned stop is
// called: the main node is where a swarm's weights start. A worker
// started on an empty -store with -fetch-from this address fills it; a
// stage or shadow started on an empty -model fetches its layers' tensors.
//
// served counts the bytes sent so far (odmoe_store_served_bytes_total);
// fetching reports whether a node of a role fetches from it now.
func serveStore(ctx context.Context, cfg Config, log zerolog.Logger) (stop func(), served *atomic.Int64, fetching func(wire.Role) bool, err error) {
	id, err := store.ModelIdentity(cfg.Model)
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := model.Load(cfg.Model, model.LoadOptions{SkipExperts: true, Layers: &model.NoLayers, Head: true}) // the names of its expert tensors
	if err != nil {
		return nil, nil, nil, err
	}
	ckpt, err := fetch.OpenCheckpoint(cfg.Model, id, m) // its manifest made in the background from now
	m.Close()
	if err != nil {
		return nil, nil, nil, err
	}
	holds := fetch.Served{Model: ckpt}
	var st *store.Store
	if cfg.Store != "" {
		if _, err := os.Stat(filepath.Join(cfg.Store, store.IndexFile)); errors.Is(err, os.ErrNotExist) {
			// a node started where the model is makes the store it serves
			// (once): the workers' compressed experts
			log.Info().Str("store", cfg.Store).Msg("main node: no store in -store yet: compressing the model's experts (once)")
			update, finish := progress.Reporter("store")
			err := store.Convert(ctx, cfg.Model, cfg.Store, store.ConvertOptions{Progress: update})
			finish()
			if err != nil {
				ckpt.Close()
				return nil, nil, nil, fmt.Errorf("mainnode: -store: %w", err)
			}
		}
		if st, err = store.Open(cfg.Store, store.Options{Identity: id}); err != nil {
			ckpt.Close()
			return nil, nil, nil, fmt.Errorf("mainnode: -store: %w", err)
		}
		holds.Store = st
	}
	closeAll := func() {
		ckpt.Close()
		if st != nil {
			st.Close()
		}
	}
	wcfg := dialing(id, cfg.Wire, cfg.PeerTimeout, cfg.DialTimeout).base
	wcfg.PeerRoles = []wire.Role{wire.RoleWorker, wire.RoleMain, wire.RoleShadow} // workers, stages, shadows
	wcfg.CheckHello = wire.SameModel(false)                                       // a node with no store yet names no model; one of another model is refused
	ctx, cancel := context.WithCancel(ctx)
	ln, err := wire.ListenStream(ctx, cfg.StoreListen, &wcfg)
	if err != nil {
		cancel()
		closeAll()
		return nil, nil, nil, fmt.Errorf("mainnode: -store-listen: %w", err)
	}
	bytes := new(atomic.Int64)
	var mu sync.Mutex
	active := map[wire.Role]int{} // the nodes fetching now, by role
	var wg sync.WaitGroup
	wg.Go(func() {
		fetch.ServeStreams(ctx, ln, holds, bytes, func(id wire.Identity) {
			mu.Lock()
			active[id.Role]++
			mu.Unlock()
			log.Info().Str("peer", id.Name).Msg("main node: a node fetches from its store")
		}, func(id wire.Identity, sent int64, err error) {
			mu.Lock()
			active[id.Role]--
			mu.Unlock()
			if ctx.Err() == nil {
				log.Info().Str("peer", id.Name).Str("served", progress.Bytes(sent)).Err(err).Msg("main node: a fetching node is done")
			}
		})
	})
	log.Info().Str("model", cfg.Model).Str("store", cfg.Store).Str("listen", ln.Addr().String()).Msg("main node: serving the checkpoint and the expert store to fetching nodes")
	stop = func() {
		cancel()
		ln.Close()
		wg.Wait()
		closeAll()
		log.Info().Str("served", progress.Bytes(bytes.Load())).Msg("main node: stopped serving the checkpoint and the expert store")
	}
	fetching = func(r wire.Role) bool {
		mu.Lock()
		defer mu.Unlock()
		return active[r] > 0
	}
	return stop, bytes, fetching, nil
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
