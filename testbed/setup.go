package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/store"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// SetupOptions say what a rig's nodes run on and how they start: what
// `odmoe bench rig` and `odmoe launch` take.
type SetupOptions struct {
	Rig   string // the rig description's file
	Model string // the model's directory
	// Store and Certs default to MODEL.store and MODEL.certs-RIGNAME,
	// made when missing.
	Store, Certs string
	Via          string // netns, local or ssh
	RemoteDir    string // ssh: the directory on every host (absolute)
	// NetDelay is what every node adds to what it sends; negative: the
	// emulated rig's delay when its kernel has no netem (ReadRigState).
	NetDelay time.Duration
	// Fetch starts the nodes on directories of their own, which they
	// fill from the main node (BenchOptions.Fetch); on this machine
	// (local, netns) in NodeFiles, default MODEL.nodes-RIGNAME.
	Fetch     bool
	NodeFiles string
}

// CheckVia refuses a way of starting nodes other than netns, local or
// ssh, and an ssh remote directory that is not absolute (login shells
// may start elsewhere).
func CheckVia(via, remoteDir string) error {
	switch via {
	case "netns", "local":
		return nil
	case "ssh":
		if !filepath.IsAbs(remoteDir) {
			return fmt.Errorf("-remote-dir %q must be absolute (login shells may start elsewhere)", remoteDir)
		}
		return nil
	}
	return fmt.Errorf("-via %q unknown: netns, local or ssh", via)
}

// ParseNetDelay reads SetupOptions.NetDelay: auto (-1: the emulated
// rig's), 0, or a duration such as 1ms.
func ParseNetDelay(s string) (time.Duration, error) {
	if s == "auto" {
		return -1, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil && s != "0" {
		return 0, fmt.Errorf("-net-delay %q: want auto or a duration such as 1ms", s)
	}
	return d, nil
}

// Setup reads the rig, makes the store and certificates if missing, and
// returns the options that say how to start the rig's nodes (Rig, Via,
// Files, NetDelay, Log).
func Setup(ctx context.Context, so SetupOptions, log zerolog.Logger) (BenchOptions, error) {
	o := BenchOptions{Log: log}
	files := &o.Files
	var err error
	if o.Rig, err = ReadRig(so.Rig); err != nil {
		return o, err
	}
	if files.Bin, err = os.Executable(); err != nil {
		return o, err
	}
	model, err := filepath.Abs(so.Model)
	if err != nil {
		return o, err
	}
	files.Model, files.Store, files.Certs = model, so.Store, so.Certs
	if files.Store == "" {
		files.Store = model + ".store"
	}
	if files.Certs == "" {
		files.Certs = model + ".certs-" + strings.TrimSuffix(filepath.Base(so.Rig), filepath.Ext(so.Rig))
	}
	if o.Fetch = so.Fetch; o.Fetch && so.Via != "ssh" {
		if o.NodeFiles = so.NodeFiles; o.NodeFiles == "" {
			o.NodeFiles = model + ".nodes-" + strings.TrimSuffix(filepath.Base(so.Rig), filepath.Ext(so.Rig))
		}
		if o.NodeFiles, err = filepath.Abs(o.NodeFiles); err != nil {
			return o, err
		}
	}
	if err := EnsureStore(ctx, files.Model, files.Store, log); err != nil {
		return o, err
	}
	if err := ensureRigCerts(files.Certs, o.Rig); err != nil {
		return o, err
	}
	if o.NetDelay = so.NetDelay; o.NetDelay < 0 {
		if o.NetDelay, err = autoDelay(so.Via, log); err != nil {
			return o, err
		}
	}
	switch so.Via {
	case "netns":
		if o.Via, err = NewNetns(*files); err != nil {
			return o, err
		}
	case "local":
		o.Via = Local{Files: *files}
	case "ssh":
		o.Via = SSH{Dir: so.RemoteDir}
	default:
		return o, fmt.Errorf("testbed: -via %q unknown: netns, local or ssh", so.Via)
	}
	return o, nil
}

// autoDelay is -net-delay auto: on the emulated rig (netns) whose kernel
// has no netem, the rig's link delay, which the nodes add themselves.
func autoDelay(via string, log zerolog.Logger) (time.Duration, error) {
	if via != "netns" {
		return 0, nil
	}
	st := ReadRigState()
	if st["delay_by"] != "app" {
		return 0, nil
	}
	d, err := time.ParseDuration(st["delay"])
	if err != nil {
		return 0, fmt.Errorf("rig state: delay %q: %w", st["delay"], err)
	}
	// decided here, once, where this process idles: a node deciding for
	// itself measures its timers while it loads (busy, so they look
	// fine), applies the delay, and then sleeps the idle grain (~1 ms
	// here, not 0.1) on every datagram: a run in two that took twice the
	// network time per token
	if g := wire.TimerGrain(); d < g/2 {
		log.Warn().Dur("delay", d).Dur("timer_grain", g).Msg("the kernel has no netem and this machine's timers cannot emulate the rig's link delay: not applied (the network path's own latency stands in for it)")
		return 0, nil
	}
	log.Info().Dur("delay", d).Msg("the kernel has no netem: nodes add the rig's link delay themselves (-net-delay)")
	return d, nil
}

// ensureRigCerts makes the rig's certificates unless every node has one.
func ensureRigCerts(dir string, rig *Rig) error {
	complete := true
	for _, n := range rig.Nodes() {
		if _, err := os.Stat(filepath.Join(dir, n.Name+".pem")); err != nil {
			complete = false
		}
	}
	if complete {
		return nil
	}
	specs, err := wire.ParseNodes(rig.CertNodes())
	if err != nil {
		return err
	}
	_, err = wire.WriteCerts(dir, specs, wire.CertOptions{Force: true})
	return err
}

// EnsureStore converts modelDir's experts into dir unless a valid store of
// that model is there already (a progress bar while it does).
func EnsureStore(ctx context.Context, modelDir, dir string, log zerolog.Logger) error {
	if ok, err := store.Current(modelDir, dir); ok || err != nil {
		return err
	}
	log.Info().Str("dir", dir).Msg("compressing the model's experts (once)")
	update, finish := progress.Reporter("store")
	defer finish()
	return store.Convert(ctx, modelDir, dir, store.ConvertOptions{Force: true, Progress: update})
}
