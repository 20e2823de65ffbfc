package wire

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// Recv returns the next message from the peer. Control messages come
// before bulk messages that arrived at the same time. After the
// connection ends, messages already received are still returned, then
// Err().
func (p *Peer) Recv(ctx context.Context) (Message, error) {
	select {
	case in := <-p.ctrlIn:
		return p.handOut(in), nil
	default:
	}
	select {
	case in := <-p.ctrlIn:
		return p.handOut(in), nil
	case in := <-p.bulkIn:
		return p.handOut(in), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		select {
		case in := <-p.ctrlIn:
			return p.handOut(in), nil
		case in := <-p.bulkIn:
			return p.handOut(in), nil
		default:
			return nil, p.Err()
		}
	}
}

// inbound is a received message waiting for Recv, with the buffer room
// its frame took.
type inbound struct {
	m Message
	n int64
}

// handOut gives back a message's buffer room as Recv hands it out.
func (p *Peer) handOut(in inbound) Message {
	p.bufs.unreserve(in.n)
	return in.m
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
	defer p.cfg.Stats.BulkStreamsEnded.Add(1)
	var class [1]byte
	if _, err := io.ReadFull(s, class[:]); err != nil {
		p.readFailed(err)
		return
	}
	if class[0] != classBulk {
		p.fail(connErrorf(CodeProtocol, nil, "stream of class %q after the control stream", class[0]))
		return
	}
	if p.cfg.bulkArrived != nil {
		p.cfg.bulkArrived()
	}
	fr := &frameReader{r: s, maxBytes: p.cfg.MaxFrameBytes, buffers: p.bufs, headers: &p.cfg.Stats.FrameHeaders, // a fresh buffer per frame: messages keep it
		bodyDeadline: func(t time.Time) { s.SetReadDeadline(t) }, bodyTimeout: p.cfg.FrameBodyTimeout}
	md := newMessageDecoder()
	for {
		typ, body, owned, err := fr.next()
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			// a body that stalls: its room is back (next gave it), the
			// stream is dropped, the connection goes on
			p.cfg.Stats.FramesStalled.Add(1)
			s.CancelRead(streamStalled)
			p.log.Warn().Dur("timeout", p.cfg.FrameBodyTimeout).Msg("wire: a frame's body stalled: its stream is dropped and its buffer room given back")
			return
		}
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
func (p *Peer) deliver(to chan inbound, md *messageDecoder, typ Type, body []byte, owned bool) bool {
	n := int64(len(body))
	if typ == typeHello {
		p.bufs.unreserve(n)
		p.fail(connErrorf(CodeProtocol, nil, "a second Hello"))
		return false
	}
	m, err := md.decode(typ, body, owned)
	if err != nil {
		p.bufs.unreserve(n)
		p.readFailed(err)
		return false
	}
	p.countReceived(len(body))
	select {
	case to <- inbound{m, n}:
		return true
	case <-p.done:
		p.bufs.unreserve(n)
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
