package testbed

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/wire"
)

const validRig = `# A hand-written rig: comments, blank lines, ssh= and flags.

m1   main    10.0.0.1                       # the main node only dials
   # an indented comment

sh   shadow  10.0.0.2:7400   -quant fp16
w2   worker  10.0.0.4:7401   ssh=alice@gw.example -device-mem 1GiB -load-bw 4GB
w1   worker  10.0.0.5:7402
`

func TestParseRigReadsNodesInFileOrder(t *testing.T) {
	r, err := ParseRig(strings.NewReader(validRig), "valid.rig")
	if err != nil {
		t.Fatal(err)
	}
	if r.Main.Name != "m1" || r.Main.Role != wire.RoleMain || r.Main.Addr != "10.0.0.1" {
		t.Errorf("Main = %+v, want m1 main 10.0.0.1", r.Main)
	}
	if r.Shadow == nil {
		t.Fatal("Shadow = nil, want sh")
	}
	if r.Shadow.Name != "sh" || r.Shadow.Role != wire.RoleShadow || r.Shadow.Addr != "10.0.0.2:7400" {
		t.Errorf("Shadow = %+v, want sh shadow 10.0.0.2:7400", *r.Shadow)
	}
	if want := []string{"-quant", "fp16"}; !slices.Equal(r.Shadow.Flags, want) {
		t.Errorf("shadow flags = %q, want %q", r.Shadow.Flags, want)
	}
	// Workers keep the file's order (w2 before w1), not a sorted one.
	if len(r.Workers) != 2 || r.Workers[0].Name != "w2" || r.Workers[1].Name != "w1" {
		t.Fatalf("Workers = %+v, want w2 then w1", r.Workers)
	}
	w2, w1 := r.Workers[0], r.Workers[1]
	for _, w := range r.Workers {
		if w.Role != wire.RoleWorker {
			t.Errorf("%s role = %q, want worker", w.Name, w.Role)
		}
	}
	if w2.SSH != "alice@gw.example" {
		t.Errorf("w2 SSH = %q, want alice@gw.example", w2.SSH)
	}
	if want := []string{"-device-mem", "1GiB", "-load-bw", "4GB"}; !slices.Equal(w2.Flags, want) {
		t.Errorf("w2 flags = %q, want %q (ssh= is not a flag; flags keep their order)", w2.Flags, want)
	}
	if len(w1.Flags) != 0 || w1.SSH != "" {
		t.Errorf("w1 = %+v, want no flags and no ssh=", w1)
	}
	if got, want := w2.SSHTarget(), "alice@gw.example"; got != want {
		t.Errorf("w2 SSHTarget = %q, want the ssh= override %q", got, want)
	}
	if got, want := w1.SSHTarget(), "10.0.0.5"; got != want {
		t.Errorf("w1 SSHTarget = %q, want its address's host %q", got, want)
	}
	if got, want := r.Main.SSHTarget(), "10.0.0.1"; got != want {
		t.Errorf("main SSHTarget = %q, want %q", got, want)
	}
	if got, want := r.WorkerAddrs(), "10.0.0.4:7401,10.0.0.5:7402"; got != want {
		t.Errorf("WorkerAddrs = %q, want %q", got, want)
	}
	var names []string
	for _, n := range r.Nodes() {
		names = append(names, n.Name)
	}
	if want := []string{"m1", "sh", "w2", "w1"}; !slices.Equal(names, want) {
		t.Errorf("Nodes = %q, want %q", names, want)
	}
	// The certificate list names each node's address host, never its ssh
	// login (w2's certificate is for 10.0.0.4, not gw.example).
	certs := r.CertNodes()
	if want := "m1=main@10.0.0.1,sh=shadow@10.0.0.2,w2=worker@10.0.0.4,w1=worker@10.0.0.5"; certs != want {
		t.Errorf("CertNodes = %q, want %q", certs, want)
	}
	// And `odmoe certs -nodes` reads it back as the same nodes.
	specs, err := wire.ParseNodes(certs)
	if err != nil {
		t.Fatalf("wire.ParseNodes(CertNodes()): %v", err)
	}
	for i, n := range r.Nodes() {
		if specs[i].Name != n.Name || specs[i].Role != n.Role || !slices.Equal(specs[i].Hosts, []string{n.Host()}) {
			t.Errorf("cert node %d = %+v, want %s %s [%s]", i, specs[i], n.Name, n.Role, n.Host())
		}
	}
}

func TestParseRigWithoutShadow(t *testing.T) {
	r, err := ParseRig(strings.NewReader("m main 127.0.0.1:9\nw worker 127.0.0.1:7401\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	if r.Shadow != nil {
		t.Errorf("Shadow = %+v, want nil", *r.Shadow)
	}
	if n := r.Nodes(); len(n) != 2 || n[0].Name != "m" || n[1].Name != "w" {
		t.Errorf("Nodes = %+v, want m, w", n)
	}
	if got, want := r.CertNodes(), "m=main@127.0.0.1,w=worker@127.0.0.1"; got != want {
		t.Errorf("CertNodes = %q, want %q", got, want)
	}
}

func TestNodeHostDropsThePort(t *testing.T) {
	for _, tc := range []struct{ addr, host string }{
		{"10.0.0.1", "10.0.0.1"},
		{"10.0.0.1:7400", "10.0.0.1"},
		{"[::1]:7400", "::1"},
		{"node-3.lan", "node-3.lan"},
		{"node-3.lan:7400", "node-3.lan"},
	} {
		if got := (Node{Addr: tc.addr}).Host(); got != tc.host {
			t.Errorf("Node{Addr: %q}.Host() = %q, want %q", tc.addr, got, tc.host)
		}
	}
}

func TestParseRigRejectsBadDescriptions(t *testing.T) {
	const head = "# test rig\nm main 10.0.0.1\n" // lines 1-2
	for _, tc := range []struct {
		name, text string
		line       int      // 0: an error about the whole file
		want       []string // substrings the error must have
	}{
		{"no main", "# only workers\nw1 worker 10.0.0.2:7400\n", 0, []string{"no main"}},
		{"empty", "# nothing\n\n", 0, []string{"no main"}},
		{"two mains", head + "w1 worker 10.0.0.2:7400\nm2 main 10.0.0.3\n", 4, []string{"second main", "m2"}},
		{"two shadows", head + "s1 shadow 10.0.0.2:7400\ns2 shadow 10.0.0.3:7400\n", 4, []string{"second shadow", "s2"}},
		{"no workers", head + "s1 shadow 10.0.0.2:7400\n", 0, []string{"no workers"}},
		{"a staged shadow beside a whole one", head + "s1 shadow 10.0.0.2:7400\ns2 shadow 10.0.0.3:7400 -layers 2-3\n", 4, []string{"second shadow", "s2", "-layers A-B"}},
		{"two first stages", head + "s1 shadow 10.0.0.2:7400 -layers 0-1\ns2 shadow 10.0.0.3:7400 -layers 0-3\n", 4, []string{"second first stage", "s2"}},
		{"stages without a first", head + "s2 shadow 10.0.0.3:7400 -layers 2-3\nw1 worker 10.0.0.4:7400\n", 0, []string{"no first stage"}},
		{"stages set by hand", head + "s1 shadow 10.0.0.2:7400 -layers 0-1 -stages 10.0.0.3:7400\n", 3, []string{"-stages", "set by the launcher"}},
		{"duplicate name", head + "w1 worker 10.0.0.2:7400\n\nw1 worker 10.0.0.3:7400\n", 5, []string{"w1", "already on line 3"}},
		{"duplicate name of main", head + "m worker 10.0.0.2:7400\n", 3, []string{"node m", "already on line 2"}},
		{"duplicate worker address", head + "w1 worker 10.0.0.2:7400\nw2 worker 10.0.0.2:7400\n", 4, []string{"10.0.0.2:7400", "already taken on line 3"}},
		{"shadow and worker share an address", head + "s shadow 10.0.0.2:7400\nw1 worker 10.0.0.2:7400\n", 4, []string{"10.0.0.2:7400", "already taken on line 3"}},
		{"worker without port", head + "w1 worker 10.0.0.2\n", 3, []string{"w1", "HOST:PORT"}},
		{"worker with port 0", head + "w1 worker 10.0.0.2:0\n", 3, []string{"w1", "fixed port"}},
		{"worker without host", head + "w1 worker :7400\n", 3, []string{"w1", "HOST:PORT"}},
		{"shadow without port", head + "s shadow 10.0.0.2\nw1 worker 10.0.0.3:7400\n", 3, []string{"shadow s", "HOST:PORT"}},
		{"unknown role", head + "w1 boss 10.0.0.2:7400\n", 3, []string{"boss", "role"}},
		{"bad node name", head + "w_1 worker 10.0.0.2:7400\n", 3, []string{"w_1"}},
		{"flag without dash", head + "w1 worker 10.0.0.2:7400 device-mem 1GiB\n", 3, []string{`"device-mem"`, "does not start with -"}},
		{"flag without dash after ssh=", head + "w1 worker 10.0.0.2:7400 ssh=u@h quant\n", 3, []string{`"quant"`, "does not start with -"}},
		{"bad cpus", head + "w1 worker 10.0.0.2:7400 cpus=3-1\n", 3, []string{"node w1", "cpus=", "backwards"}},
		{"cpus twice", head + "w1 worker 10.0.0.2:7400 cpus=1 cpus=2\n", 3, []string{"node w1", "cpus= given twice"}},
		{"flag without dash after cpus=", head + "w1 worker 10.0.0.2:7400 cpus=1 quant\n", 3, []string{`"quant"`, "does not start with -"}},
		{"too few fields", head + "w1 worker\n", 3, []string{"want NAME ROLE ADDRESS", "w1 worker"}},
		{"one field", head + "w1   # a comment\n", 3, []string{"want NAME ROLE ADDRESS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkRigError(t, tc.text, tc.line, tc.want)
		})
	}
}

// The launcher sets these flags itself; a rig description must not.
func TestParseRigRejectsLauncherFlags(t *testing.T) {
	for _, fl := range []string{"-listen 10.0.0.9:1", "-role main", "-certs /tmp/c", "-name x", "-resident 0/2",
		"-prefetch shadow", "-workers a:1", "-shadow a:1", "-model /m", "-store /s", "-dump /d", "-stats /s", "-trace /t",
		"--listen=10.0.0.9:1", "-resident=0/2"} {
		t.Run(fl, func(t *testing.T) {
			flag := strings.Fields(fl)[0]
			text := "m main 10.0.0.1\nw1 worker 10.0.0.2:7400 -device-mem 1GiB " + fl + "\n"
			checkRigError(t, text, 2, []string{flag, "set by the launcher"})
		})
	}
}

func checkRigError(t *testing.T, text string, line int, want []string) {
	t.Helper()
	r, err := ParseRig(strings.NewReader(text), "bad.rig")
	if err == nil {
		t.Fatalf("ParseRig(%q) = %+v, want an error", text, r)
	}
	msg := err.Error()
	prefix := "bad.rig: "
	if line > 0 {
		prefix = fmt.Sprintf("bad.rig:%d: ", line)
	}
	if !strings.HasPrefix(msg, prefix) {
		t.Errorf("error %q does not start with %q", msg, prefix)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not mention %q", msg, w)
		}
	}
}

// Every rig under rigs/ parses; the known ones have their documented size.
func TestShippedRigsParse(t *testing.T) {
	workers := map[string]int{"paper.rig": 8, "paper-store.rig": 8, "ci.rig": 2, "loopback.rig": 8}
	files, err := filepath.Glob(filepath.Join("rigs", "*.rig"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range workers {
		if !slices.Contains(files, filepath.Join("rigs", name)) {
			t.Errorf("rigs/%s is missing", name)
		}
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			r, err := ReadRig(path)
			if err != nil {
				t.Fatal(err)
			}
			if r.Path != path {
				t.Errorf("Path = %q, want %q", r.Path, path)
			}
			if _, err := wire.ParseNodes(r.CertNodes()); err != nil {
				t.Errorf("CertNodes %q does not parse: %v", r.CertNodes(), err)
			}
			want, known := workers[filepath.Base(path)]
			if !known {
				return
			}
			if r.Shadow == nil {
				t.Error("no shadow node: shadow mode could not run on this rig")
			}
			if len(r.Workers) != want {
				t.Errorf("%d workers, want %d", len(r.Workers), want)
			}
			if n := len(r.Nodes()); n != want+2 {
				t.Errorf("%d nodes, want %d", n, want+2)
			}
		})
	}
}

// The paper's rigs are OD-MoE's ten nodes on the emulated LAN: testbed/rig
// up 10 numbers node i as 10.77.0.(10+i), one address per node.
func TestPaperRigsUseTheEmulatedRigsAddresses(t *testing.T) {
	for _, file := range []string{"paper.rig", "paper-store.rig"} {
		r, err := ReadRig(filepath.Join("rigs", file))
		if err != nil {
			t.Fatal(err)
		}
		if r.Main.Role != wire.RoleMain || r.Shadow == nil || len(r.Workers) != 8 {
			t.Fatalf("%s: main %+v, shadow %v, %d workers; want 1 main, 1 shadow, 8 workers", file, r.Main, r.Shadow, len(r.Workers))
		}
		seen := map[string]string{}
		for _, n := range r.Nodes() {
			h := n.Host()
			if prev, ok := seen[h]; ok {
				t.Errorf("%s: %s and %s share host %s", file, prev, n.Name, h)
			}
			seen[h] = n.Name
			ip := net.ParseIP(h).To4()
			if ip == nil || ip[0] != 10 || ip[1] != 77 || ip[2] != 0 || ip[3] < 11 || ip[3] > 20 {
				t.Errorf("%s: %s is at %s, want 10.77.0.11-20", file, n.Name, h)
			}
		}
		if len(seen) != 10 {
			t.Errorf("%s: %d distinct hosts, want 10", file, len(seen))
		}
	}
}

func TestLoopbackRigStaysOnLoopback(t *testing.T) {
	r, err := ReadRig(filepath.Join("rigs", "loopback.rig"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range r.Nodes() {
		if ip := net.ParseIP(n.Host()); ip == nil || !ip.IsLoopback() {
			t.Errorf("%s is at %s, not a loopback address (-via local has no namespaces)", n.Name, n.Addr)
		}
	}
}

func TestReadRigMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.rig")
	if _, err := ReadRig(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadRig(%s) error = %v, want a not-exist error", path, err)
	}
}

// TestViaAndNetDelayFlags: the ways of starting nodes and the delay the
// nodes add are read, and a bad one is refused naming the flag.
func TestViaAndNetDelayFlags(t *testing.T) {
	for _, c := range []struct {
		via, dir string
		flag     string // the flag a refusal names; "": none
	}{{"netns", "", ""}, {"local", "", ""}, {"ssh", "/opt/odmoe", ""}, {"ssh", "odmoe", "-remote-dir"}, {"lan", "", "-via"}} {
		err := CheckVia(c.via, c.dir)
		if (err == nil) != (c.flag == "") || err != nil && !strings.HasPrefix(err.Error(), c.flag+" ") {
			t.Errorf("CheckVia(%q, %q) = %v, want a refusal naming %q", c.via, c.dir, err, c.flag)
		}
	}
	for s, want := range map[string]time.Duration{"auto": -1, "0": 0, "1ms": time.Millisecond, "250us": 250 * time.Microsecond} {
		if d, err := ParseNetDelay(s); err != nil || d != want {
			t.Errorf("ParseNetDelay(%q) = %v, %v; want %v", s, d, err, want)
		}
	}
	if _, err := ParseNetDelay("soon"); err == nil || !strings.Contains(err.Error(), "-net-delay") {
		t.Errorf("ParseNetDelay(soon): %v, want an error naming -net-delay", err)
	}
}

// cpus= pins a node (taskset's list), with or beside ssh=, in either
// order, before the flags; it is no flag of the node's.
func TestParseRigReadsANodesCPUs(t *testing.T) {
	r, err := ParseRig(strings.NewReader(`m main 127.0.0.1 cpus=0-2
w1 worker 127.0.0.1:7401 cpus=3 ssh=u@h -device-mem 1GiB
w2 worker 127.0.0.1:7402 ssh=u@h cpus=4,6-7
w3 worker 127.0.0.1:7403
`), "cpus.rig")
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range map[*Node]string{&r.Main: "0-2", &r.Workers[0]: "3", &r.Workers[1]: "4,6-7", &r.Workers[2]: ""} {
		if n.CPUs != want {
			t.Errorf("%s CPUs = %q, want %q", n.Name, n.CPUs, want)
		}
	}
	if w1 := r.Workers[0]; w1.SSH != "u@h" || !slices.Equal(w1.Flags, []string{"-device-mem", "1GiB"}) {
		t.Errorf("w1 = %+v, want ssh u@h and its flag alone", w1)
	}
}

// TestParseRigReadsAStagedShadow: three shadow lines with -layers, in any
// order, make the first stage (from layer 0) and its stages in the order
// of their layers, whose addresses are its -stages.
func TestParseRigReadsAStagedShadow(t *testing.T) {
	r, err := ParseRig(strings.NewReader(`m main 10.0.0.1
s3 shadow 10.0.0.4:7400 -layers 6-7
s1 shadow 10.0.0.2:7400 -layers 0-3 -quant nf4
s2 shadow 10.0.0.3:7400 -layers 4-5
w1 worker 10.0.0.5:7400
`), "staged")
	if err != nil {
		t.Fatal(err)
	}
	if r.Shadow == nil || r.Shadow.Name != "s1" || len(r.ShadowStages) != 2 || r.ShadowStages[0].Name != "s2" || r.ShadowStages[1].Name != "s3" {
		t.Fatalf("first stage %v, stages %v", r.Shadow, r.ShadowStages)
	}
	if got := r.ShadowStageAddrs(); got != "10.0.0.3:7400,10.0.0.4:7400" {
		t.Fatalf("-stages %q", got)
	}
	if names := len(r.Nodes()); names != 5 {
		t.Fatalf("%d nodes", names)
	}
}

// TestParseRigReadsAMainNodesStages: stage lines, in any order, are the
// main node's stages in the order of their layers (-layers A-B or A-),
// run as `-role stage` under a main node's certificate, their addresses
// its -stages; a stage that gives no layers is refused by name.
func TestParseRigReadsAMainNodesStages(t *testing.T) {
	r, err := ParseRig(strings.NewReader(`m main 10.0.0.1
late stage 10.0.0.3:7400 -layers 4-
early stage 10.0.0.2:7400 -layers 0-3
w1 worker 10.0.0.5:7400
`), "staged")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Stages) != 2 || r.Stages[0].Name != "early" || r.Stages[1].Name != "late" || r.Shadow != nil || len(r.Workers) != 1 {
		t.Fatalf("stages %v, shadow %v, workers %v", r.Stages, r.Shadow, r.Workers)
	}
	if st := r.Stages[0]; st.RunRole() != "stage" || st.Role != wire.RoleMain || !st.Stage {
		t.Fatalf("a stage runs as %q with a %s certificate", st.RunRole(), st.Role)
	}
	if got := r.StageAddrs(); got != "10.0.0.2:7400,10.0.0.3:7400" {
		t.Fatalf("-stages %q", got)
	}
	if got := r.CertNodes(); !strings.Contains(got, "early=main@10.0.0.2") || !strings.Contains(got, "late=main@10.0.0.3") {
		t.Fatalf("certificates %q", got)
	}
	for _, bad := range []string{"s stage 10.0.0.2:7400\n", "s stage 10.0.0.2:7400 -layers 3-1\n", "s stage 10.0.0.2\n"} {
		if _, err := ParseRig(strings.NewReader("m main 10.0.0.1\nw1 worker 10.0.0.5:7400\n"+bad), "bad"); err == nil || !strings.Contains(err.Error(), "stage s") {
			t.Errorf("%q: err %v", bad, err)
		} else {
			t.Logf("%q: %v", bad, err)
		}
	}
}
