package runflags

import (
	"flag"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestArgsParseBackToTheSameFlags: a worker's and a main node's flags,
// rendered by Args and parsed by the command's own flag set, come back
// field for field; a flag left at its default is not rendered.
func TestArgsParseBackToTheSameFlags(t *testing.T) {
	w := For(RoleWorker)
	w.Listen, w.Store, w.DeviceMem, w.LoadBW, w.HostPreload, w.HostCache = "127.0.0.1:9", "/s", "8MiB", "4GB", true, "1GiB"
	w.Cluster.Certs, w.Cluster.Name, w.Log.Level = "/c", "w3", "warn"
	m := For(RoleMain)
	m.Prompt, m.N, m.Workers, m.AlignToken, m.DialTimeout, m.Temperature = "a b, c", 7, "x:1,y:2", 0, 10*time.Minute, 0.5
	for _, f := range []Flags{w, m} {
		args := f.Args()
		if args[0] != "run" || args[1] != "-role="+f.Role {
			t.Fatalf("%v: want run and the role first", args)
		}
		var got Flags
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		got.Register(fs)
		if err := fs.Parse(args[1:]); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("%v parsed back to %+v, want %+v", args, got, f)
		}
	}
	if got := For(RoleShadow).Args(); !slices.Equal(got, []string{"run", "-role=shadow"}) {
		t.Errorf("a shadow at every default renders %v, want only its role", got)
	}
}

// TestParseSetsARigsFlags: flags given as a command line would take
// them land in the typed fields, the last of a flag counting; a word
// that is not a flag, or an unknown flag, is refused.
func TestParseSetsARigsFlags(t *testing.T) {
	f := For(RoleWorker)
	if err := f.Parse([]string{"-device-mem", "2GiB", "-load-bw=1GB", "-host-preload", "-device-mem", "3GiB"}); err != nil {
		t.Fatal(err)
	}
	if f.DeviceMem != "3GiB" || f.LoadBW != "1GB" || !f.HostPreload || f.Role != RoleWorker || f.Listen != "127.0.0.1:7400" {
		t.Fatalf("parsed %+v", f)
	}
	for _, bad := range [][]string{{"-no-such-flag"}, {"-device-mem", "1GiB", "stray"}} {
		g := For(RoleWorker)
		if err := g.Parse(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
