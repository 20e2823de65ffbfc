package wire

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/quic-go/quic-go"
)

// maxHelloBytes bounds a Hello frame: a Hello is a few names and numbers
// (a shadow's Layout: one name per worker), never near this.
const maxHelloBytes = 64 << 10

// start runs the Hello exchange and checks who the peer is (wantName:
// the name it must have, or any). The dialer speaks first and the
// listener answers only once it has accepted the dialer, so a Dial that
// returns has been accepted. On error the connection is closed and the
// caller must not use p.
func (p *Peer) start(ctx context.Context, dialer bool, wantName string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	defer cancel()
	// Whatever blocks below (a silent peer, a full window) ends with the
	// connection when the context does.
	stop := context.AfterFunc(ctx, func() {
		p.conn.CloseWithError(quic.ApplicationErrorCode(CodeProtocol), "no hello in time")
	})
	defer stop()
	err := p.sendHello(dialer)
	if err == nil {
		err = p.recvHello(ctx, wantName)
	}
	if err == nil && !dialer {
		err = p.sendHello(true)
	}
	if err != nil {
		var ce *ConnError
		if errors.As(err, &ce) && !ce.Remote {
			if ce.Code == CodeIdentity {
				p.cfg.Stats.Refused.Add(1)
			} else {
				p.cfg.Stats.countError(ce.Code)
			}
			p.setErr(ce)
			p.conn.CloseWithError(quic.ApplicationErrorCode(ce.Code), ce.Reason)
		} else {
			p.conn.CloseWithError(quic.ApplicationErrorCode(CodeProtocol), "hello exchange failed")
			if ctx.Err() != nil {
				err = fmt.Errorf("%w (%v)", ctx.Err(), fromQUIC(err))
			}
		}
		close(p.done) // watch never started; this ends a started readControl
		p.wg.Wait()
		p.runRelease()
		return fmt.Errorf("wire: hello exchange with %v: %w", p.conn.RemoteAddr(), fromQUIC(err))
	}
	p.wg.Go(p.watch)
	p.wg.Go(p.acceptBulk)
	return nil
}

// sendHello opens the control stream and, if now, sends this side's
// Hello on it.
func (p *Peer) sendHello(now bool) error {
	if p.ctrl == nil {
		ctrl, err := p.conn.OpenUniStream()
		if err != nil {
			return err
		}
		ctrl.SetPriority(urgencyControl, false)
		p.ctrl = ctrl
	}
	if !now {
		return nil
	}
	frame, err := p.ctrlEnc.encode(&p.cfg.Hello, p.cfg.MaxFrameBytes)
	if err != nil {
		return err
	}
	if _, err := p.ctrl.Write(append([]byte{classControl}, frame...)); err != nil {
		return err
	}
	p.countSent(len(frame))
	return nil
}

// recvHello reads the peer's Hello from its control stream, checks it,
// and starts reading the stream.
func (p *Peer) recvHello(ctx context.Context, wantName string) error {
	in, err := p.conn.AcceptUniStream(ctx)
	if err != nil {
		return err
	}
	var class [1]byte
	if _, err := io.ReadFull(in, class[:]); err != nil {
		return err
	}
	if class[0] != classControl {
		return connErrorf(CodeProtocol, nil, "first stream has class %q, want the control stream", class[0])
	}
	// The Hello is read before the peer is known, without buffer room
	// (Config.MaxConnBufferedBytes), so it gets a small limit of its own.
	fr := &frameReader{r: in, maxBytes: min(p.cfg.MaxFrameBytes, maxHelloBytes), reuse: true}
	typ, body, owned, err := fr.next()
	if err != nil {
		return err
	}
	fr.maxBytes = p.cfg.MaxFrameBytes
	if typ != typeHello {
		return connErrorf(CodeProtocol, nil, "first message is %v, want Hello", typ)
	}
	md := newMessageDecoder()
	m, err := md.decode(typ, body, owned)
	if err != nil {
		return err
	}
	p.countReceived(len(body))
	h := m.(*Hello)
	claimed := Identity{Name: h.Name, Role: h.Role}
	if p.cfg.Insecure {
		if err := p.cfg.acceptPeer(claimed, wantName); err != nil {
			return err
		}
		p.id = claimed
	} else {
		id, err := peerIdentity(p.conn.ConnectionState().TLS)
		if err != nil {
			return err
		}
		if claimed != id {
			return connErrorf(CodeIdentity, nil, "hello claims %v, certificate says %v", claimed, id)
		}
		if err := p.cfg.acceptPeer(id, wantName); err != nil {
			return err
		}
		p.id = id
	}
	if p.cfg.CheckHello != nil {
		if err := p.cfg.CheckHello(&p.cfg.Hello, h); err != nil {
			return connErrorf(CodeIdentity, nil, "%s refuses %s: %v", p.cfg.Hello.Name, p.id.Name, err)
		}
	}
	p.hello = *h
	p.log = p.log.With().Str("peer", p.id.Name).Logger()
	fr.buffers = p.bufs
	p.wg.Go(func() { p.readControl(fr, md) })
	return nil
}

// SameModel is a CheckHello that refuses a peer whose Hello names another
// model than this node's (Hello.Model). With strict, a peer that names
// none is refused too; otherwise it is let through (it is checked from its
// side).
func SameModel(strict bool) func(self, peer *Hello) error {
	return func(self, peer *Hello) error {
		switch {
		case peer.Model == self.Model, peer.Model == "" && !strict:
			return nil
		case peer.Model == "":
			return fmt.Errorf("%s (%s) does not say which model it serves; %s serves %s", peer.Name, peer.Role, self.Name, short(self.Model))
		}
		return fmt.Errorf("%s (%s) serves model %s, %s (%s) model %s: they come from different checkpoints (a worker's store must be converted from the main node's model)",
			peer.Name, peer.Role, short(peer.Model), self.Name, self.Role, short(self.Model))
	}
}

// short is the first 12 hex digits of a model identity, as logs show it.
func short(id string) string { return id[:min(12, len(id))] }
