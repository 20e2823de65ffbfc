package testbed

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/odmoe/odmoe/internal/cpuset"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/runflags"
	"github.com/odmoe/odmoe/wire"
)

// Node is one line of a rig description: a node, its role, where it
// listens and the flags its `odmoe run` gets.
type Node struct {
	Name string
	Role wire.Role
	// Addr is HOST:PORT for workers and the shadow (where they listen), and
	// HOST (or HOST:PORT, port unused) for the main node, which only dials.
	Addr string
	// SSH is where the launcher logs in for this node on a real LAN
	// (ssh=USER@HOST); default: Addr's host.
	SSH string
	// CPUs, when set (cpus=LIST, taskset's syntax: 0-2,8), are the only
	// CPUs the node's process runs on: on one machine with cores to
	// spare, each node gets cores of its own, as on a real rig.
	CPUs string
	// Flags are passed to `odmoe run -role ROLE` as they are.
	Flags []string
	// Stage says the node is one of the main node's stages (role stage
	// in the rig, `odmoe run -role stage`): a range of its layers, met by
	// the workers as the main node is (Role is main, as its certificate).
	Stage bool
}

// RunRole is the node's `odmoe run -role`.
func (n Node) RunRole() string {
	if n.Stage {
		return runflags.RoleStage
	}
	return string(n.Role)
}

// FlagsAs is the node's own flags (the rig's) parsed as those of `odmoe
// run -role role`, every other flag at its default; an error names the
// node.
func (n Node) FlagsAs(role string) (runflags.Flags, error) {
	f := runflags.For(role)
	if err := f.Parse(n.Flags); err != nil {
		return f, fmt.Errorf("node %s's flags %q: %w", n.Name, strings.Join(n.Flags, " "), err)
	}
	return f, nil
}

// Argv is the command line that runs bin with args as node n: pinned to
// its CPUs (taskset) when it has some.
func (n Node) Argv(bin string, args []string) []string {
	return cpuset.Argv(n.CPUs, append([]string{bin}, args...))
}

// Host is the node's address without the port.
func (n Node) Host() string {
	if h, _, err := net.SplitHostPort(n.Addr); err == nil {
		return h
	}
	return n.Addr
}

// addShadow adds shadow node n: the shadow, a staged shadow's first
// stage (-layers 0-B), or one of its stages (-layers A-B).
func (r *Rig) addShadow(n Node) error {
	staged := n.layers() != ""
	if r.Shadow != nil && (!staged || r.Shadow.layers() == "") {
		return fmt.Errorf("a second shadow node (%s): the shadows of a staged shadow each give -layers A-B", n.Name)
	}
	for _, s := range r.ShadowStages {
		if !staged || s.layers() == "" {
			return fmt.Errorf("a second shadow node (%s): the shadows of a staged shadow each give -layers A-B", n.Name)
		}
	}
	switch {
	case staged && firstLayer(n) < 0:
		return fmt.Errorf("node %s: -layers %q: want A-B", n.Name, n.layers())
	case staged && firstLayer(n) > 0:
		r.ShadowStages = append(r.ShadowStages, n)
	case r.Shadow != nil:
		return fmt.Errorf("a second first stage (%s): only one shadow holds layer 0", n.Name)
	default:
		r.Shadow = &n
	}
	return nil
}

// layers is n's -layers flag ("" if none).
func (n Node) layers() string {
	f, err := n.FlagsAs(n.RunRole())
	if err != nil {
		return ""
	}
	return f.Layers
}

// firstLayer is the first layer of n's -layers (-1 if it does not read).
func firstLayer(n Node) int {
	r, err := model.ReadLayerRange(n.layers())
	if err != nil {
		return -1
	}
	return r.First
}

// StageStarts are the first layers of the main node's stages and of the
// shadow's (its first stage's 0 among them; nil where the shadow is
// whole), in order, as odmoe sim takes them.
func (r *Rig) StageStarts() (stages, shadowStages []int) {
	for _, n := range r.Stages {
		stages = append(stages, firstLayer(n))
	}
	if r.Shadow != nil && len(r.ShadowStages) > 0 {
		shadowStages = []int{firstLayer(*r.Shadow)}
		for _, n := range r.ShadowStages {
			shadowStages = append(shadowStages, firstLayer(n))
		}
	}
	return stages, shadowStages
}

// SSHTarget is where to ssh for this node.
func (n Node) SSHTarget() string {
	if n.SSH != "" {
		return n.SSH
	}
	return n.Host()
}

// Rig is a parsed rig description.
type Rig struct {
	Path   string
	Main   Node
	Shadow *Node // nil: no shadow (shadow-driven mode cannot run); of a staged shadow, its first stage
	// ShadowStages are a staged shadow's later stages, in the order of
	// their layers (each shadow line with -layers not from 0)
	ShadowStages []Node
	// Stages are the main node's stages, in the order of their layers:
	// the main node then holds the layers before the first's
	Stages  []Node
	Workers []Node
}

// Nodes lists every node: main, its stages, shadow (if any) and its
// stages, workers in order.
func (r *Rig) Nodes() []Node {
	out := append([]Node{r.Main}, r.Stages...)
	if r.Shadow != nil {
		out = append(out, *r.Shadow)
	}
	out = append(out, r.ShadowStages...)
	return append(out, r.Workers...)
}

// ShadowStageAddrs is a staged shadow's -stages list, in order.
func (r *Rig) ShadowStageAddrs() string { return addrsOf(r.ShadowStages) }

// StageAddrs is the main node's -stages list, in order.
func (r *Rig) StageAddrs() string { return addrsOf(r.Stages) }

// addrsOf is nodes' addresses, comma-separated.
func addrsOf(nodes []Node) string {
	a := make([]string, len(nodes))
	for i, s := range nodes {
		a[i] = s.Addr
	}
	return strings.Join(a, ",")
}

// WorkerAddrs is the -workers list, in order.
func (r *Rig) WorkerAddrs() string {
	a := make([]string, len(r.Workers))
	for i, w := range r.Workers {
		a[i] = w.Addr
	}
	return strings.Join(a, ",")
}

// ReadRig reads a rig description file (ParseRig).
func ReadRig(path string) (*Rig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := ParseRig(f, path)
	if err != nil {
		return nil, err
	}
	r.Path = path
	return r, nil
}

// ParseRig reads a rig description: one node per line,
//
//	NAME ROLE ADDRESS [ssh=USER@HOST] [cpus=LIST] [FLAG ...]
//
// with # comments and blank lines ignored. ROLE is main, stage, shadow or
// worker; ADDRESS is HOST:PORT (HOST for the main node, which only
// dials). There must be exactly one main node, at most one shadow and at
// least one worker; names (certificate names) and listening addresses
// are unique. A stage (-layers A-B) holds a range of the main node's
// layers (the launcher gives the main node -stages, in their order).
// A staged shadow is several shadow lines, each with -layers A-B: the one
// from layer 0 is the first stage (the launcher gives it -stages), the
// others its stages.
// name names the input in errors.
func ParseRig(in io.Reader, name string) (*Rig, error) {
	r := &Rig{}
	var haveMain bool
	names, addrs := map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(in)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		errf := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", name, line, fmt.Sprintf(format, a...))
		}
		if len(f) < 3 {
			return nil, errf("want NAME ROLE ADDRESS [ssh=USER@HOST] [cpus=LIST] [FLAGS], got %q", strings.TrimSpace(text))
		}
		n := Node{Name: f[0], Addr: f[2], Stage: f[1] == runflags.RoleStage}
		role := wire.RoleMain // a stage's certificate is a main node's
		if !n.Stage {
			var err error
			if role, err = wire.ParseRole(f[1]); err != nil {
				return nil, errf("node %s: %v (or stage)", n.Name, err)
			}
		}
		n.Role = role
		if specs, err := wire.ParseNodes(n.Name + "=" + string(role)); err != nil || len(specs) != 1 || specs[0].Name != n.Name || len(specs[0].Hosts) != 0 {
			return nil, errf("node name %q: a name is 1-63 letters, digits or inner hyphens", n.Name)
		}
		rest := f[3:]
		for len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			key, val, _ := strings.Cut(rest[0], "=")
			switch {
			case key == "ssh" && n.SSH == "":
				if n.SSH = val; val == "" {
					return nil, errf("node %s: empty ssh=", n.Name)
				}
			case key == "cpus" && n.CPUs == "":
				if err := cpuset.Check(val); err != nil {
					return nil, errf("node %s: cpus=: %v", n.Name, err)
				}
				n.CPUs = val
			case key == "ssh" || key == "cpus":
				return nil, errf("node %s: %s= given twice", n.Name, key)
			default:
				return nil, errf("flag %q does not start with - (before the flags: ssh=USER@HOST, cpus=LIST)", rest[0])
			}
			rest = rest[1:]
		}
		n.Flags = rest
		if prev, ok := names[n.Name]; ok {
			return nil, errf("node %s is already on line %d", n.Name, prev)
		}
		names[n.Name] = line
		if n.Role != wire.RoleMain || n.Stage {
			host, port, err := net.SplitHostPort(n.Addr)
			if err != nil || host == "" || port == "" || port == "0" {
				return nil, errf("%s %s listens on %q: want HOST:PORT with a fixed port", n.RunRole(), n.Name, n.Addr)
			}
			if prev, ok := addrs[n.Addr]; ok {
				return nil, errf("address %s is already taken on line %d", n.Addr, prev)
			}
			addrs[n.Addr] = line
		}
		if _, err := n.FlagsAs(n.RunRole()); err != nil {
			return nil, errf("%v", err)
		}
		for _, fl := range n.Flags {
			if !strings.HasPrefix(fl, "-") {
				continue // a flag's value
			}
			switch strings.SplitN(strings.TrimLeft(fl, "-"), "=", 2)[0] {
			case "role", "listen", "certs", "name", "workers", "shadow", "model", "store", "prefetch", "resident", "dump", "stats",
				"trace", "trace-iters", "prompt", "prompt-tokens", "n", "ignore-eos", "net-delay", "align-token", "align-kv", "stages":
				return nil, errf("flag %s is set by the launcher, not the rig description", fl)
			}
		}
		switch {
		case n.Stage:
			if firstLayer(n) < 0 {
				return nil, errf("stage %s: -layers %q: want A-B, the layers it holds", n.Name, n.layers())
			}
			r.Stages = append(r.Stages, n)
		case n.Role == wire.RoleMain:
			if haveMain {
				return nil, errf("a second main node (%s)", n.Name)
			}
			r.Main, haveMain = n, true
		case n.Role == wire.RoleShadow:
			if err := r.addShadow(n); err != nil {
				return nil, errf("%v", err)
			}
		default:
			r.Workers = append(r.Workers, n)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(r.ShadowStages) > 0 && r.Shadow == nil {
		return nil, fmt.Errorf("%s: shadow stages and no first stage (a shadow with -layers 0-B)", name)
	}
	byFirstLayer := func(a, b Node) int { return cmp.Compare(firstLayer(a), firstLayer(b)) }
	slices.SortFunc(r.ShadowStages, byFirstLayer)
	slices.SortFunc(r.Stages, byFirstLayer)
	switch {
	case !haveMain:
		return nil, fmt.Errorf("%s: no main node", name)
	case len(r.Workers) == 0:
		return nil, fmt.Errorf("%s: no workers", name)
	}
	return r, nil
}

// CertNodes is the `odmoe certs -nodes` list for the rig: each node with
// its role and its host in the certificate.
func (r *Rig) CertNodes() string {
	var parts []string
	for _, n := range r.Nodes() {
		parts = append(parts, fmt.Sprintf("%s=%s@%s", n.Name, n.Role, n.Host()))
	}
	return strings.Join(parts, ",")
}
