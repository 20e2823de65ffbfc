//go:build !linux

package wire

import "net"

// raiseUDPBuffers asks for want bytes of receive and send buffer; outside
// Linux it cannot tell what it got (-1), and quic-go warns by itself.
func raiseUDPBuffers(conn *net.UDPConn, want int) (rcv, snd int) {
	_ = conn.SetReadBuffer(want)
	_ = conn.SetWriteBuffer(want)
	return -1, -1
}
