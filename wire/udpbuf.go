package wire

import (
	"net"
	"os"
	"sync"

	"github.com/rs/zerolog"
)

// wantUDPBuffer is the socket buffer size quic-go asks for (7 MiB):
// smaller buffers drop packets under load and cost throughput.
const wantUDPBuffer = 7 << 20

// udpBufferWarning is said at most once per process: the fix is per host.
var udpBufferWarning sync.Once

// listenUDP opens a UDP socket and raises its buffers; if the kernel
// keeps them small it says once, in log, how to raise them.
func listenUDP(network string, laddr *net.UDPAddr, log zerolog.Logger) (*net.UDPConn, error) {
	conn, err := net.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	rcv, snd := raiseUDPBuffers(conn, wantUDPBuffer)
	warnSmallUDPBuffers(rcv, snd, log)
	return conn, nil
}

// warnSmallUDPBuffers says, once per process, how to raise socket
// buffers the kernel kept below what QUIC wants (-1: unknown).
func warnSmallUDPBuffers(rcv, snd int, log zerolog.Logger) {
	if (rcv < 0 || rcv >= wantUDPBuffer) && (snd < 0 || snd >= wantUDPBuffer) {
		return
	}
	udpBufferWarning.Do(func() {
		log.Warn().Int("recv_buffer_bytes", rcv).Int("send_buffer_bytes", snd).Int("want_bytes", wantUDPBuffer).
			Msg("wire: UDP socket buffers are small, QUIC will drop packets under load. Raise them on this host (as root): " +
				"sysctl -w net.core.rmem_max=7500000 net.core.wmem_max=7500000 (and add both to /etc/sysctl.d/ to keep them)")
		// We have said it; quic-go would print the same through the
		// standard logger. This is its documented switch for that.
		if os.Getenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING") == "" {
			os.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
		}
	})
}
