package mainnode

import (
	"context"
	"errors"
	"fmt"

	"github.com/odmoe/odmoe/wire"
)

// Dial connects to every worker address (in order: addrs[i] is worker i of
// the layout) and returns the Swarm over them. cfg is the main node's wire
// configuration; only workers are accepted at the other end. A worker
// lost later is dialed again at the same address (unless opt.Redial says
// otherwise).
func Dial(ctx context.Context, addrs []string, cfg *wire.Config, opt Options) (*Swarm, error) {
	peers, err := DialWorkers(ctx, addrs, cfg)
	if err != nil {
		return nil, err
	}
	if opt.Redial == nil {
		opt.Redial = RedialWorkers(addrs, cfg)
	}
	if opt.WorkerAddrs == nil {
		opt.WorkerAddrs = addrs
	}
	s, err := NewSwarm(peers, opt)
	if err != nil {
		for _, p := range peers {
			p.Close()
		}
		return nil, err
	}
	return s, nil
}

// DialWorkers connects to every worker address at once and returns the
// connections in the order of addrs, or every error.
func DialWorkers(ctx context.Context, addrs []string, cfg *wire.Config) ([]*wire.Peer, error) {
	c := *cfg
	c.PeerRoles = []wire.Role{wire.RoleWorker}
	peers := make([]*wire.Peer, len(addrs))
	errs := make([]error, len(addrs))
	done := make(chan int)
	for i, a := range addrs {
		go func() {
			peers[i], errs[i] = wire.Dial(ctx, a, &c)
			done <- i
		}()
	}
	for range addrs {
		<-done
	}
	if err := errors.Join(errs...); err != nil {
		for _, p := range peers {
			if p != nil {
				p.Close()
			}
		}
		return nil, fmt.Errorf("mainnode: dialing workers: %w", err)
	}
	return peers, nil
}

// RedialWorkers is an Options.Redial that dials worker w at addrs[w] once
// (the Swarm retries, and logs each attempt).
func RedialWorkers(addrs []string, cfg *wire.Config) func(ctx context.Context, w int) (*wire.Peer, error) {
	c := *cfg
	c.PeerRoles = []wire.Role{wire.RoleWorker}
	c.DialAttempts, c.DialTimeout = 1, 0
	return func(ctx context.Context, w int) (*wire.Peer, error) { return wire.Dial(ctx, addrs[w], &c) }
}
