package model

import (
	"errors"
	"fmt"

	"github.com/odmoe/odmoe/internal/anonmem"
	"github.com/odmoe/odmoe/internal/procmem"
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
	// held are the layers bound (LoadOptions.Layers): a stage's; the
	// embedding is bound where they begin at the first layer, the final
	// norm and the output head where they end at the last
	held LayerRange
	// remote runs the layers after held (SetLayerRunner)
	remote LayerRunner
	// bytes held by the bound matrices, split by role
	nonExpertBytes, expertBytes int64
	// arena holds the weights' copies (LoadOptions.Weights); nil where
	// they are the checkpoint's mapping
	arena *anonmem.Arena
	// packedFrom and packedTo are the BF16 bytes that the copies packed
	// (WeightsPacked) and their size packed
	packedFrom, packedTo int64
	// copyable is the bytes of the weights LoadOptions.Weights copies:
	// every one bound as it is (not the norms' vectors, made float32 at
	// load), but an embedding that is not the head
	copyable int64
}

// Expert is one feed-forward network: a SwiGLU, Down(silu(Gate x) *
// Up x), or, with GateUp set (Fused), gpt-oss's: Down(ClampedSwiGLU(GateUp
// x + GateUpBias)) + DownBias.
type Expert struct {
	Gate kernels.Matrix // [intermediate, hidden] (Mixtral w1)
	Up   kernels.Matrix // [intermediate, hidden] (Mixtral w3)
	Down kernels.Matrix // [hidden, intermediate] (Mixtral w2)
	// GateUp replaces Gate and Up in gpt-oss's experts: [2*intermediate,
	// hidden], row 2j gate row j and row 2j+1 up row j (gate_up_proj as
	// its checkpoint interleaves them, one row per output). GateUpBias
	// ([1, 2*intermediate], interleaved alike) and DownBias ([1, hidden])
	// are added to the products; Limit and Alpha are the activation's
	// (kernels.ClampedSwiGLU).
	GateUp, GateUpBias, DownBias kernels.Matrix
	Limit, Alpha                 float32
}

// Fused reports whether e is gpt-oss's kind of expert (GateUp set).
func (e Expert) Fused() bool { return e.GateUp.Rows > 0 }

// Hidden is the width e reads and writes.
func (e Expert) Hidden() int { return e.Down.Rows }

// Check reports whether e's matrices fit together as Forward computes
// them, on vectors of hidden floats: a node checks an expert it read
// before it runs it.
func (e Expert) Check(hidden int) error {
	h, in := e.Hidden(), e.Intermediate()
	var ok bool
	if e.Fused() {
		ok = e.GateUp.Rows == 2*in && e.GateUp.Cols == h && e.Down.Cols == in &&
			e.GateUpBias.Rows == 1 && e.GateUpBias.Cols == 2*in && e.DownBias.Rows == 1 && e.DownBias.Cols == h &&
			e.GateUpBias.DType.Size() > 0 && e.DownBias.DType.Size() > 0 && e.Limit > 0 && e.Alpha > 0
	} else {
		ok = e.Gate.Cols == h && e.Up.Rows == in && e.Up.Cols == h && e.Down.Cols == in
	}
	switch {
	case !ok || in <= 0:
		return fmt.Errorf("an expert's matrices do not fit together: %s", e.shapes())
	case h != hidden:
		return fmt.Errorf("an expert of hidden size %d, the model's is %d", h, hidden)
	}
	return nil
}

// shapes lists e's matrices' shapes, for errors.
func (e Expert) shapes() string {
	if e.Fused() {
		return fmt.Sprintf("gate_up %dx%d, down %dx%d, biases %dx%d and %dx%d, limit %v, alpha %v", e.GateUp.Rows, e.GateUp.Cols,
			e.Down.Rows, e.Down.Cols, e.GateUpBias.Rows, e.GateUpBias.Cols, e.DownBias.Rows, e.DownBias.Cols, e.Limit, e.Alpha)
	}
	return fmt.Sprintf("gate %dx%d, up %dx%d, down %dx%d", e.Gate.Rows, e.Gate.Cols, e.Up.Rows, e.Up.Cols, e.Down.Rows, e.Down.Cols)
}

// Intermediate is e's inner width: Gate's rows, half of GateUp's.
func (e Expert) Intermediate() int {
	if e.Fused() {
		return e.GateUp.Rows / 2
	}
	return e.Gate.Rows
}

// LoadOptions says which weights to bind.
type LoadOptions struct {
	// SkipExperts leaves Layer.Experts nil: the main node's view, whose
	// experts live on workers.
	SkipExperts bool
	// Layers, when set, binds only those layers (one stage's of a
	// staged model), the embedding only where they begin at the first
	// layer (or it is also the head), the final norm and the output head
	// only where they end at the last: the rest of the checkpoint is
	// never read.
	Layers *LayerRange
	// Head binds the final norm and the output head even where Layers
	// end before the last layer: a process that runs the first layers
	// and has the rest run on other nodes (SetLayerRunner) samples.
	Head bool
	// SkipHead binds no output head even where Layers end at the last
	// layer: a later stage, whose first stage samples.
	SkipHead bool
	// Context, when positive, is the longest sequence (prompt and answer)
	// the node serves instead of the model's max_position_embeddings:
	// its KV cache, and what it says it holds, are sized to it (-context).
	// It may not pass the model's.
	Context int
	// Shapes derives nothing from the weights' values (MLA's transposed
	// key rows get their shape and size, not their data): a model to
	// count footprints with (package plan, on a checkpoint of shapes
	// only), never to run.
	Shapes bool
	// Weights says where the bound weights live: the checkpoint's
	// mapping (WeightsMapped, the default), or copies in memory of the
	// process's own (WeightsInMemory; WeightsAuto where they fit; never
	// with Shapes). The token embedding stays mapped unless it is also the
	// output head: a token reads one of its rows.
	Weights Weights
	// Check, if set, is given the model bound (its weights mapped;
	// unless Weights is WeightsMapped, bound for counting only: what it
	// would derive from their values left out, so never to run) before
	// any is copied: an error ends the load (a node's budget, checked
	// before it takes the memory).
	Check func(*Model) error
	// Progress, if set, is told the bytes copied into memory so far and
	// their total.
	Progress func(done, total int64)
}

// Weights is where a model's bound weights live (LoadOptions.Weights).
type Weights int

const (
	// WeightsMapped leaves them in the checkpoint's mapping: the page
	// cache's pages, which stream as fast as memory of the process's own
	// only where the file is cached in large folios (read in order); read
	// 4 KiB at a time, it decoded 21% slower at one thread on the Zen 4
	// VM, 8% at two (docs/benchmarks/2026-11-29.md).
	WeightsMapped Weights = iota
	// WeightsInMemory copies them into memory of the process's own
	// (package anonmem: huge pages asked for), which the kernel cannot
	// page out: a node must have the room.
	WeightsInMemory
	// WeightsAuto copies them where the platform allows and they take
	// at most three quarters of the memory the kernel says is available
	// (procmem.Available), packed as WeightsPacked where the CPU computes
	// the packed products natively (kernels.PackedNative), and maps them
	// otherwise.
	WeightsAuto
	// WeightsPacked is WeightsInMemory with every BF16 weight that only
	// multiplies vectors (attention, MLPs, experts, the output head)
	// packed losslessly into 13 bits a weight (kernels.BF16P): a
	// memory-bound decode reads 0.81 of their bytes. Where the CPU has
	// no packed kernel (kernels.PackedNative) their products run in pure
	// Go, far slower: auto packs only where it has.
	WeightsPacked
)

// ParseWeights reads -weights: mapped, memory, auto or packed.
func ParseWeights(s string) (Weights, error) {
	for w := WeightsMapped; w <= WeightsPacked; w++ {
		if w.String() == s {
			return w, nil
		}
	}
	return 0, fmt.Errorf("weights %q: want auto, packed, memory or mapped", s)
}

func (w Weights) String() string {
	switch w {
	case WeightsMapped:
		return "mapped"
	case WeightsInMemory:
		return "memory"
	case WeightsAuto:
		return "auto"
	case WeightsPacked:
		return "packed"
	}
	return fmt.Sprintf("Weights(%d)", int(w))
}

// packs reports whether w packs the BF16 weights it copies.
func (w Weights) packs() bool {
	return w == WeightsPacked || w == WeightsAuto && kernels.PackedNative()
}

// copies reports whether w copies weights of n bytes into memory.
func (w Weights) copies(n int64) bool {
	switch w {
	case WeightsInMemory, WeightsPacked:
		return true
	case WeightsAuto:
		avail := procmem.Available()
		return anonmem.Supported && avail > 0 && n <= avail/4*3
	}
	return false
}

// Load binds the checkpoint in dir (config.json plus safetensors, single or
// sharded). Every tensor the architecture needs must exist with exactly the
// expected shape; a missing or misshapen tensor is an error naming it.
func Load(dir string, opt LoadOptions) (*Model, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if opt.Context < 0 || opt.Context > cfg.MaxPositions {
		return nil, fmt.Errorf("model: %s: -context %d: want 1 to the model's context, %d (max_position_embeddings)", dir, opt.Context, cfg.MaxPositions)
	}
	if opt.Context > 0 && opt.Context < cfg.MaxPositions {
		if rs := cfg.RopeScaling; rs != nil && rs.OriginalMaxPosition == 0 {
			// YaRN reads the context it was trained for from here when
			// rope_scaling does not say it: a shorter -context must not
			// change a single rotation
			pinned := *rs
			pinned.OriginalMaxPosition = cfg.MaxPositions
			cfg.RopeScaling = &pinned
		}
		cfg.MaxPositions = opt.Context
	}
	set, err := safetensors.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m := &Model{Config: cfg, arch: architectures[cfg.Architecture], set: set, held: AllLayers(cfg.NumLayers)}
	if opt.Layers != nil {
		if *opt.Layers == NoLayers && !opt.Head {
			set.Close()
			return nil, fmt.Errorf("model: %s: no layers and no output head: nothing to bind", dir)
		}
		if err := opt.Layers.heldOf(cfg.NumLayers); err != nil {
			set.Close()
			return nil, fmt.Errorf("model: %s: %w", dir, err)
		}
		m.held = *opt.Layers
	}
	// a load that may copy (not of a checkpoint of shapes, which has no
	// bytes to copy) binds twice: first counting (shapes only: nothing
	// derived from the values, such as DeepSeek's absorbed keys, made only
	// to be dropped), then for good, copying or not
	mayCopy := opt.Weights != WeightsMapped && !opt.Shapes
	counting := opt
	counting.Shapes = opt.Shapes || mayCopy
	if err := m.bind(counting, nil); err != nil {
		set.Close()
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	if opt.Check != nil {
		if err := opt.Check(m); err != nil {
			set.Close()
			return nil, err
		}
	}
	if !mayCopy {
		return m, nil
	}
	var own *copier
	mem := &Model{Config: m.Config, arch: m.arch, set: set, held: m.held}
	if opt.Weights.copies(m.copyable) {
		own = &copier{set: set, arena: &anonmem.Arena{}, total: m.copyable, progress: opt.Progress, pack: opt.Weights.packs()}
		mem.arena = own.arena
	}
	if err := mem.bind(opt, own); err != nil {
		if own != nil {
			own.arena.Close()
		}
		set.Close()
		return nil, fmt.Errorf("model: %s: %w", dir, err)
	}
	if own != nil {
		mem.packedFrom, mem.packedTo = own.from, own.to
	}
	return mem, nil
}

// copier copies weights into an arena as a binder binds them
// (LoadOptions.Weights), read from the checkpoint's files rather than
// through the mapping, so a load holds the copies, not the file's pages
// too. (The counting binding before it reads only the norms' vectors.)
type copier struct {
	set         *safetensors.Set
	arena       *anonmem.Arena
	done, total int64
	progress    func(done, total int64)
	// pack packs the products' BF16 weights (binder.product); from and
	// to count their bytes before and after
	pack     bool
	from, to int64
}

func (c *copier) copy(b []byte) ([]byte, error) {
	mem, err := c.arena.Alloc(len(b))
	if err != nil {
		return nil, err
	}
	if err := c.set.ReadInto(mem, b); err != nil {
		return nil, err
	}
	c.copied(len(b))
	return mem, nil
}

// copied counts n more bytes of the checkpoint's copied.
func (c *copier) copied(n int) {
	c.done += int64(n)
	if c.progress != nil {
		c.progress(c.done, c.total)
	}
}

// packed returns m (BF16, the checkpoint's mapping) packed into the
// arena (kernels.BF16P), read through the mapping, whose pages it then
// gives back; or m copied as it is where kernels.PackBF16 refuses it.
func (c *copier) packed(m kernels.Matrix) (kernels.Matrix, error) {
	p, ok, err := kernels.PackBF16(m, c.arena.Alloc)
	if err != nil {
		return kernels.Matrix{}, err
	}
	if !ok {
		m.Data, err = c.copy(m.Data)
		return m, err
	}
	release(m.Data)
	c.copied(len(m.Data))
	c.from += int64(len(m.Data))
	c.to += int64(p.Bytes())
	return p, nil
}

// binder collects the first error so bind reads as a list of tensors.
type binder struct {
	set    *safetensors.Set
	err    error
	bytes  *int64
	fp8    bool // the config's quantization_config is fp8
	shapes bool // LoadOptions.Shapes
	// own, if set, copies every weight bound into memory of the
	// process's own (LoadOptions.Weights), but while mapped is set (the
	// token embedding, unless it is the head); copyable counts what it
	// copies, or would
	own      *copier
	mapped   bool
	copyable *int64
}

// keep is the bytes a weight binds to: data, the checkpoint's, or their
// copy (own).
func (b *binder) keep(data []byte) []byte {
	if b.err != nil || len(data) == 0 || b.mapped {
		return data
	}
	*b.copyable += int64(len(data))
	if b.own == nil {
		return data
	}
	mem, err := b.own.copy(data)
	if err != nil {
		b.err = err
		return nil
	}
	return mem
}

func (b *binder) matrix(name string, rows, cols int) kernels.Matrix {
	return b.bindMatrix(name, rows, cols, false)
}

// product is matrix for a weight that only ever multiplies vectors
// (kernels.MatVec and MatMul): packed (kernels.BF16P) where the copier
// packs (LoadOptions.Weights) and it is BF16.
func (b *binder) product(name string, rows, cols int) kernels.Matrix {
	return b.bindMatrix(name, rows, cols, true)
}

func (b *binder) bindMatrix(name string, rows, cols int, product bool) kernels.Matrix {
	if b.err != nil {
		return kernels.Matrix{}
	}
	if info, ok := b.set.Info(name); ok && info.DType == "F8_E4M3" {
		return b.f8(name, rows, cols)
	}
	t, err := b.set.TensorShape(name, rows, cols)
	if err != nil {
		b.err = err
		return kernels.Matrix{}
	}
	m, _ := t.Matrix()
	if product && m.DType == kernels.BF16 && b.own != nil && b.own.pack && !b.mapped {
		*b.copyable += int64(len(m.Data))
		if m, err = b.own.packed(m); err != nil {
			b.err = err
			return kernels.Matrix{}
		}
	} else {
		m.Data = b.keep(m.Data)
	}
	*b.bytes += int64(m.Bytes())
	return m
}

// f8 binds an F8_E4M3 weight and its weight_scale_inv (one float32 per
// 128x128 block) as an F8E4M3 matrix aliasing the checkpoint.
func (b *binder) f8(name string, rows, cols int) kernels.Matrix {
	if !b.fp8 {
		b.err = fmt.Errorf(`tensor %q is F8_E4M3, and config.json has no "quantization_config" saying fp8`, name)
		return kernels.Matrix{}
	}
	codes, err := b.set.Raw(name, "F8_E4M3", rows, cols)
	if err != nil {
		b.err = err
		return kernels.Matrix{}
	}
	scaleName := name + "_scale_inv" // model.x.weight -> model.x.weight_scale_inv
	scales, err := b.set.Raw(scaleName, "F32", (rows+127)/128, (cols+127)/128)
	if err != nil {
		b.err = err
		return kernels.Matrix{}
	}
	*b.bytes += int64(len(codes) + len(scales))
	return kernels.Matrix{DType: kernels.F8E4M3, Rows: rows, Cols: cols, Data: b.keep(codes), Scales: b.keep(scales)}
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

// bind binds the weights opt says, copied by own where it is set.
func (m *Model) bind(opt LoadOptions, own *copier) error {
	c, arch := m.Config, m.arch
	h := c.HiddenSize
	fp8 := c.Quantization == "fp8"
	b := &binder{set: m.set, bytes: &m.nonExpertBytes, fp8: fp8, shapes: opt.Shapes, own: own, copyable: &m.copyable}
	first, last := m.held.First == 0, (m.held.End == c.NumLayers || opt.Head) && !opt.SkipHead
	if first || last && c.TieEmbeddings {
		b.mapped = !(last && c.TieEmbeddings) // a token reads one row of it, unless it is the head
		m.Embed = b.matrix(arch.embed, c.VocabSize, h)
		b.mapped = false
	}
	if last {
		m.FinalNorm = b.vector(arch.finalNorm, h)
		if c.TieEmbeddings {
			m.LMHead = m.Embed
		} else {
			m.LMHead = b.product(arch.lmHead, c.VocabSize, h)
		}
	}
	m.Layers = make([]Layer, c.NumLayers)
	for l := range m.Layers {
		if m.held.Contains(l) {
			m.Layers[l] = arch.layer(b, c, l)
		}
		m.Layers[l].Attention.Window = c.WindowOf(l) // every layer's: a stage's cache is shaped by them all
	}
	if opt.SkipExperts || b.err != nil {
		return b.err
	}
	eb := &binder{set: m.set, bytes: &m.expertBytes, fp8: fp8, shapes: opt.Shapes, own: own, copyable: &m.copyable}
	for _, l := range c.ExpertLayers() {
		if !m.held.Contains(l) {
			continue
		}
		moe := m.Layers[l].MoE
		if arch.experts != nil {
			moe.Experts = arch.experts(eb, c, l)
			continue
		}
		moe.Experts = make([]Expert, c.NumExperts)
		for e := range moe.Experts {
			gate, up, down := arch.expertNames(l, e)
			moe.Experts[e] = Expert{
				Gate: eb.product(gate, c.IntermediateSize, h),
				Up:   eb.product(up, c.IntermediateSize, h),
				Down: eb.product(down, h, c.IntermediateSize),
			}
		}
	}
	return eb.err
}

// HeldLayers are the layers bound (all but for LoadOptions.Layers).
func (m *Model) HeldLayers() LayerRange { return m.held }

// NonExpertBytes is the size of every weight except the experts: what a
// main node holds.
func (m *Model) NonExpertBytes() int64 { return m.nonExpertBytes }

// ExpertBytes is the size of the bound experts (0 with SkipExperts).
func (m *Model) ExpertBytes() int64 { return m.expertBytes }

// DecodeBytesPerToken is the weight bytes a decode step of one token
// reads, the numerator of its memory roofline: every non-expert matrix
// once (of the embedding only the token's row, unless it is also the
// output head) and TopK of each MoE layer's experts (all equal in size;
// packed, nearly: their average), with the experts bound.
func (m *Model) DecodeBytesPerToken() int64 {
	b := m.nonExpertBytes + m.expertBytes*int64(m.Config.TopK)/int64(max(1, m.Config.NumExperts))
	if e := m.Embed; len(e.Data) > 0 && (len(m.LMHead.Data) == 0 || &e.Data[0] != &m.LMHead.Data[0]) {
		b -= int64(len(e.Data) - e.DType.RowBytes(e.Cols))
	}
	return b
}

// ExpertTensors names the checkpoint tensors that hold one expert's
// weights, for readers of the raw checkpoint (the store): its gate, up
// and down matrices, or, stacked, the tensors that hold all of the
// layer's experts along their first dimension (gpt-oss: the expert's
// part of each is the e-th of NumExperts equal slices of its bytes).
func (m *Model) ExpertTensors(layer, expert int) (names []string, stacked bool) {
	if f := m.arch.stackedExperts; f != nil {
		return f(m.Config, layer), true
	}
	gate, up, down := m.arch.expertNames(layer, expert)
	return []string{gate, up, down}, false
}

// EmbeddingTensor is the name of the checkpoint's token embedding (which
// a node binds where it begins at the first layer, or where the output
// head is tied to it).
func (m *Model) EmbeddingTensor() string { return m.arch.embed }

// Close releases the memory-mapped checkpoint; the Model's matrices must
// not be used after.
func (m *Model) Close() error {
	if m.set == nil { // a quantized copy owns its memory
		return nil
	}
	err := m.set.Close()
	if m.arena != nil {
		err = errors.Join(err, m.arena.Close())
	}
	return err
}

// WeightsPacked is the BF16 bytes of the weights copied packed
// (LoadOptions.Weights: WeightsPacked) and their size packed: 0, 0 where
// none were.
func (m *Model) WeightsPacked() (bf16, packed int64) { return m.packedFrom, m.packedTo }

// WeightsInMemory is the bytes of weights copied into memory of the
// process's own (LoadOptions.Weights): 0 where they are mapped.
func (m *Model) WeightsInMemory() int64 {
	if m.arena == nil {
		return 0
	}
	return m.arena.Held()
}
