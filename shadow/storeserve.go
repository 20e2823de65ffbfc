package shadow

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/odmoe/odmoe/fetch"
	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// ServeStore serves the shadow's expert store (-store) to the workers
// filling theirs, on the TCP port of listen (the shadow's UDP address),
// until the returned stop is called: a shadow fetching its experts as
// the store's chunks holds nearly all the main node must send, and
// relays each chunk as it arrives (h is a fetch.Filling), so the main
// node's link carries the store about once. cfg is the shadow's wire
// configuration; only workers are served.
func ServeStore(ctx context.Context, listen string, cfg *wire.Config, h fetch.Holder, log zerolog.Logger) (stop func(), err error) {
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return nil, fmt.Errorf("shadow: -listen %q: %w", listen, err)
	}
	c := *cfg
	c.PeerRoles = []wire.Role{wire.RoleWorker}
	ctx, cancel := context.WithCancel(ctx)
	ln, err := wire.ListenStream(ctx, listen, &c)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("shadow: TCP %s, where workers fetch its store: %w", listen, err)
	}
	var served atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		fetch.ServeStreams(ctx, ln, fetch.Served{Store: h}, &served, nil, func(id wire.Identity, sent int64, err error) {
			if ctx.Err() == nil {
				log.Info().Str("peer", id.Name).Str("served", progress.Bytes(sent)).Err(err).Msg("shadow: a worker fetching from its store is done")
			}
		})
	}()
	log.Info().Str("listen", ln.Addr().String()).Msg("shadow: serving its expert store to the workers filling theirs")
	return func() {
		cancel()
		ln.Close()
		<-done
		log.Info().Str("served", progress.Bytes(served.Load())).Int64("served_bytes", served.Load()).Msg("shadow: stopped serving its expert store")
	}, nil
}
