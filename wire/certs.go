package wire

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Cluster certificate files in a certificate directory (odmoe certs -out).
const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca-key.pem"
)

// identityScheme is the URI SAN that carries a node's identity:
// odmoe://role/ROLE/name/NAME.
const identityScheme = "odmoe"

// NodeSpec is a node to issue a certificate for.
type NodeSpec struct {
	Name  string
	Role  Role
	Hosts []string // extra DNS names or IP addresses for the certificate
}

// ParseNodes parses a comma-separated node list such as
// "main,shadow,w1,w2,gpu0=worker,w3@10.0.0.13". Each entry is
// NAME[=ROLE][@HOST]...: without =ROLE the role is inferred from the name
// (InferRole); each @HOST adds a DNS name or IP address to the certificate.
func ParseNodes(s string) ([]NodeSpec, error) {
	var nodes []NodeSpec
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, "@")
		name, roleStr, explicit := strings.Cut(parts[0], "=")
		if !validName(name) {
			return nil, fmt.Errorf("wire: node %q: a name is 1-63 letters, digits or inner hyphens (and not \"ca\")", name)
		}
		var role Role
		if explicit {
			r, err := ParseRole(roleStr)
			if err != nil {
				return nil, fmt.Errorf("wire: node %q: %w", name, err)
			}
			role = r
		} else if r, ok := InferRole(name); ok {
			role = r
		} else {
			return nil, fmt.Errorf("wire: node %q: cannot infer its role from the name; write %s=main, %s=shadow or %s=worker", name, name, name, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("wire: node %q is listed twice", name)
		}
		seen[name] = true
		for _, h := range parts[1:] {
			if h == "" || strings.ContainsAny(h, " /=") {
				return nil, fmt.Errorf("wire: node %q: bad host %q", name, h)
			}
		}
		nodes = append(nodes, NodeSpec{Name: name, Role: role, Hosts: parts[1:]})
	}
	if len(nodes) == 0 {
		return nil, errors.New("wire: no nodes listed")
	}
	return nodes, nil
}

// CertOptions tune WriteCerts.
type CertOptions struct {
	// Force overwrites existing node certificates. An existing CA is
	// always reused (so that nodes can be added to a running cluster).
	Force bool
	// Validity is how long the certificates are valid; 0 means 10 years.
	Validity time.Duration
}

// WriteCerts makes dir a cluster certificate directory: a cluster CA
// (ca.pem, ca-key.pem), reused if dir already has one, and for each node
// NAME.pem and NAME-key.pem, an ECDSA P-256 key pair whose certificate
// carries the node's name and role. A node needs ca.pem and its own pair;
// ca-key.pem stays with whoever adds nodes. Nothing is written if any
// node's files exist and o.Force is false. It returns the files written.
func WriteCerts(dir string, nodes []NodeSpec, o CertOptions) ([]string, error) {
	if len(nodes) == 0 {
		return nil, errors.New("wire: no nodes to issue certificates for")
	}
	for _, n := range nodes {
		if !validName(n.Name) || !n.Role.Valid() {
			return nil, fmt.Errorf("wire: bad node %q role %q", n.Name, n.Role)
		}
		if !o.Force {
			for _, f := range []string{n.Name + ".pem", n.Name + "-key.pem"} {
				if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
					return nil, fmt.Errorf("wire: %s already exists (use -force to replace it)", filepath.Join(dir, f))
				}
			}
		}
	}
	validity := o.Validity
	if validity <= 0 {
		validity = 10 * 365 * 24 * time.Hour
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("wire: %w", err)
	}
	var written []string
	caCert, caKey, err := loadCA(dir)
	if errors.Is(err, os.ErrNotExist) {
		caCert, caKey, err = newCA(validity)
		if err == nil {
			err = writePEM(filepath.Join(dir, caKeyFile), "PRIVATE KEY", mustPKCS8(caKey), 0o600)
		}
		if err == nil {
			err = writePEM(filepath.Join(dir, caCertFile), "CERTIFICATE", caCert.Raw, 0o644)
		}
		if err != nil {
			return nil, err
		}
		written = append(written, filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile))
	} else if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		der, key, err := newNodeCert(n, caCert, caKey, validity)
		if err != nil {
			return written, err
		}
		keyPath, certPath := filepath.Join(dir, n.Name+"-key.pem"), filepath.Join(dir, n.Name+".pem")
		if err := writePEM(keyPath, "PRIVATE KEY", mustPKCS8(key), 0o600); err != nil {
			return written, err
		}
		if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
			return written, err
		}
		written = append(written, certPath, keyPath)
	}
	return written, nil
}

// Certs are one node's credentials: the cluster CA that every peer's
// certificate must chain to, and the node's own certificate and key.
type Certs struct {
	// Identity is the node's name and role, read from its certificate.
	Identity Identity
	cert     tls.Certificate
	pool     *x509.CertPool
}

// LoadCerts reads dir/ca.pem, dir/NAME.pem and dir/NAME-key.pem and checks
// that the certificate is the CA's and names the node NAME.
func LoadCerts(dir, name string) (*Certs, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("wire: cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("wire: %s holds no PEM certificate", filepath.Join(dir, caCertFile))
	}
	certPath, keyPath := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("wire: node %q: %w", name, err)
	}
	id, err := verifyChain(pool, pair.Certificate, x509.ExtKeyUsageAny)
	if err != nil {
		return nil, fmt.Errorf("wire: %s: %w", certPath, err)
	}
	if id.Name != name {
		return nil, fmt.Errorf("wire: %s is the certificate of node %q, not %q", certPath, id.Name, name)
	}
	return &Certs{Identity: id, cert: pair, pool: pool}, nil
}

// verifyChain checks that the leaf of rawCerts chains to pool with the
// given usage and returns the identity it carries.
func verifyChain(pool *x509.CertPool, rawCerts [][]byte, usage x509.ExtKeyUsage) (Identity, error) {
	if len(rawCerts) == 0 {
		return Identity{}, errors.New("no certificate")
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return Identity{}, fmt.Errorf("bad certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("not signed by this cluster's CA: %w", err)
	}
	return identityOf(certs[0])
}

// identityOf reads the odmoe://role/ROLE/name/NAME URI of a certificate.
func identityOf(c *x509.Certificate) (Identity, error) {
	for _, u := range c.URIs {
		if u.Scheme != identityScheme || u.Host != "role" {
			continue
		}
		p := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
		if len(p) != 3 || p[1] != "name" || !Role(p[0]).Valid() || !validName(p[2]) {
			return Identity{}, fmt.Errorf("certificate %q has a malformed identity %q", c.Subject.CommonName, u.String())
		}
		return Identity{Name: p[2], Role: Role(p[0])}, nil
	}
	return Identity{}, fmt.Errorf("certificate %q carries no odmoe identity", c.Subject.CommonName)
}

func identityURI(id Identity) *url.URL {
	return &url.URL{Scheme: identityScheme, Host: "role", Path: "/" + string(id.Role) + "/name/" + id.Name}
}

func newCA(validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("wire: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "odmoe cluster CA", Organization: []string{"odmoe"}},
		NotBefore:             now.Add(-24 * time.Hour), // edge clocks drift
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("wire: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func newNodeCert(n NodeSpec, ca *x509.Certificate, caKey *ecdsa.PrivateKey, validity time.Duration) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("wire: key for %q: %w", n.Name, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: n.Name, OrganizationalUnit: []string{string(n.Role)}, Organization: []string{"odmoe"}},
		NotBefore:    now.Add(-24 * time.Hour),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// every node both listens and dials
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{n.Name},
		URIs:        []*url.URL{identityURI(Identity{Name: n.Name, Role: n.Role})},
	}
	for _, h := range n.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	if tmpl.NotAfter.After(ca.NotAfter) {
		tmpl.NotAfter = ca.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("wire: certificate for %q: %w", n.Name, err)
	}
	return der, key, nil
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("wire: %s exists but its key cannot be read: %w", caCertFile, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("wire: cluster CA in %s: %w", dir, err)
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("wire: cluster CA key in %s is not ECDSA", dir)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, fmt.Errorf("wire: cluster CA in %s: %w", dir, err)
	}
	if !cert.IsCA {
		return nil, nil, fmt.Errorf("wire: %s is not a CA certificate", filepath.Join(dir, caCertFile))
	}
	return cert, key, nil
}

// selfSigned makes a throwaway certificate for Config.Insecure listeners:
// TLS needs one, nobody checks it.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: "odmoe insecure"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * 365 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return n
}

func mustPKCS8(key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		panic(err) // cannot fail for a P-256 key
	}
	return der
}

// writePEM writes one PEM block to a new file (replacing an old one).
func writePEM(path, typ string, der []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), perm); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("wire: %w", err)
	}
	return nil
}
