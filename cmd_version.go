package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/wire"
)

// buildCommit is the tree's commit when the build has no VCS stamp
// (GOFLAGS=-buildvcs=false, or a build outside git): make build sets it
// with -ldflags -X, from git describe.
var buildCommit = "unknown (built without a VCS stamp: make build records the commit)"

// runVersion prints what this binary is: its module version and commit
// (from the Go build info), the Go toolchain, the platform, the wire
// protocol it speaks and the kernel path it picks on this machine (as
// run picks it: ODMOE_KERNELS naming a path this CPU lacks is refused).
func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := kernels.SetPath(""); err != nil { // ODMOE_KERNELS as run reads it: a path this CPU lacks is refused alike
		return usagef("%v", err)
	}
	version, commit, modified := "(devel)", buildCommit, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = " (modified)"
				}
			}
		}
	}
	fmt.Fprintf(stdout, "odmoe %s\ncommit %s%s\n%s %s/%s\nwire protocol %d\nkernels %s (of %v), %d threads\n",
		version, commit, modified, runtime.Version(), runtime.GOOS, runtime.GOARCH, wire.ProtocolVersion, kernels.Path(), kernels.Paths(), kernels.Threads())
	return nil
}
