package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"

	"github.com/odmoe/odmoe/wire"
)

func runCerts(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("certs", stderr)
	out := fs.String("out", "", "directory to write the cluster CA and node certificates into (required; an existing CA there is reused)")
	nodes := fs.String("nodes", "", "comma-separated nodes NAME[=ROLE][@HOST]...; the role is inferred from main, shadow, w<N>, worker* (required)")
	force := fs.Bool("force", false, "replace existing node certificates")
	validity := fs.Duration("validity", 10*365*24*time.Hour, "how long the certificates are valid (e.g. 8760h = a year)")
	var lf runflags.Log
	lf.Register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := newLogger(lf, stderr)
	if err != nil {
		return err
	}
	if *out == "" {
		return usagef("-out is required")
	}
	if *nodes == "" {
		return usagef("-nodes is required (e.g. -nodes main,shadow,w1,w2)")
	}
	specs, err := wire.ParseNodes(*nodes)
	if err != nil {
		return usagef("-nodes: %v", err)
	}
	written, err := wire.WriteCerts(*out, specs, wire.CertOptions{Force: *force, Validity: *validity})
	for _, f := range written {
		log.Info().Str("file", f).Msg("written")
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "cluster certificates in %s; copy ca.pem and NAME.pem, NAME-key.pem to each node (keep ca-key.pem off the nodes):\n", *out)
	for _, n := range specs {
		fmt.Fprintf(stdout, "  %-10s %-7s %s %s\n", n.Name, n.Role, filepath.Join(*out, n.Name+".pem"), filepath.Join(*out, n.Name+"-key.pem"))
	}
	return nil
}

// clusterConfig returns the wire configuration of a node in role, as its
// cluster flags c say: its certificate must be for that role.
func clusterConfig(c runflags.Cluster, role wire.Role, log zerolog.Logger) (*wire.Config, error) {
	name := c.Name
	if name == "" && role != wire.RoleWorker {
		name = string(role)
	}
	switch {
	case c.Insecure && c.Certs != "":
		return nil, usagef("-insecure and -certs exclude each other")
	case name == "":
		return nil, usagef("-name is required for a %s", role)
	case c.Insecure:
		log.Warn().Str("name", name).Msg("-insecure: this node accepts and trusts any peer on the network")
		return &wire.Config{Insecure: true, Name: name, Role: role, Log: log, SendDelay: c.NetDelay}, nil
	case c.Certs == "":
		return nil, usagef("-certs DIR is required (make it with `odmoe certs`), or -insecure for a local experiment")
	}
	certs, err := wire.LoadCerts(c.Certs, name)
	if err != nil {
		return nil, err
	}
	if certs.Identity.Role != role {
		return nil, fmt.Errorf("%s's certificate is for a %s, not a %s", name, certs.Identity.Role, role)
	}
	return &wire.Config{Certs: certs, Log: log, SendDelay: c.NetDelay}, nil
}
