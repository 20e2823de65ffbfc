package plan

import (
	"cmp"
	"errors"
	"fmt"
	"os"

	"github.com/odmoe/odmoe/harness/simrig"
	"github.com/odmoe/odmoe/internal/par"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/sched"
	"github.com/odmoe/odmoe/sim"
)

// Options say what a swarm is planned for.
type Options struct {
	Model  string // the model's directory: its config.json
	Device Device
	Quant  kernels.DType // the shadow's copy (NF4, Q8 or F16)
	// Prompt and Output are the case the speeds are predicted on.
	Prompt, Output int
	// Recall is the shadow's share of activations predicted (measured:
	// odmoe tune-align; nf4 ~0.97 on the small preset), Ahead its lead.
	Recall float64
	Ahead  int
	// MaxWorkers bounds the worker counts tried (multiples of Group, the
	// workers a layer's experts go to; 0: the router's top-k).
	MaxWorkers, Group int
	// Context is the longest sequence the nodes serve (-context; 0: the
	// model's): each node's KV cache is sized to it.
	Context int
	// Within is how close to the fastest plan's decode a plan of fewer
	// nodes must come to be the one answered (0.05: within 5%).
	Within float64
	Seed   uint64
}

// Node is one node (or, with Count, several alike) of a planned swarm.
type Node struct {
	Role   string           `json:"role"` // main, stage, shadow, worker
	Count  int              `json:"count"`
	Layers model.LayerRange `json:"-"`
	// LayersText is Layers as -layers takes it ("" for a worker, "all"
	// for a node that holds every layer)
	LayersText string `json:"layers,omitempty"`
	// Holds is what it holds (a worker's experts, or its cache for
	// loaded ones), in bytes, as the node says at start.
	Holds int64 `json:"holds_bytes"`
}

// Option is one swarm the planner predicted: its mode and workers, its
// speeds, its node count.
type Option struct {
	Mode    sim.Mode `json:"mode"`
	Workers int      `json:"workers"`
	Nodes   int      `json:"nodes"`
	// DecodeTokensPerS and PromptTokensPerS are the predicted speeds: a
	// token's decode, the prompt over the time to the first token.
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	TTFTms           float64 `json:"ttft_ms"`
	PromptTokensPerS float64 `json:"prompt_tokens_per_s"`
}

// Answer is a planned swarm: its nodes (the main node, its stages, the
// shadow's stages where the mode has a shadow, the workers) and speeds,
// and every option the planner weighed.
type Answer struct {
	Model  string `json:"model"`
	Device string `json:"device"`
	Budget int64  `json:"node_budget_bytes"`
	// Context is the sequence each node's KV cache is sized to.
	Context int    `json:"context"`
	Nodes   []Node `json:"nodes"`
	Chosen  Option `json:"chosen"`
	// Shadow is the shadow's stages (one whole where it fits a node),
	// and WithShadow the shadow-driven swarm the planner would answer
	// were it to have one (Chosen where it is).
	Shadow     []Node `json:"shadow"`
	WithShadow Option `json:"with_shadow"`
	// NoShadow says why no shadow-driven swarm was weighed ("": one was).
	NoShadow string   `json:"no_shadow,omitempty"`
	Options  []Option `json:"options"`
}

// Plan answers what a swarm of o.Device nodes needs to serve o.Model:
// the main node (with as many of the first layers as fit beside the
// embedding and the head) and as many stages as its other layers need,
// a shadow of as many stages as its quantized copy needs, and for each
// worker count the resident (where the experts fit the workers), reactive
// and shadow modes, predicted by package sim; it answers the fastest, or
// the one of fewest nodes within o.Within of it.
func Plan(o Options) (Answer, error) {
	if err := o.Device.Validate(); err != nil {
		return Answer{}, err
	}
	tmp, err := os.MkdirTemp("", "odmoe-plan-")
	if err != nil {
		return Answer{}, err
	}
	defer os.RemoveAll(tmp)
	m, err := Shaped(o.Model, tmp, o.Context)
	if err != nil {
		return Answer{}, err
	}
	defer m.Close()
	c := m.Config
	budget := o.Device.Budget()
	a := Answer{Model: o.Model, Device: o.Device.Name, Budget: budget, Context: c.MaxPositions}

	mainNode, stages, err := mainStages(m, budget)
	if err != nil {
		return a, err
	}
	// a shadow whose one layer passes a node: no shadow-driven swarm
	shadows, noShadow := shadowStages(m, o.Quant, budget)
	a.NoShadow = errText(noShadow)
	shape, _, err := simrig.Shape(o.Model)
	if err != nil {
		return a, err
	}
	p, err := profile(o.Device, m, shape, o.Quant)
	if err != nil {
		return a, err
	}
	experts := int64(len(c.ExpertLayers()) * c.NumExperts)
	group := cmp.Or(o.Group, c.TopK)
	simOpt := sim.Options{Prompt: o.Prompt, Output: o.Output, Recall: o.Recall, Ahead: o.Ahead, AlignKV: 1, Seed: o.Seed}
	for _, n := range stages {
		simOpt.Stages = append(simOpt.Stages, n.Layers.First)
	}
	if len(shadows) > 1 {
		for _, n := range shadows {
			simOpt.ShadowStages = append(simOpt.ShadowStages, n.Layers.First)
		}
	}
	trunk := 1 + len(stages)
	type job struct {
		layout sched.Layout
		opt    Option
	}
	var jobs []job
	for w := group; w <= max(o.MaxWorkers, group); w += group {
		layout, err := sched.NewLayout(w, group)
		if err != nil {
			return a, err
		}
		for _, mode := range []sim.Mode{sim.Resident, sim.Reactive, sim.Shadow} {
			nodes := trunk + w
			switch {
			case mode == sim.Resident && residentShare(experts, w)*shape.ExpertBytes > budget:
				continue // the experts do not fit the workers
			case mode == sim.Shadow && noShadow != nil:
				continue
			case mode == sim.Shadow:
				nodes += len(shadows)
			}
			jobs = append(jobs, job{layout, Option{Mode: mode, Workers: w, Nodes: nodes}})
		}
	}
	// the options side by side: a plan weighs dozens
	errs := make([]error, len(jobs))
	par.Each(len(jobs), func(i int) {
		so := simOpt
		so.Mode = jobs[i].opt.Mode
		res, err := sim.Expect(p, jobs[i].layout, shape, so, sim.ExpectRuns)
		errs[i] = err
		jobs[i].opt.DecodeTokensPerS, jobs[i].opt.TTFTms = res.DecodeTokensPerS, res.TTFTms
		jobs[i].opt.PromptTokensPerS = float64(o.Prompt) / (res.TTFTms / 1000)
	})
	if err := errors.Join(errs...); err != nil {
		return a, err
	}
	for _, j := range jobs {
		a.Options = append(a.Options, j.opt)
	}
	if len(a.Options) == 0 {
		return a, fmt.Errorf("plan: no worker count up to %d was tried", o.MaxWorkers)
	}
	a.Chosen = choose(a.Options, o.Within)
	var withShadow []Option
	for _, op := range a.Options {
		if op.Mode == sim.Shadow {
			withShadow = append(withShadow, op)
		}
	}
	if len(withShadow) > 0 {
		a.Shadow, a.WithShadow = shadows, choose(withShadow, o.Within)
	}
	a.Nodes = append([]Node{mainNode}, stages...)
	if a.Chosen.Mode == sim.Shadow {
		a.Nodes = append(a.Nodes, shadows...)
	}
	worker := Node{Role: "worker", Count: a.Chosen.Workers, Holds: budget} // a cache of loaded experts, as large as the node allows
	if a.Chosen.Mode == sim.Resident {
		worker.Holds = residentShare(experts, a.Chosen.Workers) * shape.ExpertBytes
	}
	a.Nodes = append(a.Nodes, worker)
	return a, nil
}

// errText is err's text, "" for none.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// residentShare is the most experts one of w workers owns when experts
// are spread over them evenly.
func residentShare(experts int64, w int) int64 { return (experts + int64(w) - 1) / int64(w) }

// choose is the option of the fastest decode, or the one of fewest
// nodes (then the fastest) whose decode is within within of it.
func choose(opts []Option, within float64) Option {
	best := opts[0]
	for _, o := range opts[1:] {
		if o.DecodeTokensPerS > best.DecodeTokensPerS {
			best = o
		}
	}
	chosen := best
	for _, o := range opts {
		if o.DecodeTokensPerS < (1-within)*best.DecodeTokensPerS {
			continue
		}
		if o.Nodes < chosen.Nodes || o.Nodes == chosen.Nodes && o.DecodeTokensPerS > chosen.DecodeTokensPerS {
			chosen = o
		}
	}
	return chosen
}

// mainStages splits the main node's share of m over nodes of budget:
// the main node holds the embedding, the head and as many of the first
// layers as fit beside them, each stage as many of the rest as fit,
// evened out over as many stages as that makes.
func mainStages(m *model.Model, budget int64) (Node, []Node, error) {
	layers := m.Config.NumLayers
	whole, err := m.FootprintOf(model.AllLayers(layers), model.FootprintOptions{Head: true})
	if err != nil {
		return Node{}, nil, err
	}
	if whole.Total() <= budget {
		return Node{Role: "main", Count: 1, Layers: model.AllLayers(layers), LayersText: "all", Holds: whole.Total()}, nil, nil
	}
	// the most first layers the main node keeps beside the embedding and
	// the head (none: model.NoLayers)
	kept, keptBytes := -1, int64(0)
	for end := 0; end < layers; end++ {
		r := model.LayerRange{First: 0, End: end}
		if end == 0 {
			r = model.NoLayers
		}
		f, err := m.FootprintOf(r, model.FootprintOptions{Head: true})
		if err != nil {
			return Node{}, nil, err
		}
		if f.Total() > budget {
			break
		}
		kept, keptBytes = end, f.Total()
	}
	if kept < 0 {
		return Node{}, nil, fmt.Errorf("plan: the embedding and the output head alone pass a node's %d bytes", budget)
	}
	held := model.LayerRange{First: 0, End: kept}
	if kept == 0 {
		held = model.NoLayers
	}
	main := Node{Role: "main", Count: 1, Layers: held, LayersText: held.String(), Holds: keptBytes}
	ranges, holds, err := pack(m, model.LayerRange{First: kept, End: layers}, budget, func(int) model.FootprintOptions {
		return model.FootprintOptions{SkipHead: true}
	})
	if err != nil {
		return Node{}, nil, fmt.Errorf("plan: the main node's stages: %w", err)
	}
	var stages []Node
	for i, r := range ranges {
		stages = append(stages, Node{Role: "stage", Count: 1, Layers: r, LayersText: r.String(), Holds: holds[i]})
	}
	return main, stages, nil
}

// shadowStages splits the shadow's quantized copy of m over nodes of
// budget: one whole shadow where it fits, else as few stages as hold it
// (the first with the embedding and the head: it samples).
func shadowStages(m *model.Model, quant kernels.DType, budget int64) ([]Node, error) {
	opt := func(first int) model.FootprintOptions {
		return model.FootprintOptions{Quantized: true, Quant: quant, Experts: true, Head: first == 0, SkipHead: first > 0}
	}
	ranges, holds, err := pack(m, model.AllLayers(m.Config.NumLayers), budget, opt)
	if err != nil {
		return nil, fmt.Errorf("plan: the shadow's stages (%s): %w", quant, err)
	}
	var out []Node
	for i, r := range ranges {
		text := r.String()
		if len(ranges) == 1 {
			text = "all"
		}
		out = append(out, Node{Role: "shadow", Count: 1, Layers: r, LayersText: text, Holds: holds[i]})
	}
	return out, nil
}

// pack splits r into as few contiguous ranges as each fit budget (opt
// says what a range's node holds, by its first layer): greedily, then
// evened out over that many where even ranges fit too. It returns the
// ranges and what each holds.
func pack(m *model.Model, r model.LayerRange, budget int64, opt func(first int) model.FootprintOptions) ([]model.LayerRange, []int64, error) {
	holds := func(x model.LayerRange) (int64, error) {
		f, err := m.FootprintOf(x, opt(x.First))
		return f.Total(), err
	}
	var greedy []model.LayerRange
	for first := r.First; first < r.End; {
		end := first
		for end < r.End {
			h, err := holds(model.LayerRange{First: first, End: end + 1})
			if err != nil {
				return nil, nil, err
			}
			if h > budget {
				break
			}
			end++
		}
		if end == first {
			h, _ := holds(model.LayerRange{First: first, End: first + 1})
			return nil, nil, fmt.Errorf("layer %d alone holds %d bytes, over a node's %d", first, h, budget)
		}
		greedy = append(greedy, model.LayerRange{First: first, End: end})
		first = end
	}
	ranges := greedy
	if even := r.Split(len(greedy)); fits(even, budget, holds) {
		ranges = even
	}
	out := make([]int64, len(ranges))
	for i, x := range ranges {
		h, err := holds(x)
		if err != nil {
			return nil, nil, err
		}
		out[i] = h
	}
	return ranges, out, nil
}

// fits reports whether every range holds at most budget.
func fits(ranges []model.LayerRange, budget int64, holds func(model.LayerRange) (int64, error)) bool {
	for _, x := range ranges {
		if h, err := holds(x); err != nil || h > budget {
			return false
		}
	}
	return true
}
