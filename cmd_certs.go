package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/odmoe/odmoe/wire"
)

func runCerts(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("certs", stderr)
	out := fs.String("out", "", "directory to write the cluster CA and node certificates into (required; an existing CA there is reused)")
	nodes := fs.String("nodes", "", "comma-separated nodes NAME[=ROLE][@HOST]...; the role is inferred from main, shadow, w<N>, worker* (required)")
	force := fs.Bool("force", false, "replace existing node certificates")
	validity := fs.Duration("validity", 10*365*24*time.Hour, "how long the certificates are valid (e.g. 8760h = a year)")
	var lf logFlags
	lf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
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

// clusterFlags are the flags with which every swarm role joins the
// cluster: -certs DIR -name NAME, or -insecure.
type clusterFlags struct {
	certs, name string
	insecure    bool
	netDelay    time.Duration
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.certs, "certs", "", "cluster certificate `DIR` made by odmoe certs (needs ca.pem, NAME.pem, NAME-key.pem)")
	fs.StringVar(&c.name, "name", "", "this node's `NAME` in the cluster (default: the role's name for main and shadow)")
	fs.DurationVar(&c.netDelay, "net-delay", 0, "delay every datagram this node sends by `D` (an emulated rig's link latency where the kernel has no netem; testbed/rig); below the timer grain (~1 ms here) it is not applied")
	fs.BoolVar(&c.insecure, "insecure", false, "no certificates: peers are NOT authenticated (quick local experiments only)")
}

// config returns the wire configuration of a node in role: its
// certificate must be for that role.
func (c *clusterFlags) config(role wire.Role, log zerolog.Logger) (*wire.Config, error) {
	name := c.name
	if name == "" && role != wire.RoleWorker {
		name = string(role)
	}
	switch {
	case c.insecure && c.certs != "":
		return nil, usagef("-insecure and -certs exclude each other")
	case name == "":
		return nil, usagef("-name is required for a %s", role)
	case c.insecure:
		log.Warn().Str("name", name).Msg("-insecure: this node accepts and trusts any peer on the network")
		return &wire.Config{Insecure: true, Name: name, Role: role, Log: log, SendDelay: c.netDelay}, nil
	case c.certs == "":
		return nil, usagef("-certs DIR is required (make it with `odmoe certs`), or -insecure for a local experiment")
	}
	certs, err := wire.LoadCerts(c.certs, name)
	if err != nil {
		return nil, err
	}
	if certs.Identity.Role != role {
		return nil, fmt.Errorf("%s's certificate is for a %s, not a %s", name, certs.Identity.Role, role)
	}
	return &wire.Config{Certs: certs, Log: log, SendDelay: c.netDelay}, nil
}
