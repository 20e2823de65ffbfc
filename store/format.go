package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"

	"github.com/klauspost/compress/huff0"

	"github.com/odmoe/odmoe/kernels"
)

// The files of a store directory and the format version this build reads
// and writes. FORMAT.md is the specification; this file implements it.
const (
	IndexFile = "index.bin"
	ChunkFile = "chunks.bin"

	// Version is the newest store format version this build writes and
	// reads: a store of gpt-oss's experts (FormClampedSwiGLU) or of
	// experts in MXFP4 or F8E4M3. A store of SwiGLU experts in float
	// dtypes is written as version 2, which older builds read too. Version 1 (whose expert layers are 0..L-1: a version 1 index
	// is a version 2 index of a model with no dense layers) is read.
	Version = 3

	indexMagic = "ODMOEIDX"
	chunkMagic = "ODMOECHK"

	indexHeaderLen = 76 // versions 1 and 2; version 3 adds formBlockLen
	formBlockLen   = 12
	chunkHeaderLen = 48
	tensorFixedLen = 22
	histEntryLen   = 9
	shardRecordLen = 36

	// DefaultShards is K, the shards per tensor: 3 tensors x 8 shards =
	// 24 tasks per expert divide evenly over 2, 3, 4, 6 or 8 cores.
	DefaultShards = 8
	// defaultBlockElems is the exponent bytes per huff0 block: large
	// enough that the block's table costs nothing, small enough that the
	// decoded block stays in L2 while it is merged.
	defaultBlockElems = 64 << 10

	maxDim         = 1<<31 - 1
	maxLayers      = 1 << 16
	maxShards      = 1 << 12
	maxTensorElems = 1 << 40
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Kind is one of an expert's tensors: Mixtral's three names, and
// gpt-oss's fused matrix and biases.
type Kind uint8

// The expert tensors: out = w2(silu(w1 x) * w3 x), or gpt-oss's
// out = w2(ClampedSwiGLU(w13 x + b13)) + b2.
const (
	W1  Kind = 1 // gate, [intermediate, hidden]
	W2  Kind = 2 // down, [hidden, intermediate]
	W3  Kind = 3 // up,   [intermediate, hidden]
	W13 Kind = 4 // gate and up, rows interleaved: [2*intermediate, hidden]
	B13 Kind = 5 // w13's bias, [1, 2*intermediate]
	B2  Kind = 6 // w2's bias, [1, hidden]
)

// String is the tensor's name: w1, w2, w3, w13, b13 or b2.
func (k Kind) String() string {
	switch k {
	case W1, W2, W3:
		return fmt.Sprintf("w%d", uint8(k))
	case W13:
		return "w13"
	case B13:
		return "b13"
	case B2:
		return "b2"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Form is the kind of expert a store holds: which tensors each has.
type Form uint8

const (
	// FormSwiGLU: w1, w2, w3 (Mixtral, Qwen, OLMoE, DeepSeek-V3).
	FormSwiGLU Form = 1
	// FormClampedSwiGLU: w13, w2, b13, b2 and the activation's limit
	// and alpha (gpt-oss).
	FormClampedSwiGLU Form = 2
)

// kinds lists the form's tensors in index order; nil for an unknown form.
func (f Form) kinds() []Kind {
	switch f {
	case FormSwiGLU:
		return []Kind{W1, W2, W3}
	case FormClampedSwiGLU:
		return []Kind{W13, W2, B13, B2}
	}
	return nil
}

// readOrder is the order of an expert's tensors in ReadExpert's buffer:
// gate, up, down (as version 2 had it), or the index order.
func (f Form) readOrder() []Kind {
	if f == FormSwiGLU {
		return []Kind{W1, W3, W2}
	}
	return f.kinds()
}

// String names the form as FORMAT.md does.
func (f Form) String() string {
	switch f {
	case FormSwiGLU:
		return "swiglu"
	case FormClampedSwiGLU:
		return "clamped-swiglu"
	}
	return fmt.Sprintf("Form(%d)", uint8(f))
}

// dtype codes as stored in the index (independent of kernels' numbering).
const (
	codeBF16  = 1
	codeF16   = 2
	codeF32   = 3
	codeMXFP4 = 4 // version 3
	codeF8    = 5 // version 3
)

func dtypeCode(d kernels.DType) (uint8, error) {
	switch d {
	case kernels.BF16:
		return codeBF16, nil
	case kernels.F16:
		return codeF16, nil
	case kernels.F32:
		return codeF32, nil
	case kernels.MXFP4:
		return codeMXFP4, nil
	case kernels.F8E4M3:
		return codeF8, nil
	}
	return 0, fmt.Errorf("store: unsupported dtype %v", d)
}

func dtypeOf(code uint8) (kernels.DType, bool) {
	switch code {
	case codeBF16:
		return kernels.BF16, true
	case codeF16:
		return kernels.F16, true
	case codeF32:
		return kernels.F32, true
	case codeMXFP4:
		return kernels.MXFP4, true
	case codeF8:
		return kernels.F8E4M3, true
	}
	return 0, false
}

// smWidth is the sign+mantissa bytes stored raw per element; the other
// byte of each element is the entropy-coded "exponent" byte.
func smWidth(d kernels.DType) int { return elemSize(d) - 1 }

// elemSize is the bytes of one element of a tensor's stream: a float
// dtype's size, or 1 for MXFP4 and F8E4M3, whose stream is their bytes
// (codes, then scales), each coded whole.
func elemSize(d kernels.DType) int {
	if d.HasScales() {
		return 1
	}
	return d.Size()
}

// ChunkRef locates one chunk in the chunk file.
type ChunkRef struct {
	Offset int64
	Size   int
}

// index is the parsed index file.
type index struct {
	identity Identity
	version  uint32 // the format version read (written: writeVersion)
	// layers lists the model layers that have experts, ascending (every
	// layer but the dense ones); slot maps a layer to its position there,
	// -1 for a dense layer.
	layers     []int
	slot       []int
	experts    int
	shards     int // K as requested at conversion
	blockElems int
	chunkBytes int64 // exact size of the chunk file
	// form is the experts' kind; limit and alpha are
	// FormClampedSwiGLU's activation's
	form         Form
	limit, alpha float32
	tensors      []tensorEntry
}

// tensorEntry describes one tensor; its position in index.tensors is
// (slot[layer]*experts + expert)*T + the kind's place in form.kinds(),
// T tensors per expert.
type tensorEntry struct {
	layer, expert int
	kind          Kind
	dtype         kernels.DType
	rows, cols    int
	hist          [256]uint64 // exponent-byte histogram, for the entropy bound
	shards        []shardEntry
}

type shardEntry struct {
	exp, sm               ChunkRef
	expCRC, smCRC, rawCRC uint32
}

// elems is the elements of the tensor's stream: rows*cols, or an MXFP4
// or F8E4M3 matrix's bytes (its codes, then its scales).
func (t *tensorEntry) elems() int {
	if t.dtype.HasScales() {
		return t.codeBytes() + kernels.ScalesBytes(t.dtype, t.rows, t.cols)
	}
	return t.rows * t.cols
}

// codeBytes is the size of a scaled dtype's codes, before its scales.
func (t *tensorEntry) codeBytes() int { return t.rows * t.dtype.RowBytes(t.cols) }

func (t *tensorEntry) bytes() int { return t.elems() * elemSize(t.dtype) }

// matrix is the tensor over its decoded bytes b (bytes() long): an MXFP4
// matrix's codes first, then its scales.
func (t *tensorEntry) matrix(b []byte) kernels.Matrix {
	m := kernels.Matrix{DType: t.dtype, Rows: t.rows, Cols: t.cols, Data: b}
	if n := t.codeBytes(); t.dtype.HasScales() {
		m.Data, m.Scales = b[:n:n], b[n:]
	}
	return m
}

// shardRange returns shard i's element range [lo, hi).
func shardRange(n, shards, i int) (lo, hi int) {
	return int(int64(i) * int64(n) / int64(shards)), int(int64(i+1) * int64(n) / int64(shards))
}

// shardCount is the number of shards tensor t gets: K, or fewer where
// a shard would hold less than minShardElems (a tiny expert's 32K-element
// tensor in 8 shards cost 24 chunk reads, checksums and huff0 tables a
// load, 0.35 ms of CPU against its 0.03 ms of compute); one for a bias (a
// row of a few thousand elements, decoded in microseconds: more shards
// would cost more in chunk headers and tables than they save); and for
// MXFP4 and F8E4M3, its codes' shards and one more for its scales
// (shardRange). Readers take the count each tensor's index entry gives.
func shardCount(t *tensorEntry, k int) int {
	n := t.elems()
	switch {
	case t.kind == B13 || t.kind == B2:
		return min(n, 1)
	case t.dtype.HasScales() && n > 0:
		codes := t.codeBytes()
		return min(codes, k, max(1, codes/minShardElems)) + 1
	}
	return min(n, k, max(1, n/minShardElems))
}

// minShardElems is the fewest elements a shard is cut to hold (but a
// tensor's only one): below it, a shard's chunk read, checksum and huff0
// table cost more than decoding it in parallel saves.
const minShardElems = 64 << 10

// shardRange is the element range [lo, hi) of t's shard i: an even split
// of its elements, except that an MXFP4 or F8E4M3 tensor of two shards
// or more keeps its scales (far fewer distinct values than the codes) in
// its last shard, coded apart from the codes, which the others split
// evenly.
func (t *tensorEntry) shardRange(i int) (lo, hi int) {
	s := len(t.shards)
	if t.dtype.HasScales() && s >= 2 {
		codes := t.codeBytes()
		if i == s-1 {
			return codes, t.elems()
		}
		return shardRange(codes, s-1, i)
	}
	return shardRange(t.elems(), s, i)
}

func (ix *index) find(layer, expert int, kind Kind) (*tensorEntry, error) {
	ks := ix.form.kinds()
	k := slices.Index(ks, kind)
	if layer < 0 || layer >= len(ix.slot) || ix.slot[layer] < 0 || expert < 0 || expert >= ix.experts || k < 0 {
		return nil, fmt.Errorf("store: layer %d expert %d %v: %w (store has experts 0..%d of layers %s, each %v)",
			layer, expert, kind, ErrNotFound, ix.experts-1, layerList(ix.layers), ks)
	}
	return &ix.tensors[(ix.slot[layer]*ix.experts+expert)*len(ks)+k], nil
}

// writeVersion is the format version the index is written in: 2 for
// SwiGLU experts in the float dtypes (which builds before version 3 read
// too), else 3 (gpt-oss's form, or MXFP4 or F8E4M3 tensors).
func (ix *index) writeVersion() uint32 {
	if ix.form != FormSwiGLU {
		return Version
	}
	for i := range ix.tensors {
		if ix.tensors[i].dtype.HasScales() {
			return Version
		}
	}
	return 2
}

// setLayers records the expert layers and their slots.
func (ix *index) setLayers(layers []int) {
	ix.layers = layers
	ix.slot = make([]int, 0)
	if n := len(layers); n > 0 {
		ix.slot = make([]int, layers[n-1]+1)
	}
	for i := range ix.slot {
		ix.slot[i] = -1
	}
	for i, l := range layers {
		ix.slot[l] = i
	}
}

// layerList writes layers compactly: "0..5" when they run without gaps.
func layerList(layers []int) string {
	if n := len(layers); n > 0 && layers[n-1]-layers[0] == n-1 {
		return fmt.Sprintf("%d..%d", layers[0], layers[n-1])
	}
	return fmt.Sprint(layers)
}

// marshal encodes the index, checksum last.
func (ix *index) marshal() ([]byte, error) {
	le := binary.LittleEndian
	b := make([]byte, 0, indexHeaderLen+len(ix.tensors)*(tensorFixedLen+ix.shards*shardRecordLen+32*histEntryLen)+4)
	b = append(b, indexMagic...)
	b = le.AppendUint32(b, ix.writeVersion())
	b = le.AppendUint32(b, 0) // flags
	b = append(b, ix.identity[:]...)
	b = le.AppendUint32(b, uint32(len(ix.layers)))
	b = le.AppendUint32(b, uint32(ix.experts))
	b = le.AppendUint32(b, uint32(ix.shards))
	b = le.AppendUint32(b, uint32(ix.blockElems))
	b = le.AppendUint64(b, uint64(ix.chunkBytes))
	b = le.AppendUint32(b, uint32(len(ix.tensors)))
	if ix.writeVersion() >= 3 {
		b = append(b, byte(ix.form), 0, 0, 0)
		b = le.AppendUint32(b, math.Float32bits(ix.limit))
		b = le.AppendUint32(b, math.Float32bits(ix.alpha))
	}
	for i := range ix.tensors {
		t := &ix.tensors[i]
		code, err := dtypeCode(t.dtype)
		if err != nil {
			return nil, err
		}
		b = le.AppendUint32(b, uint32(t.layer))
		b = le.AppendUint32(b, uint32(t.expert))
		b = append(b, byte(t.kind), code)
		b = le.AppendUint16(b, uint16(len(t.shards)))
		b = le.AppendUint32(b, uint32(t.rows))
		b = le.AppendUint32(b, uint32(t.cols))
		nh := 0
		for _, c := range t.hist {
			if c > 0 {
				nh++
			}
		}
		b = le.AppendUint16(b, uint16(nh))
		for s, c := range t.hist {
			if c > 0 {
				b = append(b, byte(s))
				b = le.AppendUint64(b, c)
			}
		}
		for _, s := range t.shards {
			b = le.AppendUint64(b, uint64(s.exp.Offset))
			b = le.AppendUint32(b, uint32(s.exp.Size))
			b = le.AppendUint32(b, s.expCRC)
			b = le.AppendUint64(b, uint64(s.sm.Offset))
			b = le.AppendUint32(b, uint32(s.sm.Size))
			b = le.AppendUint32(b, s.smCRC)
			b = le.AppendUint32(b, s.rawCRC)
		}
	}
	return le.AppendUint32(b, crc(b)), nil
}

// parseIndex decodes and validates an index: every count, shape and
// extent is checked, so a reader never indexes out of range on a
// malformed file. The version is checked before the checksum, so a newer
// format reports its version rather than a checksum failure.
func parseIndex(b []byte) (*index, error) {
	le := binary.LittleEndian
	if len(b) < indexHeaderLen+4 || string(b[:8]) != indexMagic {
		return nil, fmt.Errorf("not an odmoe store index: %w", ErrCorrupt)
	}
	version := le.Uint32(b[8:])
	if version < 1 || version > Version {
		return nil, fmt.Errorf("format version %d, this build reads versions 1 to %d: %w", version, Version, ErrVersion)
	}
	body := b[:len(b)-4]
	if got, want := crc(body), le.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("index checksum %08x, stored %08x: %w", got, want, ErrCorrupt)
	}
	r := reader{b: body, off: 16}
	ix := &index{}
	copy(ix.identity[:], r.next(32))
	layers := int(r.u32())
	ix.experts = int(r.u32())
	ix.shards = int(r.u32())
	ix.blockElems = int(r.u32())
	ix.chunkBytes = int64(r.u64())
	count := int(r.u32())
	ix.form = FormSwiGLU
	if version >= 3 {
		form := r.next(4)
		ix.form = Form(form[0])
		ix.limit, ix.alpha = math.Float32frombits(r.u32()), math.Float32frombits(r.u32())
		switch {
		case ix.form.kinds() == nil || form[1]|form[2]|form[3] != 0:
			return nil, fmt.Errorf("index: unknown expert form %d (%x): %w", form[0], form, ErrCorrupt)
		case ix.form == FormClampedSwiGLU && !(ix.limit > 0 && ix.alpha > 0 && !math.IsInf(float64(ix.alpha), 0)):
			return nil, fmt.Errorf("index: clamped SwiGLU with limit %v and alpha %v: %w", ix.limit, ix.alpha, ErrCorrupt)
		}
	}
	per := len(ix.form.kinds())
	switch {
	case layers < 1 || layers > maxLayers || ix.experts < 1 || ix.experts > 1<<16:
		return nil, fmt.Errorf("index: %d layers x %d experts: %w", layers, ix.experts, ErrCorrupt)
	case count != layers*ix.experts*per:
		return nil, fmt.Errorf("index: %d tensors for %d layers x %d experts of %d: %w", count, layers, ix.experts, per, ErrCorrupt)
	case count > len(body)/tensorFixedLen:
		return nil, fmt.Errorf("index: %d tensors do not fit in %d bytes: %w", count, len(body), ErrCorrupt)
	case ix.shards < 1 || ix.shards > maxShards:
		return nil, fmt.Errorf("index: %d shards per tensor: %w", ix.shards, ErrCorrupt)
	case ix.blockElems < 1 || ix.blockElems > huff0.BlockSizeMax:
		return nil, fmt.Errorf("index: block of %d elements: %w", ix.blockElems, ErrCorrupt)
	case ix.chunkBytes < chunkHeaderLen || ix.chunkBytes > math.MaxInt64/2:
		return nil, fmt.Errorf("index: chunk file of %d bytes: %w", ix.chunkBytes, ErrCorrupt)
	}
	ix.tensors = make([]tensorEntry, count)
	ids := make([]int, 0, layers)
	for i := range ix.tensors {
		if err := r.tensor(ix, i, version, &ids); err != nil {
			return nil, err
		}
	}
	ix.setLayers(ids)
	ix.version = version
	if r.err == nil && r.off != len(body) {
		return nil, fmt.Errorf("index: %d stray bytes after the last tensor: %w", len(body)-r.off, ErrCorrupt)
	}
	if r.err != nil {
		return nil, r.err
	}
	return ix, nil
}

// reader reads little-endian fields; past the end it records ErrCorrupt
// and returns zeros.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) next(n int) []byte {
	if r.err != nil || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = fmt.Errorf("index: ends inside a record: %w", ErrCorrupt)
		}
		return make([]byte, n)
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.next(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.next(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.next(8)) }

// tensor reads record i. The first record of each expert layer names
// that layer (version 1: the layer's position; version 2: any layer
// above the one before); ids collects them.
func (r *reader) tensor(ix *index, i int, version uint32, ids *[]int) error {
	t := &ix.tensors[i]
	ks := ix.form.kinds()
	wantKind := ks[i%len(ks)]
	wantExpert := i / len(ks) % ix.experts
	slot := i / len(ks) / ix.experts
	t.layer, t.expert = int(r.u32()), int(r.u32())
	if slot == len(*ids) {
		next := slot // version 1
		if version >= 2 {
			next = -1 // out of order: the check below fails
			if t.layer < maxLayers && (slot == 0 || t.layer > (*ids)[slot-1]) {
				next = t.layer
			}
		}
		*ids = append(*ids, next)
	}
	wantLayer := (*ids)[slot]
	kind, code := r.next(1)[0], r.next(1)[0]
	t.kind = Kind(kind)
	nShards := int(r.u16())
	rows, cols := int64(r.u32()), int64(r.u32())
	nHist := int(r.u16())
	if r.err != nil {
		return r.err
	}
	name := fmt.Sprintf("index: tensor %d (layer %d expert %d %v)", i, t.layer, t.expert, t.kind)
	var ok bool
	t.dtype, ok = dtypeOf(code)
	if rows > maxDim || cols > maxDim || rows*cols > maxTensorElems || rows*cols*4 > math.MaxInt {
		return fmt.Errorf("%s: shape %dx%d too large: %w", name, rows, cols, ErrCorrupt)
	}
	t.rows, t.cols = int(rows), int(cols)
	switch {
	case t.layer != wantLayer || t.expert != wantExpert || t.kind != wantKind:
		return fmt.Errorf("%s: out of order, want layer %d expert %d %v: %w", name, wantLayer, wantExpert, wantKind, ErrCorrupt)
	case !ok || (t.dtype.HasScales() && version < 3):
		return fmt.Errorf("%s: unknown dtype code %d: %w", name, code, ErrCorrupt)
	case t.dtype == kernels.MXFP4 && t.cols%32 != 0:
		return fmt.Errorf("%s: MXFP4 rows of %d weights, not whole blocks of 32: %w", name, t.cols, ErrCorrupt)
	case nShards > t.elems() || (t.elems() > 0 && nShards == 0):
		return fmt.Errorf("%s: %d shards for %d elements: %w", name, nShards, t.elems(), ErrCorrupt)
	}
	var total uint64
	last := -1
	for range nHist {
		sym := int(r.next(1)[0])
		c := r.u64()
		if r.err != nil {
			return r.err
		}
		if sym <= last || c == 0 || c > maxTensorElems {
			return fmt.Errorf("%s: bad histogram entry: %w", name, ErrCorrupt)
		}
		last = sym
		t.hist[sym] = c
		total += c
	}
	if total != uint64(t.elems()) {
		return fmt.Errorf("%s: histogram counts %d symbols, tensor has %d: %w", name, total, t.elems(), ErrCorrupt)
	}
	if nShards > (len(r.b)-r.off)/shardRecordLen {
		return fmt.Errorf("%s: %d shard records do not fit: %w", name, nShards, ErrCorrupt)
	}
	t.shards = make([]shardEntry, nShards)
	for s := range t.shards {
		sh := &t.shards[s]
		sh.exp = ChunkRef{Offset: int64(r.u64()), Size: int(r.u32())}
		sh.expCRC = r.u32()
		sh.sm = ChunkRef{Offset: int64(r.u64()), Size: int(r.u32())}
		sh.smCRC = r.u32()
		sh.rawCRC = r.u32()
		if r.err != nil {
			return r.err
		}
		lo, hi := t.shardRange(s)
		blocks := (hi - lo + ix.blockElems - 1) / ix.blockElems
		switch {
		case sh.sm.Size != (hi-lo)*smWidth(t.dtype):
			return fmt.Errorf("%s shard %d: sign-mantissa chunk of %d bytes for %d elements: %w", name, s, sh.sm.Size, hi-lo, ErrCorrupt)
		case sh.exp.Size < blocks*blockHeaderLen:
			return fmt.Errorf("%s shard %d: exponent chunk of %d bytes for %d blocks: %w", name, s, sh.exp.Size, blocks, ErrCorrupt)
		case !within(sh.exp, ix.chunkBytes) || !within(sh.sm, ix.chunkBytes):
			return fmt.Errorf("%s shard %d: chunk outside the %d-byte chunk file: %w", name, s, ix.chunkBytes, ErrCorrupt)
		}
	}
	return nil
}

func within(c ChunkRef, size int64) bool {
	return c.Offset >= chunkHeaderLen && c.Size >= 0 && c.Offset <= size && int64(c.Size) <= size-c.Offset
}

// chunkHeader is the first chunkHeaderLen bytes of the chunk file.
func chunkHeader(id Identity, version uint32) []byte {
	b := make([]byte, 0, chunkHeaderLen)
	b = append(b, chunkMagic...)
	b = binary.LittleEndian.AppendUint32(b, version)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, id[:]...)
}
