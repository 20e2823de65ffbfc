package wire

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// A Stream is a connection over TCP and TLS 1.3, with the same cluster
// certificates, Hello exchange and frames as a Peer's, for one job: bulk
// transfers of weights (package fetch). One long byte stream moves a
// byte for less than half the CPU QUIC's ~1.4 KB packets cost on
// loopback (1.9-2.9 ns against 4.2-5.9, both ends;
// BenchmarkStreamAgainstQUIC), and a node filling its share over a
// 1 Gbit/s link spends its cores on checking and writing, not on UDP
// syscalls (docs/benchmarks/2026-11-29.md, "Fetching over TCP").
//
// Messages go in order, one frame at a time each way. The dialing side
// asks (its frames are small: a listener reads frames of at most
// streamRequestBytes) and the listening side answers (frames up to
// Config.MaxFrameBytes, read one at a time). A Stream ends with a close
// frame, an Error message whose Code is an ErrorCode, where the closing
// side has a reason to give; Recv returns it as a *ConnError with Remote
// set.
type Stream struct {
	conn  *tls.Conn
	raw   *idleConn // under conn: every read and write has its idle time to move a byte
	cfg   *Config
	id    Identity
	hello Hello
	log   zerolog.Logger

	rmu sync.Mutex // one Recv at a time
	fr  *frameReader
	md  *messageDecoder

	wmu sync.Mutex // one frame written at a time
	enc *frameEncoder

	closeOnce sync.Once
	release   func()
}

// streamRequestBytes bounds the frames a stream listener reads: requests
// (a FetchRequest is a few numbers and a name), never near this.
const streamRequestBytes = 64 << 10

// maxPendingStreams bounds the connections a stream listener holds in
// their TLS handshake and Hello: past it, the oldest is closed for the
// newest, so connections that never finish (anyone's: no certificate is
// needed to open one) cannot keep a node's members from getting in.
const maxPendingStreams = 32

// streamIdle is how long a stream waits for a byte to move, either way,
// before it is dropped: Config.IdleTimeout, but never under
// FrameBodyTimeout. A stream has no keep-alives: a fetcher pacing its
// requests (-fetch-rate) or a holder answering others first is silent
// for a while, and a dead host is found by this (or TCP's keep-alive).
func streamIdle(c *Config) time.Duration { return max(c.IdleTimeout, c.FrameBodyTimeout) }

// idleConn gives every Read and Write on a connection Idle to move a
// byte (a frame of 16 MiB on a slow link keeps its stream as long as it
// moves); once cancelled (a Send's or Recv's context ended) every call
// fails at once.
type idleConn struct {
	net.Conn
	idle      atomic.Int64 // nanoseconds
	until     time.Time    // if set, no deadline past it (a handshake's)
	cancelled atomic.Bool
}

func newIdleConn(c net.Conn, idle time.Duration, until time.Time) *idleConn {
	ic := &idleConn{Conn: c, until: until}
	ic.setIdle(idle)
	return ic
}

func (c *idleConn) setIdle(d time.Duration) { c.idle.Store(int64(d)) }
func (c *idleConn) Idle() time.Duration     { return time.Duration(c.idle.Load()) }

// deadline is the next call's.
func (c *idleConn) deadline() time.Time {
	d := time.Now().Add(c.Idle())
	if !c.until.IsZero() && d.After(c.until) {
		return c.until
	}
	return d
}

func (c *idleConn) Read(b []byte) (int, error) {
	if c.cancelled.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	c.Conn.SetReadDeadline(c.deadline())
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	if c.cancelled.Load() {
		return 0, os.ErrDeadlineExceeded
	}
	c.Conn.SetWriteDeadline(c.deadline())
	return c.Conn.Write(b)
}

// cancel makes the call in progress, and every one after, fail.
func (c *idleConn) cancel() {
	c.cancelled.Store(true)
	c.Conn.SetDeadline(time.Unix(1, 0))
}

// alpnStream is the TLS application protocol of streams: a QUIC client
// and a stream listener (or the reverse) never mistake each other.
const alpnStream = "odmoe-stream"

// Identity is the peer's verified identity.
func (s *Stream) Identity() Identity { return s.id }

// Hello is what the peer said about itself.
func (s *Stream) Hello() Hello { return s.hello }

// RemoteAddr is the peer's address.
func (s *Stream) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

// Send writes m as one frame. A context that ends while the frame is
// being written closes the stream (it would be unusable).
func (s *Stream) Send(ctx context.Context, m Message) error {
	if _, ok := m.(*Hello); ok {
		return errors.New("wire: Hello is sent by DialStream and Accept, not by Send")
	}
	if err := m.validate(); err != nil {
		return fmt.Errorf("wire: not sending an invalid %v: %w", m.Type(), err)
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if d, ok := m.(*FetchData); ok && len(d.Data) >= directDataMin && len(d.Err) < directDataMin {
		return s.sendFetchData(ctx, d)
	}
	frame, err := s.enc.encode(m, s.cfg.MaxFrameBytes)
	if err != nil {
		return err
	}
	return s.writeParts(ctx, frame)
}

// writeParts writes a frame, in parts, whole, or closes the stream. Call
// with wmu held.
func (s *Stream) writeParts(ctx context.Context, parts ...[]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, s.raw.cancel)
	var err error
	var n int
	for _, p := range parts {
		if len(p) > 0 && err == nil {
			_, err = s.conn.Write(p)
			n += len(p)
		}
	}
	if !stop() { // the deadline was set: the write was cut short
		s.Close()
		return ctx.Err()
	}
	if err != nil {
		s.Close()
		return fmt.Errorf("wire: stream to %s: %w", s.id.Name, err)
	}
	s.cfg.Stats.FramesSent.Add(1)
	s.cfg.Stats.BytesSent.Add(uint64(n))
	return nil
}

// Recv reads the next message; its memory is the caller's. Bad input
// closes the stream with the reason (the peer is told) and returns it;
// a peer that closed between two frames is ErrClosed.
func (s *Stream) Recv(ctx context.Context) (Message, error) { return s.RecvInto(ctx, nil) }

// RecvInto is Recv, but the data of a FetchData is read straight into the
// buffer into returns for its ID and length, where into is set and
// returns one of that length (nil: a buffer of its own): a fetcher's
// chunks land in the buffers they are kept in, with no copy. into is
// called before those bytes arrive, from this call.
func (s *Stream) RecvInto(ctx context.Context, into func(id uint64, n int) []byte) (Message, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, s.raw.cancel)
	var m Message
	typ, size, err := s.fr.header()
	if err == nil {
		if into != nil && typ == typeFetchData {
			m, err = s.readFetchData(s.fr.r, size, into)
		} else {
			var body []byte
			var owned bool
			if body, owned, err = s.fr.body(typ, size); err == nil {
				m, err = s.md.decode(typ, body, owned)
			}
		}
	}
	if !stop() {
		s.Close()
		return nil, ctx.Err()
	}
	if err == nil {
		s.cfg.Stats.FramesReceived.Add(1)
		s.cfg.Stats.BytesReceived.Add(uint64(size + frameHeaderLen))
		if e, ok := m.(*Error); ok { // the close frame
			s.Close()
			return nil, &ConnError{Code: ErrorCode(e.Code), Remote: true, Reason: e.Msg}
		}
		return m, nil
	}
	var ce *ConnError
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF): // the peer closed between frames: a clean end
		s.Close()
		return nil, &ConnError{Code: CodeClosed, Remote: true}
	case errors.As(err, &ce):
		s.cfg.Stats.countError(ce.Code)
		s.log.Warn().Stringer("code", ce.Code).Str("reason", ce.Reason).Msg("wire: closing the stream")
		s.closeFor(ce)
	case errors.As(err, &ne) && ne.Timeout():
		s.cfg.Stats.PeersLost.Add(1)
		err = fmt.Errorf("%w (no byte moved for %v)", ErrTimeout, s.raw.Idle())
		s.Close()
	default:
		s.Close()
	}
	return nil, fmt.Errorf("wire: stream from %s: %w", s.id.Name, err)
}

// Close ends the stream.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.conn.Close()
		if s.release != nil {
			s.release()
		}
	})
	return nil
}

// closeFor tells the peer why (within a second), then closes.
func (s *Stream) closeFor(ce *ConnError) {
	reason := ce.Reason
	if len(reason) > 200 {
		reason = reason[:200]
	}
	if s.wmu.TryLock() { // a frame half written cannot be followed by another
		frame, err := s.enc.encode(&Error{Code: uint32(ce.Code), Msg: reason}, s.cfg.MaxFrameBytes)
		if err == nil {
			s.raw.setIdle(min(s.raw.Idle(), time.Second)) // a peer that reads nothing costs a second
			s.conn.Write(frame)
		}
		s.wmu.Unlock()
	}
	s.Close()
}

// newStream wraps a TLS connection over raw whose handshake is done.
func newStream(conn *tls.Conn, raw *idleConn, c *Config, maxIn int) *Stream {
	return &Stream{
		conn: conn, raw: raw, cfg: c, log: c.Log,
		fr:  &frameReader{r: conn, maxBytes: min(maxIn, maxHelloBytes)}, // the Hello's limit until it has come
		md:  newMessageDecoder(),
		enc: newFrameEncoder(keepBulkBuf),
	}
}

// helloExchange runs the Hello exchange (the dialer speaks first; the listener
// answers once it has accepted it) and checks who the peer is; admit, if
// set, has the last word before the listener answers.
func (s *Stream) helloExchange(dialer bool, wantName string, maxIn int, admit func(Identity) error) error {
	send := func() error {
		frame, err := s.enc.encode(&s.cfg.Hello, s.cfg.MaxFrameBytes)
		if err != nil {
			return err
		}
		_, err = s.conn.Write(frame)
		return err
	}
	if dialer {
		if err := send(); err != nil {
			return err
		}
	}
	typ, body, owned, err := s.fr.next()
	if err != nil {
		return err
	}
	s.fr.maxBytes = maxIn
	m, err := s.md.decode(typ, body, owned)
	if err != nil {
		return err
	}
	switch h := m.(type) {
	case *Error: // refused
		return &ConnError{Code: ErrorCode(h.Code), Remote: true, Reason: h.Msg}
	case *Hello:
		id, err := s.cfg.helloIdentity(h, s.conn.ConnectionState(), wantName)
		if err != nil {
			return err
		}
		if s.cfg.CheckHello != nil {
			if err := s.cfg.CheckHello(&s.cfg.Hello, h); err != nil {
				return connErrorf(CodeIdentity, nil, "%s refuses %s: %v", s.cfg.Hello.Name, id.Name, err)
			}
		}
		if admit != nil {
			if err := admit(id); err != nil {
				return err
			}
		}
		s.id, s.hello = id, *h
		s.log = s.log.With().Str("peer", id.Name).Logger()
	default:
		return connErrorf(CodeProtocol, nil, "first message is %v, want Hello", typ)
	}
	if !dialer {
		return send()
	}
	return nil
}

// helloIdentity is the identity of a peer whose Hello is h: its
// certificate's (which the Hello must match), or, insecure, the Hello's;
// checked against PeerRoles and wantName.
func (c *Config) helloIdentity(h *Hello, state tls.ConnectionState, wantName string) (Identity, error) {
	id := Identity{Name: h.Name, Role: h.Role}
	if !c.Insecure {
		cert, err := peerIdentity(state)
		if err != nil {
			return Identity{}, err
		}
		if cert != id {
			return Identity{}, connErrorf(CodeIdentity, nil, "hello claims %v, certificate says %v", id, cert)
		}
	}
	return id, c.acceptPeer(id, wantName)
}

// DialStream connects a stream to the stream listener at addr (host:port),
// retrying as Dial does while nothing answers; a refusal is not retried.
func DialStream(ctx context.Context, addr string, cfg *Config) (*Stream, error) {
	c, err := cfg.settled()
	if err != nil {
		return nil, err
	}
	if c.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.DialTimeout)
		defer cancel()
	}
	var s *Stream
	attempt := 0
	err = retry(ctx, c.DialAttempts, backoff(c.DialBackoff, c.MaxDialBackoff), func() error {
		attempt++
		var err error
		s, err = dialStreamOnce(ctx, addr, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wire: dial stream %s (%d attempts): %w", addr, attempt, err)
	}
	c.warnInsecure("dial stream")
	return s, nil
}

func dialStreamOnce(ctx context.Context, addr string, c *Config) (*Stream, error) {
	hctx, cancel := context.WithTimeout(ctx, c.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	tcp, err := d.DialContext(hctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	raw := newIdleConn(tcp, c.HandshakeTimeout, time.Now().Add(c.HandshakeTimeout))
	var refused errBox
	conf := c.clientTLS(alpnStream, &refused)
	conn := tls.Client(raw, conf)
	stop := context.AfterFunc(hctx, raw.cancel)
	if err := conn.HandshakeContext(hctx); err != nil {
		raw.Close()
		if r := refused.get(); r != nil {
			c.Stats.Refused.Add(1)
			return nil, &permanentError{r}
		}
		if refusedByTLS(err) {
			c.Stats.Refused.Add(1)
			return nil, &permanentError{err}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			err = fmt.Errorf("%w: closed before TLS ended (a listener with more handshakes in progress than it holds closes the oldest)", err)
		}
		return nil, err
	}
	s := newStream(conn, raw, c, c.MaxFrameBytes)
	err = s.helloExchange(true, c.PeerName, c.MaxFrameBytes, nil)
	if !stop() && err == nil { // the handshake's time ran out as it ended: raw is cancelled
		err = hctx.Err()
	}
	if err != nil {
		raw.Close()
		var ce *ConnError
		if errors.As(err, &ce) && (ce.Code == CodeIdentity || ce.Code == CodeBadVersion || ce.Code == codeTooMany) || refusedByTLS(err) {
			c.Stats.Refused.Add(1)
			return nil, &permanentError{err}
		}
		if hctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", hctx.Err(), err)
		}
		return nil, err
	}
	raw.until = time.Time{} // (nothing else uses raw yet)
	raw.setIdle(streamIdle(c))
	c.Stats.PeersDialed.Add(1)
	s.log.Info().Stringer("role", roleStringer(s.id.Role)).Msg("wire: stream connected")
	return s, nil
}

// refusedByTLS reports whether err is the listener's TLS alert: it
// refused this node's certificate (TLS 1.3 tells a client so only at its
// first read, after its handshake returned), or speaks no stream.
func refusedByTLS(err error) bool {
	msg := err.Error()
	for _, alert := range []string{"bad certificate", "certificate required", "unknown certificate authority", "access denied", "no application protocol", "protocol version not supported"} {
		if strings.Contains(msg, "remote error: tls: "+alert) {
			return true
		}
	}
	return false
}

// StreamListener accepts streams on one TCP address: the peers asking a
// node for its weights.
type StreamListener struct {
	cfg   *Config
	tls   *tls.Config
	ln    net.Listener
	ready chan *Stream

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]time.Time // in their handshake, since (maxPendingStreams)
	conns   int                    // established (MaxConns)
	perID   map[string]int         // established, by identity (MaxConnsPerIdentity)
	// refusals is when a refusal was last logged and how many went
	// unlogged since: a flood of them is one line a second
	lastRefusal time.Time
	unlogged    int
}

// ListenStream listens for streams on addr (host:port over TCP; port 0
// picks one). A stream comes out of Accept once its certificate and
// Hello have been checked; it is dropped when silent for
// Config.IdleTimeout. At most Config.MaxConns are held at once,
// MaxConnsPerIdentity of one identity. The listener closes when ctx
// ends or Close is called.
func ListenStream(ctx context.Context, addr string, cfg *Config) (*StreamListener, error) {
	c, err := cfg.settled()
	if err != nil {
		return nil, err
	}
	conf, err := c.serverTLS(alpnStream)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &StreamListener{cfg: c, tls: conf, ln: ln, ready: make(chan *Stream), closing: make(chan struct{}), pending: map[net.Conn]time.Time{}, perID: map[string]int{}}
	l.wg.Go(l.acceptLoop)
	go func() {
		select {
		case <-ctx.Done():
			l.Close()
		case <-l.closing:
		}
	}()
	c.warnInsecure("listen stream")
	return l, nil
}

// Addr is the address the listener is bound to.
func (l *StreamListener) Addr() net.Addr { return l.ln.Addr() }

// Stats are the listener's counters.
func (l *StreamListener) Stats() *Stats { return l.cfg.Stats }

// Accept returns the next stream that connected and passed the checks;
// after Close, an error matching net.ErrClosed.
func (l *StreamListener) Accept(ctx context.Context) (*Stream, error) {
	select {
	case s := <-l.ready:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closing:
		return nil, fmt.Errorf("wire: stream listener closed: %w", net.ErrClosed)
	}
}

// Close stops accepting and ends the handshakes in progress; streams
// accepted go on until closed.
func (l *StreamListener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		l.ln.Close()
		l.mu.Lock()
		for c := range l.pending {
			c.Close()
		}
		l.mu.Unlock()
	})
	l.wg.Wait()
	return nil
}

// refused logs a refusal, at most one line a second with the count of
// those left out since.
func (l *StreamListener) refused(remote net.Addr, err error) {
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.lastRefusal) < time.Second {
		l.unlogged++
		l.mu.Unlock()
		return
	}
	more := l.unlogged
	l.lastRefusal, l.unlogged = now, 0
	l.mu.Unlock()
	l.cfg.Log.Warn().Err(err).Str("node", l.cfg.Name).Stringer("remote", remote).Int("refused_unlogged", more).Msg("wire: refused a stream")
}

func (l *StreamListener) acceptLoop() {
	for {
		raw, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: not a busy loop
			continue
		}
		l.mu.Lock()
		if len(l.pending) >= maxPendingStreams { // the oldest makes room
			var oldest net.Conn
			for c, t := range l.pending {
				if oldest == nil || t.Before(l.pending[oldest]) {
					oldest = c
				}
			}
			delete(l.pending, oldest)
			oldest.Close()
		}
		l.pending[raw] = time.Now()
		l.mu.Unlock()
		l.wg.Go(func() { l.handshake(raw) })
	}
}

// handshake runs TLS and the Hello exchange with a new connection and
// queues the stream for Accept.
func (l *StreamListener) handshake(raw net.Conn) {
	unpend := func() {
		l.mu.Lock()
		delete(l.pending, raw)
		l.mu.Unlock()
	}
	// TLS and the Hello together within HandshakeTimeout, however slowly
	// their bytes come
	idle := newIdleConn(raw, l.cfg.HandshakeTimeout, time.Now().Add(l.cfg.HandshakeTimeout))
	conn := tls.Server(idle, l.tls)
	if err := conn.Handshake(); err != nil { // a refused certificate is logged by serverTLS
		raw.Close()
		unpend()
		return
	}
	s := newStream(conn, idle, l.cfg, streamRequestBytes)
	var key string // the identity's, once it holds a place
	err := s.helloExchange(false, "", streamRequestBytes, func(id Identity) error {
		k := string(id.Role) + "/" + id.Name
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case l.conns >= l.cfg.MaxConns:
			return connErrorf(codeTooMany, nil, "this node holds %d streams already (MaxConns)", l.conns)
		case l.perID[k] >= l.cfg.MaxConnsPerIdentity:
			return connErrorf(codeTooMany, nil, "%q holds %d streams to this node already (MaxConnsPerIdentity)", k, l.perID[k])
		}
		l.conns++
		l.perID[k]++
		key = k
		return nil
	})
	release := func() {
		l.mu.Lock()
		l.conns--
		if l.perID[key]--; l.perID[key] == 0 {
			delete(l.perID, key)
		}
		l.mu.Unlock()
	}
	unpend()
	if err != nil {
		if key != "" { // its answer failed: the place goes back, before the dialer hears
			release()
		}
		var ce *ConnError
		if errors.As(err, &ce) && !ce.Remote {
			if ce.Code == CodeIdentity || ce.Code == codeTooMany {
				l.cfg.Stats.Refused.Add(1)
			} else {
				l.cfg.Stats.countError(ce.Code)
			}
			s.closeFor(ce) // a dialer is told why it was refused
		}
		l.refused(raw.RemoteAddr(), err)
		raw.Close()
		return
	}
	idle.until = time.Time{} // (nothing else uses it before Accept)
	idle.setIdle(streamIdle(l.cfg))
	s.release = release
	l.cfg.Stats.PeersAccepted.Add(1)
	s.log.Info().Stringer("role", roleStringer(s.id.Role)).Msg("wire: stream connected")
	select {
	case l.ready <- s:
	case <-l.closing:
		s.Close()
	}
}
