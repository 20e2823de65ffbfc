package wire

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"
)

// Every unidirectional stream starts with its class byte. Each side opens
// one control stream first, for the connection's lifetime, which starts
// with its Hello; then one bulk stream per bulk message. So a large
// transfer never queues an urgent message behind it, in the sender's
// stream scheduler (urgency below) or at the receiver.
const (
	classControl byte = 'C'
	classBulk    byte = 'B'
)

// Stream urgencies (RFC 9218: lower is sent first).
const (
	urgencyControl = 0
	urgencyBulk    = 4
)

// urgentMaxBytes: an Activation or ExpertResult whose tensor is larger (a
// prefill batch) travels as bulk.
const urgentMaxBytes = 256 << 10

// streamCancelled is the stream error code of a bulk send abandoned
// because its context ended; the receiver drops the partial message.
const streamCancelled quic.StreamErrorCode = 1

// streamStalled is the code a receiver drops a stream with whose frame
// body did not arrive within Config.FrameBodyTimeout.
const streamStalled quic.StreamErrorCode = 2

// classOf says on which kind of stream m travels: control for small,
// latency-critical messages (hello, prediction, activation, result,
// heartbeat, error, ...), bulk for large ones.
func classOf(m Message) byte {
	switch m := m.(type) {
	case *Alignment, *Placement: // large, and ordered by their own numbers
		return classBulk
	case *FetchData: // large, and below serving traffic
		return classBulk
	case *Trace:
		if len(m.Events) > 0 {
			return classBulk
		}
	case *Activation:
		if len(m.Hidden.Data) > urgentMaxBytes {
			return classBulk
		}
	case *ExpertResult:
		if len(m.Output.Data) > urgentMaxBytes {
			return classBulk
		}
	}
	return classControl
}

// Peer is an established connection to another node: its identity is
// verified (or, with Config.Insecure, claimed) and both sides have
// exchanged Hellos. Send and Recv may be called from many goroutines.
type Peer struct {
	id      Identity
	hello   Hello
	conn    *quic.Conn
	cfg     *Config
	log     zerolog.Logger
	release func() // frees what the peer owns beyond conn; run once when it ends

	ctrlMu  sync.Mutex
	ctrl    *quic.SendStream
	ctrlEnc *frameEncoder

	ctrlIn, bulkIn chan inbound
	bufs           *peerBuffers

	wg        sync.WaitGroup
	done      chan struct{}
	errMu     sync.Mutex
	err       error
	closeOnce sync.Once
	// heard is when a frame last came from the peer (Unix nanoseconds;
	// from the connection's start): which of an identity's connections
	// has been silent longest (Listener.track)
	heard atomic.Int64
}

// newPeer wraps an established QUIC connection; start runs the Hello
// exchange.
func newPeer(conn *quic.Conn, cfg *Config, all *semaphore.Weighted, release func()) *Peer {
	p := &Peer{
		bufs:    newPeerBuffers(conn.Context(), cfg, all),
		conn:    conn,
		cfg:     cfg,
		log:     cfg.Log.With().Str("node", cfg.Name).Stringer("remote", conn.RemoteAddr()).Logger(),
		release: release,
		ctrlEnc: newFrameEncoder(keepFrameBuf),
		ctrlIn:  make(chan inbound, 256),
		bulkIn:  make(chan inbound, 16),
		done:    make(chan struct{}),
	}
	p.heard.Store(time.Now().UnixNano())
	return p
}

// Identity is the remote node's name and role.
func (p *Peer) Identity() Identity { return p.id }

// Hello is what the remote node said about itself.
func (p *Peer) Hello() Hello { return p.hello }

// RemoteAddr is the remote node's address.
func (p *Peer) RemoteAddr() net.Addr { return p.conn.RemoteAddr() }

// RTT is the smoothed round-trip time QUIC measures to the peer.
func (p *Peer) RTT() time.Duration { return p.conn.ConnectionStats().SmoothedRTT }

// Stats are the counters this peer adds to.
func (p *Peer) Stats() *Stats { return p.cfg.Stats }

// Done is closed when the connection has ended; Err then says why.
func (p *Peer) Done() <-chan struct{} { return p.done }

// Err is why the connection ended (nil while it is up): ErrClosed after
// a clean close by either side, ErrTimeout for a vanished peer, or the
// *ConnError of a protocol error detected by either side.
func (p *Peer) Err() error {
	select {
	case <-p.done:
	default:
		return nil
	}
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.err
}

// Send sends m to the peer: on the control stream, in order with the
// other control messages, or, for bulk messages (chunks, alignments,
// prefill batches), on a stream of its own, so bulk messages may arrive
// in any order relative to each other and to control messages. It
// returns when the frame is handed to QUIC; m may be reused then. A
// context that ends while a control frame is half written closes the
// connection (the stream would be unusable); a bulk send is just
// abandoned.
func (p *Peer) Send(ctx context.Context, m Message) error {
	if _, ok := m.(*Hello); ok {
		return errors.New("wire: Hello is sent by Dial and Accept, not by Send")
	}
	if err := m.validate(); err != nil {
		return fmt.Errorf("wire: not sending an invalid %v: %w", m.Type(), err)
	}
	select {
	case <-p.done:
		return p.Err()
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if classOf(m) == classBulk {
		return p.sendBulk(ctx, m)
	}
	p.ctrlMu.Lock()
	defer p.ctrlMu.Unlock()
	frame, err := p.ctrlEnc.encode(m, p.cfg.MaxFrameBytes)
	if err != nil {
		return err
	}
	n, err := writeCtx(ctx, p.ctrl, frame)
	if err != nil {
		if n > 0 && n < len(frame) {
			p.fail(connErrorf(CodeInternal, err, "send of %v aborted inside its frame", m.Type()))
		}
		return p.sendError(err)
	}
	p.countSent(len(frame))
	return nil
}

var bulkEncoders = sync.Pool{New: func() any { return newFrameEncoder(keepBulkBuf) }}

func (p *Peer) sendBulk(ctx context.Context, m Message) error {
	fe := bulkEncoders.Get().(*frameEncoder)
	defer bulkEncoders.Put(fe)
	frame, err := fe.encode(m, p.cfg.MaxFrameBytes)
	if err != nil {
		return err
	}
	s, err := p.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return p.sendError(err)
	}
	s.SetPriority(urgencyBulk, true)
	if _, err = writeCtx(ctx, s, []byte{classBulk}); err == nil {
		_, err = writeCtx(ctx, s, frame)
	}
	if err != nil {
		s.CancelWrite(streamCancelled)
		return p.sendError(err)
	}
	if err := s.Close(); err != nil {
		return p.sendError(err)
	}
	p.countSent(len(frame))
	return nil
}

// sendError turns a write error into what Send returns.
func (p *Peer) sendError(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	select {
	case <-p.done:
		return p.Err()
	default:
	}
	return fromQUIC(err)
}

// writeCtx writes b to s, giving up when ctx ends.
func writeCtx(ctx context.Context, s *quic.SendStream, b []byte) (int, error) {
	if ctx.Done() == nil {
		return s.Write(b)
	}
	var mu sync.Mutex
	fired, finished := false, false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			fired = true
			s.SetWriteDeadline(time.Now())
		}
	})
	n, err := s.Write(b)
	stop()
	mu.Lock()
	finished = true
	wasFired := fired
	mu.Unlock()
	if wasFired {
		s.SetWriteDeadline(time.Time{})
		if err != nil {
			err = context.Cause(ctx)
		}
	}
	return n, err
}

// Close closes the connection cleanly (the peer sees ErrClosed) and
// waits for the peer's goroutines. Messages not yet delivered are lost.
func (p *Peer) Close() error { return p.CloseFor("") }

// CloseFor closes the connection as Close does, telling the peer why: its
// Err is ErrClosed, with why as the reason its message gives.
func (p *Peer) CloseFor(why string) error {
	p.setErr(&ConnError{Code: CodeClosed, Reason: cmp.Or(why, "closed by this side")})
	p.conn.CloseWithError(quic.ApplicationErrorCode(CodeClosed), why)
	p.wg.Wait()
	return nil
}

func (p *Peer) runRelease() {
	p.closeOnce.Do(func() {
		p.bufs.end()
		if p.release != nil {
			p.release()
		}
	})
}

// setErr records why the connection ended; the first reason wins.
func (p *Peer) setErr(err error) bool {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	if p.err != nil {
		return false
	}
	p.err = err
	return true
}

// fail closes the connection because of bad input (or a local failure),
// telling the peer why, and counts and logs it.
func (p *Peer) fail(e *ConnError) {
	if !p.setErr(e) {
		return
	}
	p.cfg.Stats.countError(e.Code)
	p.log.Error().Stringer("code", e.Code).Str("reason", e.Reason).Msg("wire: closing the connection")
	reason := e.Reason
	if len(reason) > 200 {
		reason = reason[:200]
	}
	p.conn.CloseWithError(quic.ApplicationErrorCode(e.Code), reason)
}

// watch waits for the end of the connection, says why, and frees it.
func (p *Peer) watch() {
	<-p.conn.Context().Done()
	err := fromQUIC(context.Cause(p.conn.Context()))
	if p.setErr(err) {
		var ce *ConnError
		switch {
		case errors.Is(err, ErrTimeout):
			p.cfg.Stats.PeersLost.Add(1)
			p.log.Warn().Dur("idle_timeout", p.cfg.IdleTimeout).Msg("wire: peer lost: silent past the idle timeout")
		case errors.As(err, &ce) && ce.Code == CodeClosed:
			p.log.Info().Msg("wire: peer closed the connection")
		default:
			p.log.Warn().Err(err).Msg("wire: connection ended")
		}
	}
	close(p.done)
	p.runRelease()
}

func (p *Peer) countSent(n int) {
	p.cfg.Stats.FramesSent.Add(1)
	p.cfg.Stats.BytesSent.Add(uint64(n))
}

func (p *Peer) countReceived(bodyLen int) {
	p.heard.Store(time.Now().UnixNano())
	p.cfg.Stats.FramesReceived.Add(1)
	p.cfg.Stats.BytesReceived.Add(uint64(bodyLen + frameHeaderLen))
}
