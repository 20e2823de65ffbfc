// Package wire carries odmoe's messages between the nodes of a swarm:
// QUIC connections (quic-go) with mutual TLS 1.3, a small versioned set
// of msgpack messages, length-prefixed framing, and cluster membership
// by certificate. It owns how bytes get from one node to another and who
// may send them; it does not own what the messages mean or when to send
// them (the roles do), nor the expert store's chunk format (store does).
//
// # Connections
//
// Listen and Dial give a *Peer: one long-lived QUIC connection per pair
// of nodes, symmetric once established. Dial retries with backoff while
// the other node is not up yet and gives up at once on a refusal. Each
// side opens one control stream for the connection's lifetime, with the
// highest send priority, for the small latency-critical messages
// (Prediction, Activation, ExpertResult, Heartbeat, Error, StatsRequest,
// WorkerStats, ShadowDone, SequenceEnd,
// a Trace request); every bulk message (Alignment, a Trace
// carrying events, an Activation or ExpertResult over 256 KiB: a prefill
// batch) gets a stream of its own,
// so a 4 MiB transfer never holds up a 16 KiB hidden state. Keep-alives
// and the idle timeout are configurable: a peer that vanishes is seen
// (ErrTimeout) within Config.IdleTimeout; Close ends a connection
// cleanly on both sides (ErrClosed).
//
// # Membership
//
// `odmoe certs` (WriteCerts) makes a cluster CA and, per node, an ECDSA
// P-256 certificate whose URI SAN odmoe://role/ROLE/name/NAME says who
// the node is. Both ends of every connection present their certificate
// and check the other's against the cluster CA and against
// Config.PeerRoles (and, dialing, Config.PeerName): a node of another
// cluster, or in the wrong role, is refused in the TLS handshake,
// counted (Stats.Refused) and logged. Then both send a Hello that must
// match their certificate. Config.Insecure skips certificates for quick
// local experiments, loudly.
//
// # Frames and messages
//
// A frame is a big-endian uint32 length, a protocol version byte
// (ProtocolVersion), a message Type byte and a msgpack array of the
// message's fields. Tensors travel as raw little-endian bytes with their
// dtype and shape, never as msgpack arrays of floats: for a 4 MiB float32
// tensor that is 25% fewer bytes, about 100 times faster to encode and
// 10-30 times faster to decode (docs/BENCHMARKS.md, "wire"). Bulk
// messages decode without copying their payload out of the frame.
//
// Input from a peer is never trusted: a frame over Config.MaxFrameBytes,
// a body that is not exactly one well-formed msgpack value (every length
// in it is checked before msgpack may allocate for it), an unknown type
// or version, or a tensor whose bytes do not match its shape closes that
// connection with a typed error (*ConnError, matched with errors.Is
// against ErrFrameTooLarge, ErrMalformed, ErrUnknownType, ErrBadVersion,
// ErrBadTensor) sent to the peer as the QUIC application error code,
// logged, and counted in Stats; the listener and every other connection
// carry on. Nor is a frame's length: a frame waits for room for its body
// in its connection's budget (Config.MaxConnBufferedBytes) and its
// listener's (MaxBufferedBytes) before the body is read, so a peer that
// claims more than it may have in flight is held back by QUIC flow
// control, and a body over 1 MiB is allocated only once its first MiB
// has arrived; the room comes back as Recv hands the message out.
//
// # Speed
//
// On loopback (2 vCPUs) a 16 KiB Activation/ExpertResult round trip has
// the p50 of quic-go by itself (~125 µs) and of a bare UDP echo of the
// same bytes in 12 MTU-sized datagrams, but about 7 times that of one
// 16 KiB loopback datagram, which no Ethernet link carries. 4 MiB
// messages move at about 0.8 of a single raw quic-go stream. Figures
// and the exact commands: docs/BENCHMARKS.md.
package wire
