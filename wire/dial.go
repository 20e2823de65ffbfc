package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// Dial connects to the node listening on addr (host:port), retrying with
// backoff (Config.DialAttempts, DialBackoff, MaxDialBackoff) while it is
// not reachable yet. A refusal (a certificate of another cluster, a
// wrong role or name, a protocol version mismatch) is not retried. The
// returned Peer owns its own UDP socket.
func Dial(ctx context.Context, addr string, cfg *Config) (*Peer, error) {
	c, err := cfg.settled()
	if err != nil {
		return nil, err
	}
	var p *Peer
	attempt := 0
	start := time.Now()
	if c.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.DialTimeout)
		defer cancel()
	}
	err = retry(ctx, c.DialAttempts, backoff(c.DialBackoff, c.MaxDialBackoff), func() error {
		attempt++
		var err error
		p, err = dialOnce(ctx, addr, c)
		if err != nil && !permanent(err) && attempt < c.DialAttempts {
			c.Stats.DialRetries.Add(1)
			ev := c.Log.Debug()
			if attempt&(attempt-1) == 0 { // attempts 1, 2, 4, 8, ...: progress without a flood
				ev = c.Log.Info()
			}
			ev.Err(err).Str("addr", addr).Str("peer", c.PeerName).Int("attempt", attempt).Dur("waited", time.Since(start).Round(time.Millisecond)).
				Msg("wire: no answer yet; dialing again")
		}
		return err
	})
	if err != nil {
		if c.DialTimeout > 0 && ctx.Err() != nil && !permanent(err) {
			return nil, fmt.Errorf("wire: dial %s: no answer within %v (%d attempts): %w", addr, c.DialTimeout, attempt, err)
		}
		return nil, fmt.Errorf("wire: dial %s (%d attempts): %w", addr, attempt, err)
	}
	c.warnInsecure("dial")
	return p, nil
}

func dialOnce(ctx context.Context, addr string, c *Config) (*Peer, error) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, &permanentError{err}
	}
	network, laddr := "udp4", (*net.UDPAddr)(nil)
	if raddr.IP.To4() == nil {
		network = "udp6"
	}
	if raddr.IP.IsLoopback() { // keep loopback traffic on loopback
		laddr = &net.UDPAddr{IP: raddr.IP}
	}
	udp, err := listenUDP(network, laddr, c.Log)
	if err != nil {
		return nil, err
	}
	pc := c.packetConn(udp)
	tr := &quic.Transport{Conn: pc}
	release := func() {
		tr.Close()
		pc.Close()
	}
	var refused errBox
	hctx, cancel := context.WithTimeout(ctx, c.HandshakeTimeout)
	defer cancel()
	conn, err := tr.Dial(hctx, raddr, c.clientTLS(alpn, &refused), c.quicConfig())
	if err != nil {
		release()
		if r := refused.get(); r != nil {
			c.Stats.Refused.Add(1)
			return nil, &permanentError{r}
		}
		return nil, err
	}
	p := newPeer(conn, c, nil, release)
	if err := p.start(ctx, true, c.PeerName); err != nil {
		return nil, err
	}
	c.Stats.PeersDialed.Add(1)
	p.log.Info().Stringer("role", roleStringer(p.id.Role)).Msg("wire: connected to peer")
	return p, nil
}

// permanentError marks a dial error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// permanent reports whether a dial error is a refusal rather than an
// unreachable or not yet listening peer.
func permanent(err error) bool {
	var pe *permanentError
	var ce *ConnError
	var te *quic.TransportError
	switch {
	case errors.As(err, &pe):
		return true
	case errors.As(err, &ce):
		// the peer refused us, or we it: only a listener shutting down is worth another try
		return ce.Code != CodeClosed
	case errors.As(err, &te):
		// a TLS alert: the peer did not accept our certificate
		return te.ErrorCode >= 0x100 && te.ErrorCode <= 0x1ff
	}
	return errors.Is(err, context.Canceled)
}

// Redial reaches a peer this node lost: it calls dial until it returns a
// peer whose identity want accepts (a peer it refuses is closed), waiting
// RedialWait after each failed attempt, which it reports to failed
// first. It returns the peer and the attempt that reached it, or ctx's
// error once ctx ends.
func Redial(ctx context.Context, dial func(context.Context) (*Peer, error), want func(Identity) error,
	failed func(attempt int, err error)) (*Peer, int, error) {
	for attempt := 1; ; attempt++ {
		p, err := dial(ctx)
		if err == nil {
			if err = want(p.Identity()); err != nil {
				p.Close()
				err = fmt.Errorf("answered as %v: %w", p.Identity(), err)
			}
		}
		if err == nil {
			return p, attempt, nil
		}
		if ctx.Err() != nil {
			return nil, attempt, ctx.Err()
		}
		failed(attempt, err)
		t := time.NewTimer(RedialWait(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, attempt, ctx.Err()
		case <-t.C:
		}
	}
}

// RedialWait is how long a node waits after the n-th failed attempt
// (n >= 1) to reach a peer it lost, before dialing again: 250 ms,
// doubling, at most 2 s. The main node (workers, the shadow) and the
// shadow (workers) redial alike.
func RedialWait(n int) time.Duration { return backoff(250*time.Millisecond, 2*time.Second)(n) }

// backoff returns the wait after the n-th failure (n >= 1): base,
// doubling, at most maxWait.
func backoff(base, maxWait time.Duration) func(n int) time.Duration {
	return func(n int) time.Duration {
		d := base
		for i := 1; i < n && d < maxWait; i++ {
			d *= 2
		}
		return min(d, maxWait)
	}
}

// retry calls f until it succeeds, fails permanently, has been called
// attempts times, or ctx ends, waiting wait(n) after the n-th failure.
func retry(ctx context.Context, attempts int, wait func(n int) time.Duration, f func() error) error {
	var err error
	for n := 1; n <= attempts; n++ {
		if err = f(); err == nil || permanent(err) || n == attempts {
			return err
		}
		t := time.NewTimer(wait(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
	return err
}
