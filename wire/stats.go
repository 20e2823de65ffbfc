package wire

import "sync/atomic"

// Stats counts what a Listener and its peers, or a dialed Peer, did. All
// fields are safe for concurrent use; read them with Load or Snapshot.
type Stats struct {
	FramesSent, FramesReceived atomic.Uint64
	BytesSent, BytesReceived   atomic.Uint64 // frame bytes, headers included
	PeersAccepted, PeersDialed atomic.Uint64 // connections past the Hello exchange
	DialRetries                atomic.Uint64 // failed Dial attempts that were retried
	Refused                    atomic.Uint64 // peers refused: certificate, role, name or Hello
	PeersLost                  atomic.Uint64 // peers that went silent past the idle timeout
	BufferWaits                atomic.Uint64 // received frames that waited for buffer room (MaxConnBufferedBytes, MaxBufferedBytes)
	// FrameHeaders counts the frame headers read on bulk streams and
	// accepted (before their bodies, which may wait for room or never
	// come); BulkStreamsEnded the bulk streams whose reading ended, done,
	// cancelled by the peer or refused. Together they say what a receiver
	// has done with what a peer sent, for those who must wait for it.
	FrameHeaders, BulkStreamsEnded atomic.Uint64
	// FramesStalled are frames whose body did not arrive within
	// Config.FrameBodyTimeout: their streams were dropped.
	FramesStalled atomic.Uint64
	errors        [numCodes]atomic.Uint64
}

// Errors returns how many connections this side closed because the peer
// sent bad input with the given code (ErrFrameTooLarge, ErrMalformed, ...).
func (s *Stats) Errors(code ErrorCode) uint64 {
	if code >= numCodes {
		return 0
	}
	return s.errors[code].Load()
}

func (s *Stats) countError(code ErrorCode) {
	if code < numCodes {
		s.errors[code].Add(1)
	}
}

// StatsSnapshot is a plain copy of Stats, e.g. for a Heartbeat or a log.
type StatsSnapshot struct {
	FramesSent, FramesReceived uint64
	BytesSent, BytesReceived   uint64
	PeersAccepted, PeersDialed uint64
	DialRetries, Refused       uint64
	PeersLost                  uint64
	Errors                     map[string]uint64 // by ErrorCode.String(), only codes seen
}

// Snapshot copies the counters.
func (s *Stats) Snapshot() StatsSnapshot {
	snap := StatsSnapshot{
		FramesSent: s.FramesSent.Load(), FramesReceived: s.FramesReceived.Load(),
		BytesSent: s.BytesSent.Load(), BytesReceived: s.BytesReceived.Load(),
		PeersAccepted: s.PeersAccepted.Load(), PeersDialed: s.PeersDialed.Load(),
		DialRetries: s.DialRetries.Load(), Refused: s.Refused.Load(), PeersLost: s.PeersLost.Load(),
		Errors: map[string]uint64{},
	}
	for c := range ErrorCode(numCodes) {
		if n := s.errors[c].Load(); n > 0 {
			snap.Errors[c.String()] = n
		}
	}
	return snap
}
