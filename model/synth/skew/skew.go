// Package skew redraws a generated model's routers so that each layer's
// experts take shares of its tokens as a trained model's do.
//
// A generated router's rows are independent Gaussians, so no expert is
// meant to be more popular than another, while a trained MoE routes much
// of each layer's traffic to a few of its experts (and with even routing
// no residency policy can beat its budget's share). Apply moves each
// router row along the mean of the layer's inputs: the router's input, a
// normalised hidden state, has a mean that every token shares in part,
// so adding b_e times that mean (over its squared norm) to expert e's row
// adds about b_e to its logit for every token: a bias, which the
// family's config has no field for. The b_e are fitted layer by layer to
// the routing of calibration tokens through the model itself (a layer's
// inputs depend on the routing of the layers before it), so that the
// experts, by popularity rank, take the shares Shares gives. Which expert
// gets which rank is drawn per layer from the seed, as a trained layer's
// hottest experts are its own. No weight but the routers' changes.
package skew

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
)

// Sigma is the spread of log(expert load) over a layer's experts that
// skew 1 gives: the measured spread of a trained MoE. Loads are the
// shares of a layer's routed tokens over an even share. Fitted (least
// squares of log load against the normal quantile of each expert's
// popularity rank) to OLMoE-1B-7B-0924's per-expert token counts on C4
// at its layers 0, 7 and 15 (sigma 0.253, 0.406, 0.574; the median, layer
// 7's, taken), as AI2 published them with the OLMoE paper (Muennighoff
// et al., arXiv:2409.02060, section 5: github.com/allenai/OLMoE,
// scripts/routing_output/olmoe/expert_counts/c4.pkl, commit 2aecf25, 102
// sequences of 2048 tokens): its hottest expert there takes 2.66 times an
// even share. The same files give OLMoE on GitHub code 0.56-1.57 (skew
// 1.4-3.9) and Mixtral-8x7B 0.04-0.30 (skew 0.1-0.7: Mixtral routes
// nearly evenly), so skew 1 is a general-text MoE of many small experts.
const Sigma = 0.406

// Source names Sigma's measurement, for the files Apply writes.
const Source = "OLMoE-1B-7B-0924 on C4, layer 7 (arXiv:2409.02060; github.com/allenai/OLMoE scripts/routing_output/olmoe/expert_counts/c4.pkl at 2aecf25)"

// Shares are the shares of a layer's routed tokens that its n experts
// take at skew, by popularity rank (descending, summing to 1): expert
// rank r's load is exp(skew*Sigma*z_r), z_r the standard normal quantile
// of 1-(r+1/2)/n. Skew 0 is even.
func Shares(n int, skew float64) []float64 {
	shares := make([]float64, n)
	var sum float64
	for r := range n {
		z := math.Sqrt2 * math.Erfinv(1-2*(float64(r)+0.5)/float64(n))
		shares[r] = math.Exp(skew * Sigma * z)
		sum += shares[r]
	}
	for r := range shares {
		shares[r] /= sum
	}
	return shares
}

// Options configure Apply.
type Options struct {
	Skew float64
	Seed uint64 // which expert gets which rank, and the calibration tokens
	// Prompts of Tokens random tokens each are the calibration (0: 256 of
	// 32). Many short prompts, not a few long ones: a generated model's
	// later layers route a prompt much by a state of its own, which its
	// attention builds up from its tokens, so a few prompts' routing is
	// theirs more than the layer's.
	Prompts, Tokens int
}

// Layer is one layer's fit: the shares of the calibration's routed
// tokens it was to give each popularity rank and those it gave, and the
// expert of each rank.
type Layer struct {
	Layer   int       `json:"layer"`
	Want    []float64 `json:"want_shares"`
	Got     []float64 `json:"got_shares"`
	Experts []int     `json:"experts_by_rank"`
}

// Report is what Apply did, written to ReportFile.
type Report struct {
	Skew   float64 `json:"skew"`
	Sigma  float64 `json:"sigma"`
	Source string  `json:"source"`
	Seed   uint64  `json:"seed"`
	Tokens int     `json:"calibration_tokens"`
	Layers []Layer `json:"layers"`
}

// ReportFile is the file in the model's directory that says how its
// routers were skewed.
const ReportFile = "odmoe-skew.json"

// Tolerance is how far from its target share a rank may end, relative
// to the target, plus an absolute 0.01 for the calibration's noise.
const Tolerance = 0.25

// Apply skews the routers of the model in dir (a generated one: a single
// model.safetensors whose routers are BF16) as the package comment says,
// rewriting them in place, and writes ReportFile. Skew 0 changes nothing.
func Apply(ctx context.Context, dir string, opt Options) (*Report, error) {
	if opt.Skew < 0 || math.IsNaN(opt.Skew) || math.IsInf(opt.Skew, 0) {
		return nil, fmt.Errorf("skew: -skew %v: want 0 (even routing) or more", opt.Skew)
	}
	if opt.Skew == 0 {
		return nil, nil
	}
	opt.Prompts, opt.Tokens = cmp.Or(max(opt.Prompts, 0), 256), cmp.Or(max(opt.Tokens, 0), 32)
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		return nil, err
	}
	open := true
	defer func() {
		if open {
			m.Close()
		}
	}()
	c := m.Config
	layers := c.ExpertLayers()
	for _, l := range layers {
		moe := m.Layers[l].MoE
		if moe.Grouped != nil || moe.RouterBias != nil || moe.SoftmaxOfTopK {
			return nil, fmt.Errorf("skew: %s routes otherwise than by a softmax over every expert's logit (mixtral, qwen3-moe, olmoe, qwen2-moe): its routing is not modelled", c.ModelType)
		}
		if moe.Router.DType != kernels.BF16 {
			return nil, fmt.Errorf("skew: layer %d's router is %v, not BF16 as a generated model's", l, moe.Router.DType)
		}
	}
	rep := &Report{Skew: opt.Skew, Sigma: Sigma, Source: Source, Seed: opt.Seed, Tokens: opt.Prompts * opt.Tokens}
	want := Shares(c.NumExperts, opt.Skew)
	prompts := calibration(opt, c.VocabSize)
	for _, l := range layers {
		xs, err := inputs(ctx, m, l, prompts)
		if err != nil {
			return nil, err
		}
		rank := rand.New(rand.NewPCG(opt.Seed, uint64(l)+0x5e3d)).Perm(c.NumExperts) // expert e's popularity rank
		picks := make([]float64, c.NumExperts)
		experts := make([]int, c.NumExperts)
		for e, r := range rank {
			picks[e] = float64(c.TopK) * want[r]
			experts[r] = e
		}
		m.Layers[l].MoE.Router = biased(m.Layers[l].MoE.Router, xs, c.HiddenSize, c.TopK, picks)
		rep.Layers = append(rep.Layers, Layer{Layer: l, Want: want, Experts: experts})
	}
	got, err := routedShares(ctx, m, prompts)
	if err != nil {
		return nil, err
	}
	var far []string
	for i := range rep.Layers {
		lf := &rep.Layers[i]
		for _, e := range lf.Experts {
			lf.Got = append(lf.Got, got[lf.Layer][e])
		}
		for r := range lf.Want {
			if math.Abs(lf.Got[r]-lf.Want[r]) > Tolerance*lf.Want[r]+0.01 {
				far = append(far, fmt.Sprintf("layer %d's rank %d takes %.3f of its tokens, not %.3f", lf.Layer, r, lf.Got[r], lf.Want[r]))
				break
			}
		}
	}
	if len(far) > 0 {
		return rep, fmt.Errorf("skew: -skew %v on %d experts, top-%d: the fit falls short: %s (a lower -skew reaches its shape)", opt.Skew, c.NumExperts, c.TopK, far[0])
	}
	routers := make(map[int][]byte, len(layers))
	for _, l := range layers {
		routers[l] = m.Layers[l].MoE.Router.Data // our own copies, not the file's
	}
	open = false
	if err := m.Close(); err != nil {
		return rep, err
	}
	if err := rewrite(dir, routers); err != nil {
		return rep, err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return rep, err
	}
	return rep, os.WriteFile(filepath.Join(dir, ReportFile), append(b, '\n'), 0o644)
}

// calibration are opt's prompts of random token ids below vocab.
func calibration(opt Options, vocab int) [][]int {
	rng := rand.New(rand.NewPCG(opt.Seed, 0xca11b))
	out := make([][]int, opt.Prompts)
	for p := range out {
		out[p] = make([]int, opt.Tokens)
		for i := range out[p] {
			out[p][i] = rng.IntN(vocab)
		}
	}
	return out
}

// errStop ends a calibration pass at the layer it records.
var errStop = errors.New("skew: recorded")

// recorder runs experts resident and keeps the inputs of layer (the
// router's), ending the pass there; with layer -1 it counts each
// expert's routed tokens instead, ending the pass once layer last has
// routed (nothing after it changes a route).
type recorder struct {
	*model.ResidentExperts
	layer  int
	hidden int
	xs     []float32
	counts map[int][]float64
	last   int
}

func (r *recorder) RunExperts(ctx context.Context, step model.Step, layer int, x []float32, n int, routes []model.Route, out []float32) error {
	if layer == r.layer {
		r.xs = append(r.xs, x[:n*r.hidden]...)
		return errStop
	}
	if r.counts != nil {
		for _, rt := range routes {
			r.counts[layer][rt.Expert]++
		}
		if layer == r.last {
			return errStop
		}
	}
	return r.ResidentExperts.RunExperts(ctx, step, layer, x, n, routes, out)
}

// inputs are layer's router inputs for every calibration token, row by
// row (hidden floats each).
func inputs(ctx context.Context, m *model.Model, layer int, prompts [][]int) ([]float32, error) {
	r := &recorder{ResidentExperts: model.NewResidentExperts(m), layer: layer, hidden: m.Config.HiddenSize}
	for _, p := range prompts {
		s := model.NewSession(m, r, len(p))
		if _, err := s.Forward(ctx, p); !errors.Is(err, errStop) {
			return nil, fmt.Errorf("skew: calibrating layer %d: %v", layer, err)
		}
	}
	return r.xs, nil
}

// routedShares runs the calibration up to the last layer with experts
// (without the output head) and returns, per layer with experts, each
// expert's share of its routed tokens.
func routedShares(ctx context.Context, m *model.Model, prompts [][]int) (map[int][]float64, error) {
	layers := m.Config.ExpertLayers()
	r := &recorder{ResidentExperts: model.NewResidentExperts(m), layer: -1, counts: map[int][]float64{}, last: layers[len(layers)-1]}
	for _, l := range layers {
		r.counts[l] = make([]float64, m.Config.NumExperts)
	}
	for _, p := range prompts {
		if err := model.NewSession(m, r, len(p)).ForwardHidden(ctx, p); !errors.Is(err, errStop) {
			return nil, fmt.Errorf("skew: measuring the routing: %w", err)
		}
	}
	for _, counts := range r.counts {
		var sum float64
		for _, n := range counts {
			sum += n
		}
		for e := range counts {
			counts[e] /= sum
		}
	}
	return r.counts, nil
}

// fitRounds is how many rounds biased adjusts the biases: each closes
// about half of what is left of a rank's error.
const fitRounds = 60

// biased returns router (BF16, experts x hidden) with each expert's row
// moved along the mean of xs (the layer's inputs, hidden floats a row),
// and a cold one's scaled down, so that top-k routing of xs picks expert
// e for picks[e] of the rows.
func biased(router kernels.Matrix, xs []float32, hidden, k int, picks []float64) kernels.Matrix {
	n, experts := len(xs)/hidden, router.Rows
	mean := make([]float64, hidden)
	for t := range n {
		for i, v := range xs[t*hidden : (t+1)*hidden] {
			mean[i] += float64(v)
		}
	}
	var norm2 float64
	for i := range mean {
		mean[i] /= float64(n)
		norm2 += mean[i] * mean[i]
	}
	w := make([]float64, experts*hidden)
	for i := range w {
		w[i] = float64(kernels.BF16ToF32(binary.LittleEndian.Uint16(router.Data[2*i:])))
	}
	// each row's logit, and the share of the mean in each row, once
	logits := make([]float64, n*experts)
	along := make([]float64, n) // x . mean / |mean|^2: about 1
	var spread float64
	for t := range n {
		x := xs[t*hidden : (t+1)*hidden]
		for e := range experts {
			var s float64
			for i, v := range x {
				s += w[e*hidden+i] * float64(v)
			}
			logits[t*experts+e] = s
			spread += s * s
		}
		var s float64
		for i, v := range x {
			s += mean[i] * float64(v)
		}
		along[t] = s / norm2
	}
	spread = math.Sqrt(spread / float64(n*experts))
	// One knob per expert, theta, moves its pick rate one way: above 0 a
	// bias of theta*spread along the mean, below 0 its row scaled by
	// exp(theta). A negative bias cannot make an expert rare where the
	// mean is weak (the first layers: a token's own part of its input
	// dwarfs what tokens share, and where a token's is against the mean
	// the bias would pick the expert), while a row scaled towards 0 is
	// picked only when all other logits but k-1 are below 0 (about never).
	theta := make([]float64, experts)
	knobs := func(e int) (scale, bias float64) { return math.Exp(min(theta[e], 0)), max(theta[e], 0) * spread }
	got := make([]float64, experts)
	order := make([]int, experts)
	row := make([]float64, experts)
	for range fitRounds {
		clear(got)
		for t := range n {
			for e := range experts {
				scale, bias := knobs(e)
				row[e] = scale*logits[t*experts+e] + bias*along[t]
				order[e] = e
			}
			topK(order, row, k)
			for _, e := range order[:k] {
				got[e]++
			}
		}
		for e := range experts {
			have := max(got[e], 0.5) / float64(n)
			theta[e] += 0.5 * math.Log(picks[e]/have)
		}
	}
	out := kernels.Matrix{DType: kernels.BF16, Rows: experts, Cols: hidden, Data: make([]byte, len(router.Data))}
	for e := range experts {
		scale, bias := knobs(e)
		for i := range hidden {
			v := scale*w[e*hidden+i] + bias*mean[i]/norm2
			binary.LittleEndian.PutUint16(out.Data[2*(e*hidden+i):], kernels.F32ToBF16(float32(v)))
		}
	}
	return out
}

// topK moves the indices (in order) of the k largest of row to order's
// front, ties to the lower index, as the model's router breaks them.
func topK(order []int, row []float64, k int) {
	for i := range k {
		best := i
		for j := i + 1; j < len(order); j++ {
			a, b := row[order[j]], row[order[best]]
			if a > b || a == b && order[j] < order[best] {
				best = j
			}
		}
		order[i], order[best] = order[best], order[i]
	}
}

// rewrite writes each layer's router bytes over its tensor in dir's
// model.safetensors (a generated model's single file).
func rewrite(dir string, routers map[int][]byte) error {
	path := filepath.Join(dir, "model.safetensors")
	set, err := safetensors.Open(path)
	if err != nil {
		return fmt.Errorf("skew: %w (a generated model's single file)", err)
	}
	type at struct {
		off  int64
		data []byte
	}
	var writes []at
	layers := slices.Sorted(maps.Keys(routers))
	for _, l := range layers {
		var info safetensors.Info
		ok := false
		for _, name := range []string{fmt.Sprintf("model.layers.%d.block_sparse_moe.gate.weight", l), fmt.Sprintf("model.layers.%d.mlp.gate.weight", l)} {
			if info, ok = set.Info(name); ok {
				break
			}
		}
		if !ok || info.End-info.Begin != int64(len(routers[l])) {
			set.Close()
			return fmt.Errorf("skew: %s: no BF16 router of layer %d of %d bytes", path, l, len(routers[l]))
		}
		writes = append(writes, at{info.Begin, routers[l]})
	}
	if err := set.Close(); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("skew: %w", err)
	}
	var hdr [8]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		f.Close()
		return fmt.Errorf("skew: %s: %w", path, err)
	}
	data := 8 + int64(binary.LittleEndian.Uint64(hdr[:])) // the data section's start
	for _, w := range writes {
		if _, err := f.WriteAt(w.data, data+w.off); err != nil {
			f.Close()
			return fmt.Errorf("skew: %s: %w", path, err)
		}
	}
	return f.Close()
}
