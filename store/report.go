package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/odmoe/odmoe/internal/progress"
	"github.com/odmoe/odmoe/kernels"
)

// Report summarizes a store: sizes per tensor kind and in total, next to
// the Shannon entropy bound of the exponent stream.
type Report struct {
	Identity                    Identity
	Version                     uint32 // the format version it was written in
	Layers                      []int  // the layers with experts
	Experts, Shards, BlockElems int
	IndexBytes, ChunkFileBytes  int64
	Chunks                      int
	DTypes                      []kernels.DType // the dtypes of the expert tensors
	Form                        Form
	Kinds                       []KindReport // one per tensor of the form, in index order (w1, w2, w3)
	Total                       KindReport
}

// KindReport is the sizes of one tensor kind (or all of them).
type KindReport struct {
	Name              string // "w1", "w2", "w3" (or the form's others) or "total"
	Tensors           int
	Elements          int64
	OriginalBytes     int64
	ExponentBytes     int64 // coded exponent chunks, block headers and tables included
	SignMantissaBytes int64 // raw sign-mantissa chunks
	// EntropyBits is the Shannon entropy of the exponent bytes in bits
	// per element, over all tensors of the kind taken together.
	EntropyBits float64
}

// StoredBytes is the size of the kind's chunks.
func (k KindReport) StoredBytes() int64 { return k.ExponentBytes + k.SignMantissaBytes }

// BoundBytes is the entropy bound: exponents coded at EntropyBits each,
// sign and mantissa raw.
func (k KindReport) BoundBytes() float64 {
	return float64(k.Elements)*k.EntropyBits/8 + float64(k.SignMantissaBytes)
}

// Ratio is stored size over original size.
func (k KindReport) Ratio() float64 { return frac(float64(k.StoredBytes()), float64(k.OriginalBytes)) }

// BoundRatio is the entropy bound over the original size.
func (k KindReport) BoundRatio() float64 { return frac(k.BoundBytes(), float64(k.OriginalBytes)) }

// Overhead is how far the stored size is above the bound (0.01 = 1%).
func (k KindReport) Overhead() float64 { return frac(float64(k.StoredBytes()), k.BoundBytes()) - 1 }

func frac(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Report computes the store's summary from its index.
func (s *Store) Report() Report {
	ix := s.ix
	ks := ix.form.kinds()
	r := Report{Identity: ix.identity, Version: ix.version, Layers: ix.layers, Experts: ix.experts, Shards: ix.shards,
		BlockElems: ix.blockElems, IndexBytes: int64(len(s.raw)), ChunkFileBytes: ix.chunkBytes,
		Form: ix.form, Kinds: make([]KindReport, len(ks))}
	hists := make([][256]uint64, len(ks)+1) // each kind's, then the total's
	for i := range ix.tensors {
		t := &ix.tensors[i]
		r.Chunks += 2 * len(t.shards)
		if !slices.Contains(r.DTypes, t.dtype) {
			r.DTypes = append(r.DTypes, t.dtype)
		}
		for _, k := range []int{slices.Index(ks, t.kind), len(ks)} {
			kr := &r.Total
			if k < len(ks) {
				kr = &r.Kinds[k]
			}
			kr.Tensors++
			kr.Elements += int64(t.elems())
			kr.OriginalBytes += int64(t.bytes())
			for _, sh := range t.shards {
				kr.ExponentBytes += int64(sh.exp.Size)
				kr.SignMantissaBytes += int64(sh.sm.Size)
			}
			for sym, c := range t.hist {
				hists[k][sym] += c
			}
		}
	}
	for k := range hists {
		kr := &r.Total
		if k < len(ks) {
			kr = &r.Kinds[k]
			kr.Name = ks[k].String()
		} else {
			kr.Name = "total"
		}
		kr.EntropyBits = entropy(&hists[k])
	}
	return r
}

// entropy is the Shannon entropy of a histogram in bits per symbol.
func entropy(h *[256]uint64) float64 {
	var n float64
	for _, c := range h {
		n += float64(c)
	}
	var bits float64
	for _, c := range h {
		if c > 0 {
			p := float64(c) / n
			bits -= p * math.Log2(p)
		}
	}
	return bits
}

// maxVerifyErrors bounds the failures Verify lists.
const maxVerifyErrors = 50

// Verify re-reads every chunk of every expert, checks every chunk
// checksum, decodes it and checks the decoded bytes against the checksum
// of the original weights. It goes on past failures and returns them all
// (up to 50, in index order) joined; progress, if set, gets the original
// bytes verified so far and the total.
func (s *Store) Verify(ctx context.Context, progress func(done, total int64)) error {
	var total, done int64
	maxExpert := 0
	for _, l := range s.ix.layers {
		for e := range s.ix.experts {
			n, _ := s.ExpertBytes(l, e)
			total += int64(n)
			maxExpert = max(maxExpert, n)
		}
	}
	buf := make([]byte, maxExpert)
	var errs []error
	for _, l := range s.ix.layers {
		for e := range s.ix.experts {
			var tasks []task
			off := 0
			for _, k := range s.ix.form.kinds() {
				t, _ := s.ix.find(l, e, k)
				tasks = appendTasks(tasks, t, buf[off:off+t.bytes()])
				off += t.bytes()
			}
			if err := s.run(ctx, tasks, true, true); err != nil {
				if ctx.Err() != nil {
					return errors.Join(append(errs, ctx.Err())...)
				}
				if u, ok := err.(interface{ Unwrap() []error }); ok {
					errs = append(errs, u.Unwrap()...)
				} else {
					errs = append(errs, err)
				}
				if len(errs) >= maxVerifyErrors {
					return errors.Join(append(errs[:maxVerifyErrors], errors.New("store: too many failures, stopped"))...)
				}
			}
			done += int64(off)
			if progress != nil {
				progress(done, total)
			}
		}
	}
	return errors.Join(errs...)
}

// WriteText prints the report as `odmoe inspect` shows it: the store in
// dir (the model it was checked against, modelDir, if any), its format,
// files and a table of each tensor kind's compression next to its
// entropy bound.
func (r Report) WriteText(w io.Writer, dir, modelDir string) {
	var dts []string
	for _, d := range r.DTypes {
		dts = append(dts, d.String())
	}
	fmt.Fprintf(w, "store    %s\n", dir)
	fmt.Fprintf(w, "format   version %d, %d shards per tensor at most (of 64K elements at least), %d-element huff0 blocks\n", r.Version, r.Shards, r.BlockElems)
	model := r.Identity.String()
	if modelDir != "" {
		model += " (matches " + modelDir + ")"
	}
	fmt.Fprintf(w, "model    %s\n", model)
	fmt.Fprintf(w, "experts  %d layers x %d experts, %s, %v\n", len(r.Layers), r.Experts, strings.Join(dts, ", "), r.Form)
	if n := len(r.Layers); r.Layers[n-1] != n-1 {
		fmt.Fprintf(w, "layers   %v have experts; the others are dense\n", r.Layers)
	}
	fmt.Fprintf(w, "files    %s index, %s chunks (%d chunks)\n\n", progress.Bytes(r.IndexBytes), progress.Bytes(r.ChunkFileBytes), r.Chunks)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tensor\ttensors\toriginal\tstored\tratio\tentropy bound\tover bound\texponent bits\tentropy bits\t")
	for _, k := range append(r.Kinds, r.Total) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.4f\t%.4f\t%+.2f%%\t%.3f\t%.3f\t\n", k.Name, k.Tensors,
			progress.Bytes(k.OriginalBytes), progress.Bytes(k.StoredBytes()), k.Ratio(), k.BoundRatio(), 100*k.Overhead(),
			bitsPer(k.ExponentBytes, k.Elements), k.EntropyBits)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nratio and entropy bound are fractions of the original size; exponent bits is what the")
	fmt.Fprintln(w, "coder spends per element on the exponent stream (tables and block headers included).")
}

func bitsPer(bytes, elems int64) float64 {
	if elems == 0 {
		return 0
	}
	return float64(bytes) * 8 / float64(elems)
}
