package wire

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"sync"
)

// alpn is the TLS application protocol of odmoe connections. The protocol
// version is checked per frame instead, so that a mismatch gets a clear
// error (ErrBadVersion) rather than a failed handshake.
const alpn = "odmoe"

// serverTLS returns the TLS configuration of a listener speaking proto
// (alpn or alpnStream): with Certs it requires a client certificate of
// the cluster CA carrying an accepted role; refusals are counted and
// logged with the remote address.
func (c *Config) serverTLS(proto string) (*tls.Config, error) {
	if c.Insecure {
		cert, err := selfSigned()
		if err != nil {
			return nil, err
		}
		return &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{proto}, Certificates: []tls.Certificate{cert}}, nil
	}
	base := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{proto},
		Certificates: []tls.Certificate{c.Certs.cert},
		ClientAuth:   tls.RequireAnyClientCert, // verified below, against the cluster CA only
	}
	conf := base.Clone()
	conf.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		var remote net.Addr
		if hello.Conn != nil { // quic-go fills in a Conn that knows the addresses
			remote = hello.Conn.RemoteAddr()
		}
		per := base.Clone()
		per.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			id, err := verifyChain(c.Certs.pool, raw, x509.ExtKeyUsageClientAuth)
			if err == nil {
				err = c.acceptPeer(id, "")
			}
			if err != nil {
				c.Stats.Refused.Add(1)
				ev := c.Log.Warn().Err(err).Str("node", c.Name)
				if remote != nil {
					ev = ev.Stringer("remote", remote)
				}
				ev.Msg("wire: refused a connecting peer")
			}
			return err
		}
		return per, nil
	}
	return conf, nil
}

// clientTLS returns the TLS configuration of one dial attempt. The
// server's certificate is checked against the cluster CA, PeerRoles and
// PeerName, not against the address dialed: nodes are named by their
// certificates, not by DNS. A refusal is stored in refused.
func (c *Config) clientTLS(proto string, refused *errBox) *tls.Config {
	conf := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		NextProtos:         []string{proto},
		ServerName:         "odmoe",
		InsecureSkipVerify: true, // replaced by VerifyPeerCertificate below (or none: Insecure)
	}
	if c.Insecure {
		return conf
	}
	conf.Certificates = []tls.Certificate{c.Certs.cert}
	conf.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		id, err := verifyChain(c.Certs.pool, raw, x509.ExtKeyUsageServerAuth)
		if err == nil {
			err = c.acceptPeer(id, c.PeerName)
		}
		refused.set(err)
		return err
	}
	return conf
}

// peerIdentity reads the verified identity of a connection's peer.
func peerIdentity(state tls.ConnectionState) (Identity, error) {
	if len(state.PeerCertificates) == 0 {
		return Identity{}, connErrorf(CodeIdentity, nil, "peer presented no certificate")
	}
	return identityOf(state.PeerCertificates[0])
}

// errBox holds an error set on one goroutine and read on another.
type errBox struct {
	mu  sync.Mutex
	err error
}

func (b *errBox) set(err error) {
	b.mu.Lock()
	b.err = err
	b.mu.Unlock()
}

func (b *errBox) get() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}
