package wire

import (
	"context"
	"errors"
	"io"

	"github.com/quic-go/quic-go"
)

// Recv returns the next message from the peer. Control messages come
// before bulk messages that arrived at the same time. After the
// connection ends, messages already received are still returned, then
// Err().
func (p *Peer) Recv(ctx context.Context) (Message, error) {
	select {
	case m := <-p.ctrlIn:
		return m, nil
	default:
	}
	select {
	case m := <-p.ctrlIn:
		return m, nil
	case m := <-p.bulkIn:
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		select {
		case m := <-p.ctrlIn:
			return m, nil
		case m := <-p.bulkIn:
			return m, nil
		default:
			return nil, p.Err()
		}
	}
}

// readControl delivers the messages of the peer's control stream.
func (p *Peer) readControl(fr *frameReader, md *messageDecoder) {
	for {
		typ, body, owned, err := fr.next()
		if err != nil {
			if err == io.EOF {
				err = connErrorf(CodeProtocol, nil, "peer closed its control stream")
			}
			p.readFailed(err)
			return
		}
		if !p.deliver(p.ctrlIn, md, typ, body, owned) {
			return
		}
	}
}

// acceptBulk reads every bulk stream the peer opens.
func (p *Peer) acceptBulk() {
	for {
		s, err := p.conn.AcceptUniStream(context.Background()) // ends with the connection
		if err != nil {
			return
		}
		p.wg.Go(func() { p.readBulk(s) })
	}
}

func (p *Peer) readBulk(s *quic.ReceiveStream) {
	var class [1]byte
	if _, err := io.ReadFull(s, class[:]); err != nil {
		p.readFailed(err)
		return
	}
	if class[0] != classBulk {
		p.fail(connErrorf(CodeProtocol, nil, "stream of class %q after the control stream", class[0]))
		return
	}
	fr := &frameReader{r: s, maxBytes: p.cfg.MaxFrameBytes} // a fresh buffer per frame: messages keep it
	md := newMessageDecoder()
	for {
		typ, body, owned, err := fr.next()
		if err != nil {
			if err != io.EOF {
				p.readFailed(err)
			}
			return
		}
		if !p.deliver(p.bulkIn, md, typ, body, owned) {
			return
		}
	}
}

// deliver decodes a frame and queues the message for Recv. It reports
// whether the stream may go on.
func (p *Peer) deliver(to chan Message, md *messageDecoder, typ Type, body []byte, owned bool) bool {
	if typ == TypeHello {
		p.fail(connErrorf(CodeProtocol, nil, "a second Hello"))
		return false
	}
	m, err := md.decode(typ, body, owned)
	if err != nil {
		p.readFailed(err)
		return false
	}
	p.countReceived(len(body))
	select {
	case to <- m:
		return true
	case <-p.done:
		return false
	}
}

// readFailed handles the error that ended a stream: bad input closes the
// connection; a bulk stream the peer cancelled is dropped; anything else
// means the connection is ending anyway.
func (p *Peer) readFailed(err error) {
	var ce *ConnError
	var se *quic.StreamError
	switch {
	case errors.As(err, &ce):
		p.fail(ce)
	case errors.As(err, &se):
		p.log.Debug().Err(err).Msg("wire: peer cancelled a stream")
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		p.fail(connErrorf(CodeMalformed, err, "stream ended early"))
	}
}
