// Package rogue is a peer that holds a valid cluster certificate and
// misbehaves: it speaks the wire protocol's bytes itself, not through
// package wire, so that it may send what wire never would (frames that
// claim more than they send, bodies that stall, connections by the
// dozen). The hostile-peer tests and benchmarks attack workers with it;
// nothing else may import it.
package rogue

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"path/filepath"

	"github.com/odmoe/odmoe/wire"
	"github.com/quic-go/quic-go"
	"github.com/vmihailenco/msgpack/v5"
)

// Conn is a connection to a node, past the Hello exchange.
type Conn struct {
	c *quic.Conn
}

// Dial connects to addr with node name's certificate from certDir (its
// NAME.pem and NAME-key.pem), sends its Hello and waits for the node's:
// the node accepted it.
func Dial(ctx context.Context, addr, certDir, name string) (*Conn, error) {
	certs, err := wire.LoadCerts(certDir, name) // the role its certificate names
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, name+".pem"), filepath.Join(certDir, name+"-key.pem"))
	if err != nil {
		return nil, err
	}
	role := certs.Identity.Role
	conf := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"odmoe"}, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}
	c, err := quic.DialAddr(ctx, addr, conf, &quic.Config{})
	if err != nil {
		return nil, err
	}
	if err := hello(ctx, c, name, role); err != nil {
		c.CloseWithError(0, "")
		return nil, fmt.Errorf("rogue: %s to %s: %w", name, addr, err)
	}
	return &Conn{c: c}, nil
}

// hello sends name's Hello on a control stream and reads the first frame
// header of the node's.
func hello(ctx context.Context, c *quic.Conn, name string, role wire.Role) error {
	b, err := msgpack.Marshal(&wire.Hello{Name: name, Role: role})
	if err != nil {
		return err
	}
	ctrl, err := c.OpenUniStreamSync(ctx)
	if err != nil {
		return err
	}
	if _, err := ctrl.Write(append(append([]byte{'C'}, FrameHeader((&wire.Hello{}).Type(), len(b))...), b...)); err != nil {
		return err
	}
	in, err := c.AcceptUniStream(ctx) // the node's control stream: it accepted us
	if err != nil {
		return err
	}
	var first [7]byte // class and frame header
	if _, err := io.ReadFull(in, first[:]); err != nil {
		return fmt.Errorf("no Hello from the node: %w", err)
	}
	return nil
}

// Claim opens a bulk stream whose frame header claims size bytes of an
// Alignment, and sends send bytes of that body (zeros). The stream stays
// open: the caller holds it, cancels it (CancelWrite) or lets Close end
// it.
func (r *Conn) Claim(ctx context.Context, size, send int) (*quic.SendStream, error) {
	s, err := r.c.OpenUniStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("rogue: opening a stream: %w", err)
	}
	if d, ok := ctx.Deadline(); ok { // a body the node does not read blocks Write
		s.SetWriteDeadline(d)
	}
	b := append([]byte{'B'}, FrameHeader((&wire.Alignment{}).Type(), size)...)
	if _, err := s.Write(b); err != nil {
		return nil, err
	}
	zeros := make([]byte, min(send, 1<<20))
	for left := send; left > 0; left -= len(zeros) {
		if _, err := s.Write(zeros[:min(left, len(zeros))]); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Context ends when the connection does (the node closed it, or Close).
func (r *Conn) Context() context.Context { return r.c.Context() }

// Close closes the connection.
func (r *Conn) Close() error { return r.c.CloseWithError(0, "") }

// FrameHeader is the header of a frame of typ with a body of size bytes
// (package wire's: length, protocol version, type).
func FrameHeader(typ wire.Type, size int) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(size+2)), wire.ProtocolVersion, byte(typ))
}
