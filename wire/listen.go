package wire

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sync/semaphore"
)

// Listener accepts peers on one UDP address.
type Listener struct {
	cfg   *Config
	udp   *net.UDPConn
	pc    net.PacketConn // udp, or udp behind a delay line (Config.SendDelay)
	tr    *quic.Transport
	ln    *quic.Listener
	ready chan *Peer
	// pool is the room accepted connections' received frames share
	// beyond their own (Config.MaxBufferedBytes)
	pool *semaphore.Weighted

	closing   chan struct{}
	cancel    context.CancelFunc // ends handshakes in progress
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	pending map[*quic.Conn]struct{} // in the Hello exchange
	peers   map[*Peer]struct{}      // established, until they end
	// idOf is every tracked connection's peer identity (identityKey),
	// perID how many each identity holds (MaxConnsPerIdentity)
	idOf  map[*quic.Conn]string
	perID map[string]int
}

// Listen listens for peers on addr (host:port; port 0 picks one). Peers
// come out of Accept once their certificate and Hello have been checked.
// The listener closes when ctx ends or Close is called.
func Listen(ctx context.Context, addr string, cfg *Config) (*Listener, error) {
	c, err := cfg.settled()
	if err != nil {
		return nil, err
	}
	uaddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("wire: listen %s: %w", addr, err)
	}
	tlsConf, err := c.serverTLS(alpn)
	if err != nil {
		return nil, fmt.Errorf("wire: listen %s: %w", addr, err)
	}
	udp, err := listenUDP("udp", uaddr, c.Log)
	if err != nil {
		return nil, fmt.Errorf("wire: listen %s: %w", addr, err)
	}
	pc := c.packetConn(udp)
	tr := &quic.Transport{Conn: pc}
	ln, err := tr.Listen(tlsConf, c.quicConfig())
	if err != nil {
		tr.Close()
		pc.Close()
		return nil, fmt.Errorf("wire: listen %s: %w", addr, err)
	}
	hctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		cfg: c, udp: udp, pc: pc, tr: tr, ln: ln,
		ready:   make(chan *Peer, 16),
		pool:    semaphore.NewWeighted(c.MaxBufferedBytes),
		closing: make(chan struct{}),
		cancel:  cancel,
		pending: map[*quic.Conn]struct{}{},
		idOf:    map[*quic.Conn]string{},
		perID:   map[string]int{},
		peers:   map[*Peer]struct{}{},
	}
	c.warnInsecure("listen")
	c.Log.Info().Str("node", c.Name).Stringer("addr", udp.LocalAddr()).Strs("peer_roles", rolesStrings(c.PeerRoles)).Msg("wire: listening")
	stop := context.AfterFunc(ctx, func() { l.Close() })
	l.wg.Go(func() {
		defer stop()
		l.acceptLoop(hctx)
	})
	return l, nil
}

func rolesStrings(rs []Role) []string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return s
}

func (l *Listener) acceptLoop(ctx context.Context) {
	for {
		conn, err := l.ln.Accept(ctx)
		if err != nil {
			return // the listener is closing
		}
		l.wg.Go(func() { l.handshake(ctx, conn) })
	}
}

// handshake runs the Hello exchange with a new connection and queues the
// peer for Accept.
func (l *Listener) handshake(ctx context.Context, conn *quic.Conn) {
	id := identityKey(conn)
	if code, why := l.track(conn, id); why != "" {
		if code != CodeClosed {
			l.cfg.Stats.Refused.Add(1)
			l.cfg.Log.Warn().Str("node", l.cfg.Name).Stringer("remote", conn.RemoteAddr()).Str("why", why).Msg("wire: refused a connection")
		}
		conn.CloseWithError(quic.ApplicationErrorCode(code), why)
		return
	}
	var p *Peer
	p = newPeer(conn, l.cfg, l.pool, func() { l.forget(p) })
	err := p.start(ctx, false, "")
	if err == nil && !l.established(p) {
		p.Close()
		return
	}
	if err != nil {
		l.cfg.Log.Warn().Err(err).Str("node", l.cfg.Name).Stringer("remote", conn.RemoteAddr()).Msg("wire: refused a peer")
		return
	}
	l.cfg.Stats.PeersAccepted.Add(1)
	p.log.Info().Stringer("role", roleStringer(p.id.Role)).Msg("wire: peer connected")
	select {
	case l.ready <- p:
	case <-l.closing:
		p.Close()
	}
}

type roleStringer Role

func (r roleStringer) String() string { return string(r) }

// track registers a connection in the Hello exchange, or says why not
// (and with which close code):
// the listener is closing, or holds MaxConns connections, or
// MaxConnsPerIdentity of id's (identityKey).
func (l *Listener) track(conn *quic.Conn, id string) (code ErrorCode, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return CodeClosed, "listener closing"
	case len(l.idOf) >= l.cfg.MaxConns:
		return codeTooMany, fmt.Sprintf("this node holds %d connections already (MaxConns)", len(l.idOf))
	case l.perID[id] >= l.cfg.MaxConnsPerIdentity:
		// the identity's most silent connection makes room: a node
		// restarted after a crash comes back at once, where its dead
		// connections held their places until the idle timeout; a
		// certificate's holder still holds no more than the cap
		stale := l.mostSilent(id)
		if stale == nil { // all still in their Hello exchange
			return codeTooMany, fmt.Sprintf("%q holds %d connections to this node already (MaxConnsPerIdentity)", id, l.perID[id])
		}
		delete(l.peers, stale) // forget, when it runs, leaves perID as it finds it
		delete(l.idOf, stale.conn)
		l.perID[id]--
		l.cfg.Log.Warn().Str("node", l.cfg.Name).Str("peer", id).Stringer("remote", stale.conn.RemoteAddr()).
			Dur("silent", time.Since(time.Unix(0, stale.heard.Load()))).Msg("wire: a new connection of this identity replaces its most silent one (MaxConnsPerIdentity)")
		go stale.conn.CloseWithError(quic.ApplicationErrorCode(codeTooMany), "replaced by a newer connection of the same identity (MaxConnsPerIdentity)")
	}
	l.pending[conn] = struct{}{}
	l.idOf[conn] = id
	l.perID[id]++
	return CodeClosed, ""
}

// mostSilent is id's established connection that has been silent the
// longest, nil if it has none. Call with mu held.
func (l *Listener) mostSilent(id string) *Peer {
	var stale *Peer
	for p := range l.peers {
		if l.idOf[p.conn] == id && (stale == nil || p.heard.Load() < stale.heard.Load()) {
			stale = p
		}
	}
	return stale
}

// identityKey names conn's peer by its certificate (role and name), ""
// where it has none (an insecure listener).
func identityKey(conn *quic.Conn) string {
	if id, err := peerIdentity(conn.ConnectionState().TLS); err == nil {
		return string(id.Role) + "/" + id.Name
	}
	return ""
}

// established moves a peer from pending to peers; false if closing.
func (l *Listener) established(p *Peer) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, p.conn)
	if l.closed {
		return false
	}
	l.peers[p] = struct{}{}
	return true
}

// forget drops a peer whose connection ended (or failed its Hello).
func (l *Listener) forget(p *Peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, p.conn)
	delete(l.peers, p)
	if id, ok := l.idOf[p.conn]; ok {
		delete(l.idOf, p.conn)
		if l.perID[id]--; l.perID[id] == 0 {
			delete(l.perID, id)
		}
	}
}

// Accept returns the next peer that connected and passed the checks;
// after Close, an error matching net.ErrClosed.
func (l *Listener) Accept(ctx context.Context) (*Peer, error) {
	select {
	case p := <-l.ready:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closing:
		return nil, fmt.Errorf("wire: listener closed: %w", net.ErrClosed)
	}
}

// Addr is the address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// Stats are the counters of the listener and its peers.
func (l *Listener) Stats() *Stats { return l.cfg.Stats }

// Close stops accepting and closes every peer that came through the
// listener, then frees its socket.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		l.cancel()
		l.ln.Close()
		l.mu.Lock()
		l.closed = true
		var peers []*Peer
		for p := range l.peers {
			peers = append(peers, p)
		}
		for conn := range l.pending { // their handshake goroutines see it and end
			conn.CloseWithError(quic.ApplicationErrorCode(CodeClosed), "listener closing")
		}
		l.mu.Unlock()
		for _, p := range peers {
			p.Close()
		}
		l.wg.Wait()
		for len(l.ready) > 0 { // bounded: nothing adds to ready once closing
			(<-l.ready).Close()
		}
		l.tr.Close()
		l.pc.Close()
	})
	return nil
}
