package wire

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseNodes(t *testing.T) {
	cases := []struct {
		in   string
		want []NodeSpec
		err  string
	}{
		{"main,shadow,w1,w12", []NodeSpec{{"main", RoleMain, []string{}}, {"shadow", RoleShadow, []string{}}, {"w1", RoleWorker, []string{}}, {"w12", RoleWorker, []string{}}}, ""},
		{" worker-a , gpu0=worker ,edge=main", []NodeSpec{{"worker-a", RoleWorker, []string{}}, {"gpu0", RoleWorker, []string{}}, {"edge", RoleMain, []string{}}}, ""},
		{"w3@10.0.0.13@w3.lan", []NodeSpec{{"w3", RoleWorker, []string{"10.0.0.13", "w3.lan"}}}, ""},
		{"main,,w1,", []NodeSpec{{"main", RoleMain, []string{}}, {"w1", RoleWorker, []string{}}}, ""},
		{"", nil, "no nodes"},
		{"gpu0", nil, "cannot infer its role"},
		{"wx", nil, "cannot infer its role"},
		{"w1=boss", nil, "unknown role"},
		{"main,main", nil, "listed twice"},
		{"ca", nil, "a name is"},
		{"../etc", nil, "a name is"},
		{"-w", nil, "a name is"},
		{"w1@", nil, "bad host"},
	}
	for _, tc := range cases {
		got, err := ParseNodes(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseNodes(%q) error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseNodes(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestWriteCertsThenLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	nodes, _ := ParseNodes("main,w1@127.0.0.1")
	written, err := WriteCerts(dir, nodes, CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 6 {
		t.Fatalf("wrote %v", written)
	}
	for _, f := range []string{"ca-key.pem", "main-key.pem", "w1-key.pem"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, fi.Mode())
		}
	}
	w1, err := LoadCerts(dir, "w1")
	if err != nil {
		t.Fatal(err)
	}
	if w1.Identity != (Identity{"w1", RoleWorker}) {
		t.Fatalf("identity %v", w1.Identity)
	}
	leaf, _ := x509.ParseCertificate(w1.cert.Certificate[0])
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].IsLoopback() || leaf.DNSNames[0] != "w1" || leaf.Subject.OrganizationalUnit[0] != "worker" {
		t.Errorf("SANs %v %v, OU %v", leaf.IPAddresses, leaf.DNSNames, leaf.Subject.OrganizationalUnit)
	}

	// Existing files are kept unless forced; adding a node reuses the CA.
	if _, err := WriteCerts(dir, nodes[:1], CertOptions{}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("overwrote main's certificate: %v", err)
	}
	ca1, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	more, _ := ParseNodes("w2")
	if written, err := WriteCerts(dir, more, CertOptions{}); err != nil || len(written) != 2 {
		t.Fatalf("adding w2: %v %v", written, err)
	}
	ca2, _ := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if string(ca1) != string(ca2) {
		t.Fatal("adding a node replaced the CA")
	}
	if _, err := LoadCerts(dir, "w2"); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteCerts(dir, nodes[:1], CertOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
}

func TestLoadCertsRefusesMismatches(t *testing.T) {
	a := testCluster(t, "a")
	b := testCluster(t, "b")
	dir := t.TempDir()
	copyFile := func(from, to string) {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(filepath.Join(a, "ca.pem"), "ca.pem")
	copyFile(filepath.Join(b, "w1.pem"), "w1.pem")
	copyFile(filepath.Join(b, "w1-key.pem"), "w1-key.pem")
	copyFile(filepath.Join(a, "w2.pem"), "w9.pem")
	copyFile(filepath.Join(a, "w2-key.pem"), "w9-key.pem")
	copyFile(filepath.Join(a, "w2.pem"), "w3.pem")
	copyFile(filepath.Join(a, "w1-key.pem"), "w3-key.pem")
	cases := map[string]string{
		"w1": "not signed by this cluster's CA",
		"w9": `certificate of node "w2"`,
		"w3": "private key does not match",
		"w4": "no such file",
	}
	for name, want := range cases {
		if _, err := LoadCerts(dir, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadCerts(%s): %v, want %q", name, err, want)
		}
	}
	if _, err := LoadCerts(t.TempDir(), "w1"); err == nil {
		t.Error("loaded certificates from an empty directory")
	}
}

func TestCertificateWithoutIdentityIsRefused(t *testing.T) {
	cert, err := selfSigned()
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	if _, err := identityOf(leaf); err == nil {
		t.Fatal("a certificate without an odmoe identity has one")
	}
	block := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(block)
	if _, err := verifyChain(pool, cert.Certificate, x509.ExtKeyUsageServerAuth); err == nil {
		t.Fatal("verified a certificate without an identity")
	}
}

func TestInferRole(t *testing.T) {
	for name, want := range map[string]Role{"main": RoleMain, "shadow": RoleShadow, "w1": RoleWorker, "w42": RoleWorker, "worker": RoleWorker, "worker-7": RoleWorker, "stage": RoleMain, "stage2": RoleMain, "shadow3": RoleShadow, "w": "", "wa": "", "gpu": "", "mainx": "", "stagex": ""} {
		got, ok := InferRole(name)
		if got != want || ok != (want != "") {
			t.Errorf("InferRole(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
}
