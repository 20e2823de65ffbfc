package model

import (
	"fmt"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/safetensors"
)

// Model is a checkpoint bound to odmoe's blocks. Matrices alias the
// memory-mapped safetensors files and keep their stored dtype; vectors
// (norm weights) are widened to float32 once at load.
type Model struct {
	Config    Config
	Embed     kernels.Matrix // [vocab, hidden]
	FinalNorm []float32      // [hidden]
	LMHead    kernels.Matrix // [vocab, hidden]; Embed when tied
	Layers    []Layer

	arch *architecture
	set  *safetensors.Set
	// bytes held by the bound matrices, split by role
	nonExpertBytes, expertBytes int64
}

// Expert is one SwiGLU feed-forward network: Down(silu(Gate x) * Up x).
type Expert struct {
	Gate kernels.Matrix // [intermediate, hidden] (Mixtral w1)
	Up   kernels.Matrix // [intermediate, hidden] (Mixtral w3)
	Down kernels.Matrix // [hidden, intermediate] (Mixtral w2)
}

// LoadOptions says which weights to bind.
type LoadOptions struct {
	// SkipExperts leaves Layer.Experts nil: the main node's view, whose
	// experts live on workers.
	SkipExperts bool
}

// Load binds the checkpoint in dir (config.json plus safetensors, single or
// sharded). Every tensor the architecture needs must exist with exactly the
// expected shape; a missing or misshapen tensor is an error naming it.
func Load(dir string, opt LoadOptions) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	set, err := safetensors.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m := &Model{Config: cfg, arch: architectures[cfg.Architecture], set: set}
	if err := m.bind(opt); err != nil {
		set.Close()
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	return m, nil
}

// binder collects the first error so bind reads as a list of tensors.
type binder struct {
	set   *safetensors.Set
	err   error
	bytes *int64
}

func (b *binder) matrix(name string, rows, cols int) kernels.Matrix {
	if b.err != nil {
		return kernels.Matrix{}
	}
	t, err := b.set.TensorShape(name, rows, cols)
	if err != nil {
		b.err = err
		return kernels.Matrix{}
	}
	m, _ := t.Matrix()
	*b.bytes += int64(len(t.Data))
	return m
}

func (b *binder) vector(name string, n int) []float32 {
	if b.err != nil {
		return nil
	}
	t, err := b.set.TensorShape(name, n)
	if err != nil {
		b.err = err
		return nil
	}
	v := make([]float32, n)
	kernels.ToFloat32(v, t.Data, t.DType)
	*b.bytes += int64(len(t.Data))
	return v
}

func (m *Model) bind(opt LoadOptions) error {
	c, arch := m.Config, m.arch
	h := c.HiddenSize
	b := &binder{set: m.set, bytes: &m.nonExpertBytes}
	m.Embed = b.matrix(arch.embed, c.VocabSize, h)
	m.FinalNorm = b.vector(arch.finalNorm, h)
	if c.TieEmbeddings {
		m.LMHead = m.Embed
	} else {
		m.LMHead = b.matrix(arch.lmHead, c.VocabSize, h)
	}
	m.Layers = make([]Layer, c.NumLayers)
	for l := range m.Layers {
		m.Layers[l] = arch.layer(b, c, l)
		if w := &m.Layers[l].Attention.Window; *w == 0 {
			*w = c.SlidingWindow // a family with windows of its own sets each layer's
		}
	}
	if opt.SkipExperts || b.err != nil {
		return b.err
	}
	eb := &binder{set: m.set, bytes: &m.expertBytes}
	for _, l := range c.ExpertLayers() {
		moe := m.Layers[l].MoE
		moe.Experts = make([]Expert, c.NumExperts)
		for e := range moe.Experts {
			gate, up, down := arch.expertNames(l, e)
			moe.Experts[e] = Expert{
				Gate: eb.matrix(gate, c.IntermediateSize, h),
				Up:   eb.matrix(up, c.IntermediateSize, h),
				Down: eb.matrix(down, h, c.IntermediateSize),
			}
		}
	}
	return eb.err
}

// NonExpertBytes is the size of every weight except the experts: what a
// main node holds.
func (m *Model) NonExpertBytes() int64 { return m.nonExpertBytes }

// ExpertBytes is the size of the bound experts (0 with SkipExperts).
func (m *Model) ExpertBytes() int64 { return m.expertBytes }

// DecodeBytesPerToken is the weight bytes a decode step of one token
// reads, the numerator of its memory roofline: every non-expert matrix
// once (of the embedding only the token's row, unless it is also the
// output head) and TopK of each MoE layer's experts (all equal in size),
// with the experts bound.
func (m *Model) DecodeBytesPerToken() int64 {
	b := m.nonExpertBytes + m.expertBytes*int64(m.Config.TopK)/int64(max(1, m.Config.NumExperts))
	if e := m.Embed; len(e.Data) > 0 && (len(m.LMHead.Data) == 0 || &e.Data[0] != &m.LMHead.Data[0]) {
		b -= int64(len(e.Data) - e.DType.RowBytes(e.Cols))
	}
	return b
}

// ExpertTensorNames returns the checkpoint names of one expert's gate, up
// and down matrices, for readers of the raw checkpoint (the store).
func (m *Model) ExpertTensorNames(layer, expert int) (gate, up, down string) {
	return m.arch.expertNames(layer, expert)
}

// Close releases the memory-mapped checkpoint; the Model's matrices must
// not be used after.
func (m *Model) Close() error {
	if m.set == nil { // a quantized copy owns its memory
		return nil
	}
	return m.set.Close()
}
