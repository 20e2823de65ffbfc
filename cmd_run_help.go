package main

import (
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// runRoles are run's roles, in the order its help lists them.
var runRoles = []string{"local", "main", "worker", "shadow", "stage"}

// runHelp writes run's help: a usage line, two examples, then the flags
// of each role (one role's alone when -role names it), each flag's
// text wrapped under 100 columns. A flag's usage names the roles it is
// for ("local, main: ..."); one that names none is every role's.
func runHelp(fs *flag.FlagSet, role string) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintln(w, "Usage: odmoe run -role local|main|worker|shadow|stage [flags]")
		fmt.Fprintln(w, "\nRuns one node of a swarm, or the whole model in one process (-role local).")
		fmt.Fprintln(w, "\nExamples:")
		fmt.Fprintln(w, "  odmoe run -role local -model /tmp/tiny -prompt \"Hello\" -n 32")
		fmt.Fprintln(w, "  odmoe run -role worker -listen 127.0.0.1:7401 -store /tmp/tiny.store -certs certs -name w1")
		roles := runRoles
		if slices.Contains(runRoles, role) {
			roles = []string{role}
		}
		var common []*flag.Flag
		byRole := map[string][]*flag.Flag{}
		fs.VisitAll(func(f *flag.Flag) {
			named := flagRoles(f.Usage)
			if len(named) == 0 {
				common = append(common, f)
			}
			for _, r := range named {
				byRole[r] = append(byRole[r], f)
			}
		})
		for _, r := range roles {
			fmt.Fprintf(w, "\n%s:\n", roleTitle(r))
			for _, f := range byRole[r] {
				_, text, _ := strings.Cut(f.Usage, ": ")
				writeFlag(w, f, text)
			}
		}
		fmt.Fprintln(w, "\nEvery role:")
		for _, f := range common {
			writeFlag(w, f, f.Usage)
		}
		if len(roles) > 1 {
			fmt.Fprintln(w, "\n(odmoe run -role ROLE -h lists one role's flags.)")
		}
	}
}

// flagRoles are the roles a flag's usage begins with ("main, shadow:
// ..."), none when it begins otherwise.
func flagRoles(usage string) []string {
	head, _, ok := strings.Cut(usage, ": ")
	if !ok {
		return nil
	}
	var roles []string
	for _, r := range strings.Split(head, ",") {
		r = strings.TrimSpace(r)
		if !slices.Contains(runRoles, r) {
			return nil
		}
		roles = append(roles, r)
	}
	return roles
}

// roleTitle is a role's heading.
func roleTitle(role string) string {
	return map[string]string{
		"local":  "Local (-role local: the whole model in one process)",
		"main":   "Main node (-role main: the non-expert weights, the KV cache, the decode loop, the API)",
		"worker": "Worker (-role worker: loads experts just in time and computes them)",
		"shadow": "Shadow (-role shadow: a quantized copy that runs ahead and says which experts to load)",
		"stage":  "Stage (-role stage: a range of the main node's layers, their KV rows, their experts on workers)",
	}[role]
}
