package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// fetchCheckpoint fills -model from the nodes at -fetch-from (the main
// node's -store-listen) with the part of the checkpoint need says this
// node binds, before the node loads it: a stage or shadow started on an
// empty (or stale, or damaged) -model directory fetches what it lacks,
// each piece checked against the main node's manifest, and one started
// again on what it fetched fetches nothing.
//
// With experts (a shadow given -store), the checkpoint comes without its
// expert tensors and the experts of the layers need says as the store's
// chunks into f.Store (a third fewer bytes than their bf16 tensors),
// from the same nodes, beside the tensors, served to the workers as they
// arrive (store is the store as it fills); the line that says the node
// has its share counts both.
func fetchCheckpoint(ctx context.Context, f *runFlags, node *wire.Config, role string, need func(model.Config) (fetch.Need, error), store *fetch.Filling, log zerolog.Logger) error {
	rate, err := runflags.ParseBytes(f.FetchRate)
	if err != nil || rate < 0 {
		return usagef("-fetch-rate %q: want bytes a second such as 50MB, or 0", f.FetchRate)
	}
	dial := *node
	dial.PeerRoles = []wire.Role{wire.RoleMain} // the main node serves the checkpoint
	var sources []fetch.ModelSource             // the same nodes, as sources of the store
	var storeSources []fetch.Source
	for _, addr := range strings.Split(f.FetchFrom, ",") {
		d := fetch.Dial(strings.TrimSpace(addr), &dial)
		defer d.Close()
		sources, storeSources = append(sources, d), append(storeSources, d)
	}
	pace := fetch.NewPacer(float64(rate)) // one cap for the checkpoint and the experts, fetched at once
	// a bar for both (reports come from many goroutines): the checkpoint's
	// total and the experts' as each is known
	update, finish := progress.Reporter(role + ": fetching its weights")
	var mu sync.Mutex
	var parts [2]struct{ done, total int64 }
	reporter := func(part int) func(done, total int64) {
		return func(done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			parts[part].done, parts[part].total = done, total
			update(parts[0].done+parts[1].done, parts[0].total+parts[1].total)
		}
	}
	// With experts, the store's chunks of the layers held are fetched
	// from the moment the checkpoint's config says which (need), beside
	// its tensors: the workers, relayed them by this node as they come,
	// start then.
	needOf := need
	var st fetch.Result
	var stErr error
	var experts sync.WaitGroup
	expertsCtx, stopExperts := context.WithCancel(ctx)
	defer stopExperts()
	if store != nil {
		needOf = func(c model.Config) (fetch.Need, error) {
			n, err := need(c)
			if err == nil {
				held := n.Layers
				experts.Go(func() {
					st, stErr = fetch.Share(expertsCtx, f.Store, storeSources, fetch.Options{Pacer: pace, Spread: true, Log: log, Progress: reporter(1),
						Layers: func(l int) bool { return held.Contains(l) }, Filling: store, AheadBytes: fetch.HeldAheadBytes})
				})
			}
			n.Experts = false
			return n, err
		}
	}
	t0 := time.Now()
	res, err := fetch.Model(ctx, f.Model, sources, needOf, fetch.Options{Pacer: pace, Spread: true, Log: log, Progress: reporter(0)})
	if err != nil {
		stopExperts()
	}
	experts.Wait()
	finish()
	if err != nil {
		return err
	}
	share, fetched, kept, bad, badSources := res.Share, res.Fetched, res.Kept, res.Bad, res.BadSources
	what := "its part of the checkpoint fetched"
	switch {
	case store != nil && res.Offline:
		// no source answered, and the checkpoint passed the manifest it
		// kept: the store is used as it is, each chunk checked as the
		// shadow reads it (a missing one fails it, named)
		log.Warn().Str("store", f.Store).Msg(role + ": no source: its experts read from the store as it holds them")
		if err := store.Open(f.Store); err != nil {
			log.Warn().Err(err).Msg(role + ": its store is not served to the workers")
		}
		what = "its part of the checkpoint fetched, its experts as the store's chunks (kept, not checked again)"
	case store != nil:
		if stErr != nil {
			return fmt.Errorf("%s: its layers' experts from the store: %w", role, stErr)
		}
		share, fetched, kept, bad = share+st.Share, fetched+st.Fetched, kept+st.Kept, bad+st.Bad
		badSources = append(badSources, st.BadSources...)
		what = "its part of the checkpoint fetched, its experts as the store's chunks"
	}
	ev := log.Info()
	if bad > 0 {
		ev = log.Warn().Int("bad pieces", bad).Strs("bad sources", badSources)
	}
	if store != nil {
		ev = ev.Str("store", f.Store)
	}
	ev.Str("dir", f.Model).Str("share", progress.Bytes(share)).Str("kept", progress.Bytes(kept)).Str("fetched", progress.Bytes(fetched)).
		Bool("offline", res.Offline).Dur("took", time.Since(t0).Round(time.Millisecond)).Int64("share_bytes", share).Int64("fetched_bytes", fetched).
		Msg(role + ": " + what)
	return nil
}
