package plan

import (
	"cmp"
	"fmt"
	"io"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/sim"
)

// modeWords says how each mode gets experts to the workers.
var modeWords = map[sim.Mode]string{
	sim.Resident: "resident: each worker keeps its share of the experts",
	sim.Reactive: "reactive: each expert loaded from the worker's store when its activation arrives",
	sim.Shadow:   "shadow: experts loaded from the workers' stores on the shadow's predictions",
}

// WriteText prints a: every node and what it holds, the chosen mode and
// speeds, and the options weighed (the fastest of each mode).
func WriteText(w io.Writer, a Answer, o Options) {
	ctx := fmt.Sprintf("the model's whole context, %d tokens", a.Context)
	if o.Context > 0 {
		ctx = fmt.Sprintf("%d tokens: run every node with -context %d", a.Context, a.Context)
	}
	fmt.Fprintf(w, "%s on %s: each node plans to hold %s, its KV cache sized to %s\n\n", a.Model, a.Device, progress.Bytes(a.Budget), ctx)
	fmt.Fprintln(w, "| node | count | layers | holds |")
	fmt.Fprintln(w, "|---|---:|---|---:|")
	for _, n := range a.Nodes {
		holds := progress.Bytes(n.Holds)
		switch {
		case n.Role == "worker" && a.Chosen.Mode == sim.Resident:
			holds += " of experts"
		case n.Role == "worker":
			holds += " (a cache of loaded experts: -device-mem)"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s |\n", n.Role, n.Count, cmp.Or(n.LayersText, "-"), holds)
	}
	c := a.Chosen
	fmt.Fprintf(w, "\n%d nodes, %s\n", c.Nodes, modeWords[c.Mode])
	fmt.Fprintf(w, "predicted at %dx%d (recall %.2f where a shadow predicts): decode %.2f tok/s, prompt %.1f tok/s (first token after %.0f ms)\n",
		o.Prompt, o.Output, o.Recall, c.DecodeTokensPerS, c.PromptTokensPerS, c.TTFTms)
	fmt.Fprintf(w, "\nthe fastest of each mode (-json lists every option):\n\n")
	fmt.Fprintln(w, "| mode | workers | nodes | decode tok/s | prompt tok/s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, m := range []sim.Mode{sim.Resident, sim.Reactive, sim.Shadow} {
		best, ok := fastest(a.Options, m)
		switch {
		case !ok && m == sim.Shadow:
			fmt.Fprintf(w, "| %s | - | - | no shadow fits: %s | |\n", m, a.NoShadow)
			continue
		case !ok:
			fmt.Fprintf(w, "| %s | - | - | the experts do not fit the workers tried (-max-workers %d) | |\n", m, o.MaxWorkers)
			continue
		}
		fmt.Fprintf(w, "| %s | %d | %d | %.2f | %.1f |\n", m, best.Workers, best.Nodes, best.DecodeTokensPerS, best.PromptTokensPerS)
	}
}

// fastest is the option of mode m of the fastest decode.
func fastest(opts []Option, m sim.Mode) (Option, bool) {
	var best Option
	found := false
	for _, o := range opts {
		if o.Mode == m && (!found || o.DecodeTokensPerS > best.DecodeTokensPerS) {
			best, found = o, true
		}
	}
	return best, found
}

// TableRow is a as one row of README's planning table: the model, the
// node, the main node's layers and memory, the stages', the answer (its
// workers, nodes, mode and speeds), and the shadow-driven swarm beside
// it (its shadow's stages, workers, nodes and decode).
func TableRow(name, node string, a Answer) string {
	var main Node
	var stages []Node
	for _, n := range a.Nodes {
		switch n.Role {
		case "main":
			main = n
		case "stage":
			stages = append(stages, n)
		}
	}
	c, s := a.Chosen, a.WithShadow
	withShadow := "no shadow fits a node | -"
	if a.NoShadow == "" {
		withShadow = fmt.Sprintf("%s; %d workers, %d nodes | %.1f", group(a.Shadow), s.Workers, s.Nodes, s.DecodeTokensPerS)
	}
	return fmt.Sprintf("| %s | %s | %s, %s | %s | %s: %d workers, %d nodes | %.1f | %.0f | %s |", name, node, main.LayersText, progress.Bytes(main.Holds),
		group(stages), c.Mode, c.Workers, c.Nodes, c.DecodeTokensPerS, c.PromptTokensPerS, withShadow)
}

// TableHeader is TableRow's header.
const TableHeader = "| model | node | main node: layers, holds | stages | answer | decode tok/s | prompt tok/s | with a shadow: its stages | decode tok/s |\n|---|---|---|---|---|---:|---:|---|---:|"

// group says how many nodes of ns there are and the most one holds
// ("-" for none).
func group(ns []Node) string {
	if len(ns) == 0 {
		return "-"
	}
	var most int64
	for _, n := range ns {
		most = max(most, n.Holds)
	}
	if len(ns) == 1 && ns[0].LayersText == "all" {
		return "1 whole, " + progress.Bytes(most)
	}
	return fmt.Sprintf("%d, at most %s", len(ns), progress.Bytes(most))
}
