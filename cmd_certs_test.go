package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"

	"github.com/odmoe/odmoe/wire"
)

func TestCertsWritesAClusterThatLoads(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	so, se, code := run(t, "", "certs", "-out", dir, "-nodes", "main,shadow,w1,w2,gpu0=worker@127.0.0.1")
	if code != 0 {
		t.Fatalf("certs exit %d: %s", code, se)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "main.pem", "main-key.pem", "shadow.pem", "shadow-key.pem", "w1.pem", "w1-key.pem", "w2.pem", "w2-key.pem", "gpu0.pem", "gpu0-key.pem"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("certs did not write %s", f)
		}
		if strings.HasSuffix(f, "-key.pem") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	if !strings.Contains(so, "gpu0") || !strings.Contains(so, "worker") {
		t.Errorf("stdout does not list the nodes:\n%s", so)
	}
	for name, role := range map[string]wire.Role{"main": wire.RoleMain, "shadow": wire.RoleShadow, "w2": wire.RoleWorker, "gpu0": wire.RoleWorker} {
		c, err := wire.LoadCerts(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Identity.Role != role {
			t.Errorf("%s has role %s, want %s", name, c.Identity.Role, role)
		}
	}

	// Adding a node later reuses the CA; re-issuing needs -force.
	if _, se, code := run(t, "", "certs", "-out", dir, "-nodes", "w3"); code != 0 {
		t.Fatalf("adding w3: exit %d: %s", code, se)
	}
	if _, se, code := run(t, "", "certs", "-out", dir, "-nodes", "w3"); code != 1 || !strings.Contains(se, "already exists") {
		t.Errorf("re-issuing w3 without -force: exit %d, %s", code, se)
	}
}

func TestCertsCommandLineErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"certs", "-nodes", "main"}, "-out is required"},
		{[]string{"certs", "-out", dir}, "-nodes is required"},
		{[]string{"certs", "-out", dir, "-nodes", "main,gpu0"}, `"gpu0": cannot infer its role`},
		{[]string{"certs", "-out", dir, "-nodes", "w1=boss"}, `unknown role "boss"`},
		{[]string{"certs", "-out", dir, "-nodes", "w1,w1"}, "listed twice"},
		{[]string{"certs", "-out", dir, "-nodes", "../x=worker"}, "a name is"},
	}
	for _, tc := range cases {
		_, se, code := run(t, "", tc.args...)
		if code != 2 || !strings.Contains(se, tc.want) {
			t.Errorf("odmoe %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, se, tc.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a refused command line wrote %d files", len(entries))
	}
}

func TestClusterFlagsMakeAWireConfigForTheRole(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	nodes, _ := wire.ParseNodes("main,w1")
	if _, err := wire.WriteCerts(dir, nodes, wire.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) runflags.Cluster {
		var cf runflags.Cluster
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		cf.Register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return cf
	}
	cfg, err := clusterConfig(parse("-certs", dir), wire.RoleMain, zerolog.Nop())
	if err != nil || cfg.Certs == nil || cfg.Certs.Identity.Name != "main" {
		t.Fatalf("main: %+v, %v", cfg, err)
	}
	if cfg, err := clusterConfig(parse("-certs", dir, "-name", "w1"), wire.RoleWorker, zerolog.Nop()); err != nil || cfg.Certs.Identity.Name != "w1" {
		t.Fatalf("w1: %v", err)
	}
	if cfg, err := clusterConfig(parse("-insecure", "-name", "w7"), wire.RoleWorker, zerolog.Nop()); err != nil || !cfg.Insecure || cfg.Name != "w7" {
		t.Fatalf("insecure: %+v, %v", cfg, err)
	}
	bad := []struct {
		args []string
		role wire.Role
		want string
	}{
		{[]string{"-certs", dir, "-name", "w1"}, wire.RoleMain, "for a worker, not a main"},
		{[]string{"-certs", dir}, wire.RoleWorker, "-name is required"},
		{[]string{"-name", "w1"}, wire.RoleWorker, "-certs DIR is required"},
		{[]string{"-certs", dir, "-insecure"}, wire.RoleMain, "exclude each other"},
		{[]string{"-certs", dir, "-name", "w9"}, wire.RoleWorker, "no such file"},
	}
	for _, tc := range bad {
		if _, err := clusterConfig(parse(tc.args...), tc.role, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v as %s: %v, want %q", tc.args, tc.role, err, tc.want)
		}
	}
}
