package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
)

// ConvertOptions configure Convert.
type ConvertOptions struct {
	// Shards is K, the shards each tensor's streams are cut into: the unit
	// of parallel decoding (default DefaultShards). A tensor of fewer
	// than K elements gets one shard per element.
	Shards int
	// Parallelism is the number of encoding goroutines (default GOMAXPROCS).
	Parallelism int
	// Force replaces an existing store in the output directory.
	Force bool
	// Progress, if set, is called with the source bytes converted so far
	// and the total, from one goroutine.
	Progress func(done, total int64)

	blockElems int // exponent bytes per huff0 block; tests shrink it
}

// Convert builds the store of the Hugging Face checkpoint in modelDir in
// outDir. It streams the memory-mapped checkpoint tensor by tensor,
// encodes shards on all cores and writes into a temporary directory
// beside outDir that it renames into place only when the store is
// complete and synced: a crash never leaves a half-written store at
// outDir. An existing non-empty outDir is refused (ErrExist) unless
// opt.Force is set and it holds a store.
func Convert(ctx context.Context, modelDir, outDir string, opt ConvertOptions) error {
	m, err := model.Load(modelDir, model.LoadOptions{})
	if err != nil {
		return err
	}
	defer m.Close()
	set, err := safetensors.Open(modelDir)
	if err != nil {
		return err
	}
	defer set.Close()
	digests, err := checkpointDigests(modelDir, m, set)
	if err != nil {
		return err
	}
	id, err := identityWith(modelDir, m, set.Info, expertsDigest(digests))
	if err != nil {
		return err
	}
	b := build{identity: id, layers: m.Config.ExpertLayers(), experts: m.Config.NumExperts, form: FormSwiGLU}
	for _, l := range b.layers {
		for e := range b.experts {
			ex := m.Layers[l].MoE.Experts[e]
			if ex.Fused() {
				b.form, b.limit, b.alpha = FormClampedSwiGLU, ex.Limit, ex.Alpha
				b.tensors = append(b.tensors, source{l, e, W13, ex.GateUp}, source{l, e, W2, ex.Down},
					source{l, e, B13, ex.GateUpBias}, source{l, e, B2, ex.DownBias})
				continue
			}
			b.tensors = append(b.tensors,
				source{l, e, W1, ex.Gate}, source{l, e, W2, ex.Down}, source{l, e, W3, ex.Up})
		}
	}
	if err := writeStore(ctx, outDir, b, opt); err != nil {
		return err
	}
	// the digests say which expert differs when a checkpoint does not
	// match (Compare); the identity, in the index, already covers them
	return writeDigests(outDir, b.layers, b.experts, digests)
}

// build is what a store is written from: tensors in index order.
type build struct {
	identity     Identity
	layers       []int // the model layers that have experts, ascending
	experts      int
	form         Form // 0: FormSwiGLU
	limit, alpha float32
	tensors      []source
}

type source struct {
	layer, expert int
	kind          Kind
	m             kernels.Matrix
}

func writeStore(ctx context.Context, outDir string, b build, opt ConvertOptions) (err error) {
	k, p, blockElems := opt.Shards, opt.Parallelism, opt.blockElems
	if k <= 0 {
		k = DefaultShards
	}
	if p <= 0 {
		p = runtime.GOMAXPROCS(0)
	}
	if blockElems <= 0 {
		blockElems = defaultBlockElems
	}
	if k > maxShards {
		return fmt.Errorf("store: %d shards per tensor, at most %d", k, maxShards)
	}
	if b.form == 0 {
		b.form = FormSwiGLU
	}
	ix := &index{identity: b.identity, experts: b.experts, shards: k, blockElems: blockElems,
		form: b.form, limit: b.limit, alpha: b.alpha, tensors: make([]tensorEntry, len(b.tensors))}
	ix.setLayers(b.layers)
	var total int64
	for i, s := range b.tensors {
		if err := checkSource(s, i, b); err != nil {
			return err
		}
		t := &ix.tensors[i]
		*t = tensorEntry{layer: s.layer, expert: s.expert, kind: s.kind, dtype: s.m.DType, rows: s.m.Rows, cols: s.m.Cols}
		t.shards = make([]shardEntry, shardCount(t, k))
		total += int64(s.m.Bytes())
	}

	existing, err := checkOut(outDir, opt.Force)
	if err != nil {
		return err
	}
	parent := filepath.Dir(filepath.Clean(outDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, filepath.Base(filepath.Clean(outDir))+".tmp-")
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	if ix.chunkBytes, err = writeChunks(ctx, filepath.Join(tmp, ChunkFile), b, ix, p, total, opt.Progress); err != nil {
		return err
	}
	raw, err := ix.marshal()
	if err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(tmp, IndexFile), raw); err != nil {
		return err
	}
	return replaceDir(tmp, outDir, existing)
}

func checkSource(s source, i int, b build) error {
	ks := b.form.kinds()
	want, per := ks[i%len(ks)], len(ks)
	if slot := i / per / b.experts; slot >= len(b.layers) || s.layer != b.layers[slot] || s.expert != i/per%b.experts || s.kind != want {
		return fmt.Errorf("store: tensor %d is layer %d expert %d %v, out of order", i, s.layer, s.expert, s.kind)
	}
	if err := s.m.Validate(); err != nil {
		return fmt.Errorf("store: layer %d expert %d %v: %w", s.layer, s.expert, s.kind, err)
	}
	if _, err := dtypeCode(s.m.DType); err != nil {
		return err
	}
	if s.m.Rows > maxDim || s.m.Cols > maxDim || int64(s.m.Rows)*int64(s.m.Cols) > maxTensorElems {
		return fmt.Errorf("store: layer %d expert %d %v: shape %dx%d too large", s.layer, s.expert, s.kind, s.m.Rows, s.m.Cols)
	}
	return nil
}

// checkOut says whether outDir exists (then it is empty, or a store that
// Force allows replacing).
func checkOut(outDir string, force bool) (existing bool, err error) {
	st, err := os.Stat(outDir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("store: %w", err)
	}
	if !st.IsDir() {
		return false, fmt.Errorf("store: %s exists and is not a directory: %w", outDir, ErrExist)
	}
	entries, err := os.ReadDir(outDir)
	if err != nil {
		return false, fmt.Errorf("store: %w", err)
	}
	if len(entries) == 0 {
		return true, nil
	}
	if !force {
		return false, fmt.Errorf("store: %s exists (use -force to replace it): %w", outDir, ErrExist)
	}
	if _, err := os.Stat(filepath.Join(outDir, IndexFile)); err != nil {
		return false, fmt.Errorf("store: %s is not empty and holds no store; refusing to replace it: %w", outDir, ErrExist)
	}
	return true, nil
}

// replaceDir renames the finished tmp to outDir. An existing outDir is
// first renamed aside, so that at every instant one complete store (old or
// new) exists under some name.
func replaceDir(tmp, outDir string, existing bool) error {
	if existing {
		old, err := os.MkdirTemp(filepath.Dir(filepath.Clean(outDir)), filepath.Base(filepath.Clean(outDir))+".old-")
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		os.Remove(old)
		if err := os.Rename(outDir, old); err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if err := os.Rename(tmp, outDir); err != nil {
			os.Rename(old, outDir)
			return fmt.Errorf("store: %w", err)
		}
		os.RemoveAll(old)
	} else if err := os.Rename(tmp, outDir); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if d, err := os.Open(filepath.Dir(filepath.Clean(outDir))); err == nil {
		d.Sync() // make the rename durable; not every platform can sync a directory
		d.Close()
	}
	return nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// shardResult is one encoded shard.
type shardResult struct {
	exp, sm []byte
	hist    [256]uint64
	rawCRC  uint32
	raw     int // the shard's original bytes
	err     error
}

// writeChunks encodes every shard on p goroutines and writes the chunks in
// index order, filling in ix's shard entries; it returns the file size.
// At most 2p encoded shards wait to be written.
func writeChunks(ctx context.Context, path string, b build, ix *index, p int, total int64, progress func(int64, int64)) (size int64, err error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("store: %w", cerr)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(chunkHeader(ix.identity, ix.writeVersion()))
	off := int64(chunkHeaderLen)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	encoders := make(chan *encoder, p)
	for range p {
		encoders <- &encoder{}
	}
	pending := make(chan chan shardResult, 2*p)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // runs before wg.Wait: stops the producer on error
	wg.Go(func() {
		defer close(pending)
		for i, s := range b.tensors {
			t := &ix.tensors[i]
			es, data := elemSize(t.dtype), s.m.Data
			if len(s.m.Scales) > 0 { // the stream is the codes, then the scales
				data = append(append(make([]byte, 0, s.m.Bytes()), s.m.Data...), s.m.Scales...)
			}
			for sh := range t.shards {
				lo, hi := t.shardRange(sh)
				raw := data[lo*es : hi*es]
				var enc *encoder
				select {
				case enc = <-encoders:
				case <-ctx.Done():
					return
				}
				ch := make(chan shardResult, 1)
				select {
				case pending <- ch:
				case <-ctx.Done():
					encoders <- enc
					return
				}
				wg.Go(func() {
					r := shardResult{rawCRC: crc(raw), raw: len(raw)}
					r.exp, r.sm, r.err = enc.encodeShard(t.dtype, raw, ix.blockElems, &r.hist)
					if r.err != nil {
						r.err = &TensorError{Layer: t.layer, Expert: t.expert, Kind: t.kind, Shard: sh, Err: r.err}
					}
					encoders <- enc
					ch <- r
				})
			}
		}
	})

	var done int64
	for i := range ix.tensors {
		t := &ix.tensors[i]
		for sh := range t.shards {
			var r shardResult
			select {
			case ch, ok := <-pending:
				if !ok {
					return 0, fmt.Errorf("store: %w", ctx.Err())
				}
				r = <-ch
			case <-ctx.Done():
				return 0, fmt.Errorf("store: %w", ctx.Err())
			}
			if r.err != nil {
				return 0, r.err
			}
			if len(r.exp) > math.MaxUint32 || len(r.sm) > math.MaxUint32 {
				return 0, fmt.Errorf("store: layer %d expert %d %v shard %d: chunk over 4 GiB; use more shards", t.layer, t.expert, t.kind, sh)
			}
			e := &t.shards[sh]
			e.exp, e.expCRC = ChunkRef{Offset: off, Size: len(r.exp)}, crc(r.exp)
			off += int64(len(r.exp))
			e.sm, e.smCRC = ChunkRef{Offset: off, Size: len(r.sm)}, crc(r.sm)
			off += int64(len(r.sm))
			e.rawCRC = r.rawCRC
			for s, c := range r.hist {
				t.hist[s] += c
			}
			w.Write(r.exp)
			if _, err := w.Write(r.sm); err != nil {
				return 0, fmt.Errorf("store: %w", err)
			}
			done += int64(r.raw)
			if progress != nil {
				progress(done, total)
			}
		}
	}
	if err := w.Flush(); err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	return off, nil
}
