package model

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/odmoe/odmoe/kernels"
)

// Quantized returns a copy of m whose matrices are quantized to dt (F16,
// Q8 or NF4): the shadow node's model. The routers are kept at F16 at
// most (they are tiny and they are what the shadow predicts with), the
// embedding stays as stored (it is read a row at a time, not streamed),
// and norms stay float32. progress, if set, sees bytes of source weights
// done and the total. The copy owns all its memory (the embedding is
// copied): m may be closed once it returns.
func (m *Model) Quantized(dt kernels.DType, progress func(done, total int64)) (*Model, error) {
	return m.QuantizedWith(dt, nil, progress)
}

// ExpertReader gives routed experts one at a time, full precision:
// *store.Store does, from its compressed chunks (ReadExpert aliases dst).
type ExpertReader interface {
	ExpertBytes(layer, expert int) (int, error)
	ReadExpert(ctx context.Context, layer, expert int, dst []byte) (Expert, error)
}

// QuantizedWith is Quantized, where the experts of a held layer m was
// loaded without (LoadOptions.SkipExperts) are read from experts (nil:
// none, as Quantized; a typed nil is not none): a
// shadow whose experts came as a store's chunks (a third fewer bytes to
// fetch than their bf16 tensors). Each is read, quantized and let go in
// turn, so the copy's making holds a few experts at full precision at
// once, never a layer's. The result is the same as quantizing them bound
// from the checkpoint (a store's expert is its tensors' bytes).
func (m *Model) QuantizedWith(dt kernels.DType, experts ExpertReader, progress func(done, total int64)) (*Model, error) {
	switch dt {
	case kernels.F16, kernels.Q8, kernels.NF4:
	default:
		return nil, fmt.Errorf("model: quantize to %v: want F16, Q8 or NF4", dt)
	}
	q := *m
	q.arena = nil // m's copies: the quantized model's are its own
	q.Layers = make([]Layer, len(m.Layers))
	type job struct {
		dst    *kernels.Matrix
		src    kernels.Matrix
		dt     kernels.DType
		expert bool
		// derived: src is heap memory the model made at load (MLA's
		// transposed keys), not the checkpoint's mapping: never released
		derived bool
		// read, if set, is the expert (layer, index) to read from
		// experts into *into and quantize; readBytes its size
		read      *[2]int
		into      *Expert
		readBytes int64
	}
	var jobs []job
	var biasBytes int64 // fused experts' biases, copied as they are
	add := func(dst *kernels.Matrix, src kernels.Matrix, dt kernels.DType) {
		jobs = append(jobs, job{dst: dst, src: src, dt: dt})
	}
	routerDT := kernels.F16
	if len(m.LMHead.Data) > 0 {
		add(&q.LMHead, m.LMHead, dt)
	}
	for l := range m.Layers {
		src, dst := &m.Layers[l], &q.Layers[l]
		*dst = *src
		if !m.held.Contains(l) { // another stage's
			continue
		}
		sa, da := &src.Attention, &dst.Attention
		add(&da.Q, sa.Q, dt)
		add(&da.K, sa.K, dt)
		add(&da.V, sa.V, dt)
		add(&da.O, sa.O, dt)
		if sm := sa.MLA; sm != nil { // every projection of its own, the transposed keys too
			dm := *sm
			dm.uv = nil // row blocks of the quantized KVB
			da.MLA = &dm
			for _, p := range []struct{ dst, src *kernels.Matrix }{{&dm.QA, &sm.QA}, {&dm.QB, &sm.QB}, {&dm.KVA, &sm.KVA}, {&dm.KVB, &sm.KVB}} {
				add(p.dst, *p.src, dt)
			}
			jobs = append(jobs, job{dst: &dm.ukT, src: sm.ukT, dt: dt, derived: true})
		}
		if sd := src.Dense; sd != nil { // held with the non-expert weights
			dd := *sd
			dst.Dense = &dd
			add(&dd.MLP.Gate, sd.MLP.Gate, dt)
			add(&dd.MLP.Up, sd.MLP.Up, dt)
			add(&dd.MLP.Down, sd.MLP.Down, dt)
			continue
		}
		smoe := src.MoE
		dmoe := *smoe
		dst.MoE = &dmoe
		add(&dmoe.Router, smoe.Router, routerDT)
		if smoe.Shared != nil { // held with the non-expert weights
			sh := *smoe.Shared
			dmoe.Shared = &sh
			add(&sh.Gate, smoe.Shared.Gate, dt)
			add(&sh.Up, smoe.Shared.Up, dt)
			add(&sh.Down, smoe.Shared.Down, dt)
			add(&dmoe.SharedGate, smoe.SharedGate, routerDT)
		}
		if smoe.Experts == nil && experts != nil {
			dmoe.Experts = make([]Expert, m.Config.NumExperts)
			for e := range dmoe.Experts {
				n, err := experts.ExpertBytes(l, e)
				if err != nil {
					return nil, fmt.Errorf("model: quantizing layer %d expert %d: %w", l, e, err)
				}
				jobs = append(jobs, job{read: &[2]int{l, e}, into: &dmoe.Experts[e], readBytes: int64(n), dt: dt, expert: true})
			}
		}
		if smoe.Experts != nil {
			dmoe.Experts = make([]Expert, len(smoe.Experts))
			for e := range smoe.Experts {
				ex, sx := &dmoe.Experts[e], smoe.Experts[e]
				if sx.Fused() {
					// BF16 GateUp and Down are transposed copies, the
					// model's own memory (MXFP4 ones alias the checkpoint);
					// the biases (a row each) are copied as they are
					*ex = sx
					ex.GateUpBias, ex.DownBias = cloneMatrix(sx.GateUpBias), cloneMatrix(sx.DownBias)
					biasBytes += int64(len(ex.GateUpBias.Data) + len(ex.DownBias.Data))
					own := sx.GateUp.DType != kernels.MXFP4
					jobs = append(jobs, job{dst: &ex.GateUp, src: sx.GateUp, dt: dt, expert: true, derived: own},
						job{dst: &ex.Down, src: sx.Down, dt: dt, expert: true, derived: own})
					continue
				}
				jobs = append(jobs, job{dst: &ex.Gate, src: sx.Gate, dt: dt, expert: true}, job{dst: &ex.Up, src: sx.Up, dt: dt, expert: true},
					job{dst: &ex.Down, src: sx.Down, dt: dt, expert: true})
			}
		}
	}
	var total, done int64
	for _, j := range jobs {
		total += int64(j.src.Bytes()) + j.readBytes
	}
	// Quantize parallelises inside a matrix; a few matrices at once keep
	// the cores busy on the small ones too.
	var mu sync.Mutex
	var firstErr error
	next := make(chan job)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), 4) {
		wg.Go(func() {
			var buf []byte // an expert read from experts, full precision: one at a time
			for j := range next {
				mu.Lock()
				failed := firstErr != nil
				mu.Unlock()
				if failed { // the copy is lost: the rest is not worth reading
					continue
				}
				if j.read != nil {
					if int64(cap(buf)) < j.readBytes {
						buf = make([]byte, j.readBytes)
					}
					n, err := quantizeRead(experts, j.read[0], j.read[1], buf[:j.readBytes], j.dt, j.into)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					biasBytes += n
					done += j.readBytes
					if progress != nil {
						progress(done, total)
					}
					mu.Unlock()
					continue
				}
				qm, err := kernels.Quantize(j.dt, j.src)
				if m.set != nil && m.arena == nil && !j.derived {
					// done with these source bytes: quantizing a whole model
					// then holds about its copy, not the checkpoint too (a
					// copy in memory is the model's own, dropped at Close)
					release(j.src.Data)
					release(j.src.Scales)
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				*j.dst = qm
				done += int64(j.src.Bytes())
				if progress != nil {
					progress(done, total)
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, fmt.Errorf("model: quantizing to %v: %w", dt, firstErr)
	}
	// what the copy holds: the shared embedding and norms as before, the
	// quantized matrices at their new size
	q.expertBytes = biasBytes
	for _, j := range jobs {
		if j.read != nil {
			x := j.into
			q.expertBytes += int64(len(x.Gate.Data) + len(x.Up.Data) + len(x.GateUp.Data) + len(x.Down.Data))
			continue
		}
		if j.expert {
			q.expertBytes += int64(len(j.dst.Data))
		} else {
			q.nonExpertBytes += int64(len(j.dst.Data)) - int64(j.src.Bytes())
		}
	}
	if m.Config.TieEmbeddings && len(m.LMHead.Data) > 0 {
		q.nonExpertBytes += int64(len(m.LMHead.Data)) // LMHead no longer shares Embed's bytes
	}
	// the embedding is the one matrix kept as stored: copied, so that the
	// copy shares nothing with m's mapping, which the caller may close (a
	// shadow would otherwise keep the whole full-precision mapping
	// resident beside its quantized weights)
	q.Embed.Data = slices.Clone(m.Embed.Data)
	q.set = nil
	return &q, nil
}

// quantizeRead reads expert (layer, e) from r into buf (its size) and
// quantizes it to dt into *into, as Quantized does a bound one: its
// matrices at dt, a fused expert's biases copied as they are (their
// bytes returned); nothing of it keeps buf.
func quantizeRead(r ExpertReader, layer, e int, buf []byte, dt kernels.DType, into *Expert) (biases int64, err error) {
	x, err := r.ReadExpert(context.Background(), layer, e, buf)
	if err != nil {
		return 0, fmt.Errorf("layer %d expert %d from the expert store: %w (a store must hold every expert of the layers quantized: a worker's share lacks others')", layer, e, err)
	}
	q := x
	if x.Fused() {
		q.GateUpBias, q.DownBias = cloneMatrix(x.GateUpBias), cloneMatrix(x.DownBias)
		biases = int64(len(q.GateUpBias.Data) + len(q.DownBias.Data))
	}
	for _, p := range []struct{ dst, src *kernels.Matrix }{{&q.Gate, &x.Gate}, {&q.Up, &x.Up}, {&q.GateUp, &x.GateUp}, {&q.Down, &x.Down}} {
		if p.src.Rows == 0 {
			continue
		}
		if *p.dst, err = kernels.Quantize(dt, *p.src); err != nil {
			return 0, fmt.Errorf("layer %d expert %d: %w", layer, e, err)
		}
	}
	*into = q
	return biases, nil
}

// cloneMatrix copies m's bytes, for a copy that must own its memory.
func cloneMatrix(m kernels.Matrix) kernels.Matrix {
	m.Data = append([]byte(nil), m.Data...)
	return m
}
