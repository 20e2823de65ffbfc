package wire

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"
)

// Defaults for the zero fields of a Config.
const (
	defaultKeepAlivePeriod  = 1 * time.Second
	defaultIdleTimeout      = 5 * time.Second
	defaultHandshakeTimeout = 5 * time.Second
	defaultDialAttempts     = 8
	defaultDialBackoff      = 100 * time.Millisecond
	defaultMaxDialBackoff   = 2 * time.Second
	defaultFrameBodyTimeout = 30 * time.Second
)

// Defaults of the roles that dial (the main node, the shadow), set by
// their flags.
const (
	// DefaultPeerTimeout is how long a silent worker or shadow is waited
	// for before it is lost (the IdleTimeout of those connections): a few
	// keep-alive periods, far below anything a user would wait out, and
	// above the pauses a loaded machine makes.
	DefaultPeerTimeout = 2 * time.Second
	// DefaultStartDialTimeout is how long they wait at start for the nodes
	// they dial to answer (their DialTimeout).
	DefaultStartDialTimeout = 30 * time.Second
)

// Flow-control windows: the most a peer may send ahead of what we read,
// per stream and per connection (bounding what a peer can make us buffer).
const (
	streamWindowBytes = 4 << 20
	connWindowBytes   = 32 << 20
)

// maxBufferedBytes bounds the buffer room settings (1 TiB): far above
// any machine's memory, far below overflowing when multiplied.
const maxBufferedBytes = 1 << 40

// maxIncomingStreams bounds the bulk streams (one per bulk message) a
// peer may have open towards us at once.
const maxIncomingStreams = 128

// Config configures Listen and Dial. A Config may be shared by several
// calls; nothing in it changes. Zero fields take the defaults above.
type Config struct {
	// Certs are this node's cluster credentials (LoadCerts). Every peer
	// must present a certificate of the same cluster CA. Required unless
	// Insecure.
	Certs *Certs
	// Insecure runs TLS without certificates: peers are not authenticated
	// and say who they are in their Hello. For quick local experiments
	// only; it logs a loud warning.
	Insecure bool
	// Name and Role are this node's identity when Insecure; with Certs
	// they are taken from the certificate (and, if set, must match it).
	Name string
	Role Role

	// PeerRoles are the roles a remote node may have; empty allows any.
	// A worker listens for main and shadow; the main node dials workers.
	PeerRoles []Role
	// PeerName, for Dial, is the name the remote node must have; empty
	// allows any name.
	PeerName string

	// Hello carries what this node tells its peers about itself
	// (version, device memory budget, features); Name and Role are
	// filled in from the identity above.
	Hello Hello
	// CheckHello, if set, vets the Hello of a peer whose identity has
	// been accepted: an error refuses the peer, and its text reaches the
	// peer too, so it should say what differs (this node's view and the
	// peer's). Dial does not retry such a refusal.
	CheckHello func(self, peer *Hello) error

	// MaxFrameBytes bounds a received (and a sent) frame; a larger one
	// closes the connection (ErrFrameTooLarge). Default 64 MiB.
	MaxFrameBytes int
	// MaxConnBufferedBytes bounds what one connection's received frames
	// hold: being read, or decoded and waiting for Recv. A frame waits
	// for room for its whole length before its body is read (QUIC flow
	// control then holds the sender back), and a body over 1 MiB is
	// allocated only once its first MiB has arrived, so a peer that claims
	// big frames stalls itself, never makes this node allocate. Default 2 x
	// MaxFrameBytes; at least MaxFrameBytes, or a largest frame could
	// never be read.
	MaxConnBufferedBytes int64
	// MaxBufferedBytes bounds the room every connection a Listener
	// accepted draws on together beyond its own ConnGuaranteedBytes (a
	// dialed connection has only its own bound), so that what all peers
	// can make a node buffer is bounded, however many certificates they
	// hold: at most MaxBufferedBytes plus ConnGuaranteedBytes for each
	// connection. Default MaxFrameBytes, the least it may be: a largest
	// frame may find its connection's own room taken by others of its
	// frames.
	MaxBufferedBytes int64
	// MaxConns bounds the connections a Listener holds at once (in the
	// Hello exchange or established; default 64), MaxConnsPerIdentity
	// those of one peer identity (default 4: a main node or shadow needs
	// one, and a few while a lost one's connection times out). A
	// connection past either is closed at once, counted as refused and
	// logged: a peer holding a valid certificate cannot pile up
	// connections (and the memory each costs).
	MaxConns, MaxConnsPerIdentity int
	// FrameBodyTimeout is how long a bulk frame's body may take to arrive
	// once its room is reserved (default 30 s: 64 MiB at 20 Mbit/s): a
	// body that stalls longer has its stream dropped and its room given
	// back, logged with the peer's name; the connection goes on.
	FrameBodyTimeout time.Duration
	// ConnGuaranteedBytes is the room of its own every accepted connection
	// has before it draws on the listener's (default 4 MiB: every decode
	// activation of a batch of 256 and every prefill mini-batch of up to
	// 256 tokens of a Mixtral-sized model), so that connections holding
	// the listener's room cannot make it wait; at most
	// MaxConnBufferedBytes.
	ConnGuaranteedBytes int64
	// KeepAlivePeriod is how often an idle connection sends a QUIC PING.
	KeepAlivePeriod time.Duration
	// IdleTimeout is how long a connection survives without hearing from
	// the peer: a vanished peer is detected (ErrTimeout) after this.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds one connection attempt: QUIC, TLS and the
	// Hello exchange.
	HandshakeTimeout time.Duration
	// DialAttempts is how many times Dial tries before giving up;
	// DialBackoff is the wait after the first failure, doubling up to
	// MaxDialBackoff. Refusals (a bad certificate, a wrong role) are not
	// retried.
	DialAttempts   int
	DialBackoff    time.Duration
	MaxDialBackoff time.Duration
	// DialTimeout, if set, bounds a whole Dial, its attempts and waits
	// included; the error then says how long and how often it tried.
	DialTimeout time.Duration

	// SendDelay delays every datagram this node sends by this much: the
	// link latency of an emulated rig whose kernel has no netem. Delays
	// under half TimerGrain cannot be emulated and are ignored (logged).
	SendDelay time.Duration

	// Log receives connection events and errors (never per-message logs).
	// The zero Logger discards them.
	Log zerolog.Logger
	// Stats, if set, counts for every Listener and Peer using this
	// Config; otherwise each Listener (with its peers) and each dialed
	// Peer has its own.
	Stats *Stats

	// bulkArrived, if set (tests), is called when a bulk stream's first
	// byte has arrived: a transfer is under way.
	bulkArrived func()
}

// settled returns a copy of c with defaults filled in, after checking it.
func (c *Config) settled() (*Config, error) {
	if c == nil {
		return nil, errors.New("wire: nil Config")
	}
	s := *c
	s.PeerRoles = slices.Clone(c.PeerRoles)
	switch {
	case s.Certs == nil && !s.Insecure:
		return nil, errors.New("wire: Config needs Certs (from LoadCerts) or Insecure")
	case s.Certs != nil && s.Insecure:
		return nil, errors.New("wire: Config has both Certs and Insecure")
	case s.Certs != nil:
		id := s.Certs.Identity
		if (s.Name != "" && s.Name != id.Name) || (s.Role != "" && s.Role != id.Role) {
			return nil, fmt.Errorf("wire: Config names %s/%s, but the certificate is %v", s.Name, s.Role, id)
		}
		s.Name, s.Role = id.Name, id.Role
	case s.Name == "" || !s.Role.Valid():
		return nil, fmt.Errorf("wire: an insecure Config needs a Name and a valid Role (have %q, %q)", s.Name, s.Role)
	}
	for _, r := range s.PeerRoles {
		if !r.Valid() {
			return nil, fmt.Errorf("wire: PeerRoles: unknown role %q", r)
		}
	}
	s.Hello.Name, s.Hello.Role = s.Name, s.Role
	if s.Hello.Arch == "" {
		s.Hello.Arch = runtime.GOARCH
	}
	setDefault(&s.MaxFrameBytes, defaultMaxFrameBytes)
	setDefault(&s.KeepAlivePeriod, defaultKeepAlivePeriod)
	setDefault(&s.IdleTimeout, defaultIdleTimeout)
	setDefault(&s.HandshakeTimeout, defaultHandshakeTimeout)
	setDefault(&s.DialAttempts, defaultDialAttempts)
	setDefault(&s.DialBackoff, defaultDialBackoff)
	setDefault(&s.MaxDialBackoff, defaultMaxDialBackoff)
	if s.MaxFrameBytes < 1<<10 || s.MaxFrameBytes > 1<<31 {
		return nil, fmt.Errorf("wire: MaxFrameBytes %d out of range [1 KiB, 2 GiB]", s.MaxFrameBytes)
	}
	setDefault(&s.FrameBodyTimeout, defaultFrameBodyTimeout)
	setDefault(&s.MaxConns, 64)
	setDefault(&s.MaxConnsPerIdentity, 4)
	setDefault(&s.MaxConnBufferedBytes, 2*int64(s.MaxFrameBytes))
	setDefault(&s.ConnGuaranteedBytes, min(4<<20, s.MaxConnBufferedBytes))
	setDefault(&s.MaxBufferedBytes, int64(s.MaxFrameBytes))
	switch {
	case s.MaxConnBufferedBytes > maxBufferedBytes || s.MaxBufferedBytes > maxBufferedBytes:
		return nil, fmt.Errorf("wire: MaxConnBufferedBytes %d or MaxBufferedBytes %d above %d", s.MaxConnBufferedBytes, s.MaxBufferedBytes, int64(maxBufferedBytes))
	case s.MaxConnBufferedBytes < int64(s.MaxFrameBytes):
		return nil, fmt.Errorf("wire: MaxConnBufferedBytes %d is below MaxFrameBytes %d: a largest frame could never be read", s.MaxConnBufferedBytes, s.MaxFrameBytes)
	case s.ConnGuaranteedBytes > s.MaxConnBufferedBytes:
		return nil, fmt.Errorf("wire: ConnGuaranteedBytes %d is above MaxConnBufferedBytes %d", s.ConnGuaranteedBytes, s.MaxConnBufferedBytes)
	case s.MaxBufferedBytes < int64(s.MaxFrameBytes):
		// a frame takes what is left of its connection's own room, maybe
		// nothing, and the rest from the pool: a largest one must fit it
		return nil, fmt.Errorf("wire: MaxBufferedBytes %d is below MaxFrameBytes %d: a largest frame could wait for the pool for ever", s.MaxBufferedBytes, s.MaxFrameBytes)
	}
	if s.Stats == nil {
		s.Stats = new(Stats)
	}
	return &s, nil
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

func (c *Config) quicConfig() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:  c.HandshakeTimeout,
		MaxIdleTimeout:        c.IdleTimeout,
		KeepAlivePeriod:       c.KeepAlivePeriod,
		MaxIncomingStreams:    -1, // the protocol uses unidirectional streams only
		MaxIncomingUniStreams: maxIncomingStreams,
		// Every bulk message opens a new stream: start its window large
		// rather than at quic-go's 512 KiB, or each one pays the
		// window's slow start again.
		InitialStreamReceiveWindow:     streamWindowBytes,
		MaxStreamReceiveWindow:         4 * streamWindowBytes,
		InitialConnectionReceiveWindow: 2 * streamWindowBytes,
		MaxConnectionReceiveWindow:     connWindowBytes,
	}
}

// acceptPeer checks a remote identity against PeerRoles and wantName.
func (c *Config) acceptPeer(id Identity, wantName string) error {
	if len(c.PeerRoles) > 0 && !slices.Contains(c.PeerRoles, id.Role) {
		return connErrorf(CodeIdentity, nil, "peer %v has role %s, want one of %v", id, id.Role, c.PeerRoles)
	}
	if wantName != "" && id.Name != wantName {
		return connErrorf(CodeIdentity, nil, "peer is %v, want node %q", id, wantName)
	}
	return nil
}

// warnInsecure says loudly that nobody is being authenticated.
func (c *Config) warnInsecure(what string) {
	if c.Insecure {
		c.Log.Warn().Str("node", c.Name).Str("what", what).
			Msg("wire: INSECURE: no certificates, peers are NOT authenticated: anyone who can reach this node can join the swarm; use -certs DIR -name NAME outside quick local experiments")
	}
}
