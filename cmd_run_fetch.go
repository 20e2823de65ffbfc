package main

import (
	"context"
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
func fetchCheckpoint(ctx context.Context, f *runFlags, node *wire.Config, role string, need func(model.Config) (fetch.Need, error), log zerolog.Logger) error {
	rate, err := runflags.ParseBytes(f.FetchRate)
	if err != nil || rate < 0 {
		return usagef("-fetch-rate %q: want bytes a second such as 50MB, or 0", f.FetchRate)
	}
	dial := *node
	dial.PeerRoles = []wire.Role{wire.RoleMain} // the main node serves the checkpoint
	var sources []fetch.ModelSource
	for _, addr := range strings.Split(f.FetchFrom, ",") {
		d := fetch.Dial(strings.TrimSpace(addr), &dial)
		defer d.Close()
		sources = append(sources, d)
	}
	update, finish := progress.Reporter(role + ": fetching its weights")
	var mu sync.Mutex
	t0 := time.Now()
	res, err := fetch.Model(ctx, f.Model, sources, need, fetch.Options{Rate: float64(rate), Spread: true, Log: log,
		Progress: func(done, total int64) {
			mu.Lock()
			defer mu.Unlock()
			update(done, total)
		}})
	finish()
	if err != nil {
		return err
	}
	ev := log.Info()
	if res.Bad > 0 {
		ev = log.Warn().Int("bad pieces", res.Bad).Strs("bad sources", res.BadSources)
	}
	ev.Str("dir", f.Model).Str("share", progress.Bytes(res.Share)).Str("kept", progress.Bytes(res.Kept)).Str("fetched", progress.Bytes(res.Fetched)).
		Bool("offline", res.Offline).Dur("took", time.Since(t0).Round(time.Millisecond)).Int64("share_bytes", res.Share).Int64("fetched_bytes", res.Fetched).
		Msg(role + ": its part of the checkpoint fetched")
	return nil
}
