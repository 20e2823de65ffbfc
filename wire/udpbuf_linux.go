package wire

import (
	"net"
	"syscall"
)

// raiseUDPBuffers asks for want bytes of receive and send buffer (forcing
// past net.core.rmem_max/wmem_max where allowed, i.e. as root) and
// returns what the kernel reports, as quic-go measures it; -1 if unknown.
func raiseUDPBuffers(conn *net.UDPConn, want int) (rcv, snd int) {
	rcv, snd = -1, -1
	_ = conn.SetReadBuffer(want)
	_ = conn.SetWriteBuffer(want)
	raw, err := conn.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF); err == nil && v < want {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, want)
		}
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF); err == nil && v < want {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, want)
		}
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF); err == nil {
			rcv = v
		}
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF); err == nil {
			snd = v
		}
	})
	return
}
