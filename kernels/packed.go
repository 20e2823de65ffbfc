package kernels

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
)

// BF16P ("BF16, packed") holds a BF16 matrix losslessly in 13 bits a
// weight instead of 16, for the row kernels of a memory-bound decode to
// read 0.81 of the bytes. A weight's low byte (the last exponent bit and
// the 7 mantissa bits) is kept as it is; its high byte (sign and the
// exponent's top 7 bits), of which trained and initialised weights use a
// few dozen values (ZipMoE's exponent entropy of ~2.6 bits), becomes a
// 5-bit code into a table of the matrix's 32 most frequent high bytes.
//
// A row is whole blocks of 64 weights (Cols a multiple of 64), each block
// 104 bytes: 40 bytes of codes, code p at bits [5p, 5p+5) little-endian,
// then 64 low bytes, byte p. Position p = 16L + 8h + 2d + o (L, d < 4;
// h, o < 2) holds the weight 16k + 4L + d of the block, k = 2h + o: the
// order in which the AVX-512 kernel's byte interleave (h) and its 16-bit
// shift or mask (o) give back weights 16k to 16k+15 as the k-th 16 lanes.
//
// Matrix.Scales holds the table, twice (64 bytes: a code's sixth bit does
// not matter), a little-endian uint32 count of exception rows, their
// indices (uint32, ascending), and their weights as BF16 (Cols each): a
// row with a high byte outside the table is stored in the blocks too
// (codes of 0 there) but computed from its BF16 copy. PackBF16 refuses a
// matrix where more than an eighth of the rows are exceptions, so a
// packed matrix takes at most 15/16 of its BF16 bytes, 68 bytes of table
// and count, and 4 bytes an exception row: smaller than its BF16 but for
// a handful of rows.
const BF16P DType = F8E4M3 + 1

const (
	packedBlock      = 64  // weights a block
	packedBlockBytes = 104 // 40 bytes of 5-bit codes, 64 low bytes
	packedCodeBytes  = 40
	packedTableBytes = 64
)

// packedConsts are the AVX-512 kernel's byte gather (qword i of a block's
// codes takes its bytes 5i to 5i+7) and bit selection (byte m of a qword
// takes the 8 bits from 5m): with them a block's 64 codes become 64 bytes.
var packedConsts = func() (c [2][64]byte) {
	for i := range 8 {
		for m := range 8 {
			c[0][8*i+m] = byte(5*i + m)
			c[1][8*i+m] = byte(5 * m)
		}
	}
	return c
}()

// packedOrder is packedWeight of every position.
var packedOrder = func() (o [packedBlock]uint8) {
	for p := range o {
		o[p] = uint8(packedWeight(p))
	}
	return o
}()

// packedWeight returns the weight of a block that position p holds.
func packedWeight(p int) int {
	r := p & 15
	return 16*(2*(r>>3)+r&1) + 4*(p>>4) + (r&7)>>1
}

// PackBF16 returns m (BF16) as BF16P, its Data and Scales in memory from
// alloc (make where alloc is nil), or false, allocating nothing, where m
// is not BF16, its columns are not whole blocks of 64 or more than an
// eighth of its rows hold a high byte outside the 32 most frequent. An
// error is alloc's.
func PackBF16(m Matrix, alloc func(n int) ([]byte, error)) (Matrix, bool, error) {
	if m.DType != BF16 || m.Cols == 0 || m.Cols%packedBlock != 0 || m.Rows == 0 || m.Validate() != nil {
		return Matrix{}, false, nil
	}
	rows, cols := m.Rows, m.Cols
	w := u16View(m.Data)[:rows*cols]
	// one pass counts the high bytes, for the table, and notes which
	// each row holds, for its exception rows
	chunks := ParallelChunks(rows, rows*cols)
	counts := make([][256]int, chunks)
	held := make([][4]uint64, rows)
	ParallelFor(chunks, rows, func(c, r0, r1 int) {
		n := &counts[c]
		for r := r0; r < r1; r++ {
			var set [4]uint64
			for _, v := range w[r*cols : (r+1)*cols] {
				h := v >> 8
				n[h]++
				set[h>>6] |= 1 << (h & 63)
			}
			held[r] = set
		}
	})
	var freq [256]int
	for c := range counts {
		for h, n := range counts[c] {
			freq[h] += n
		}
	}
	order := make([]int, 256)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return freq[b] - freq[a] })
	var code [256]uint8 // a high byte outside the table: 0, its row an exception
	var inTable [4]uint64
	var table [packedTableBytes]byte
	for i, hi := range order[:32] {
		if freq[hi] > 0 {
			code[hi] = uint8(i)
			inTable[hi>>6] |= 1 << (hi & 63)
			table[i], table[i+32] = byte(hi), byte(hi)
		}
	}
	var exceptions []int
	for r, set := range held {
		if set[0]&^inTable[0]|set[1]&^inTable[1]|set[2]&^inTable[2]|set[3]&^inTable[3] != 0 {
			exceptions = append(exceptions, r)
		}
	}
	if len(exceptions)*8 > rows {
		return Matrix{}, false, nil
	}
	if alloc == nil {
		alloc = func(n int) ([]byte, error) { return make([]byte, n), nil }
	}
	data, err := alloc(rows * BF16P.RowBytes(cols))
	if err != nil {
		return Matrix{}, false, err
	}
	scales, err := alloc(packedTableBytes + 4 + len(exceptions)*(4+2*cols))
	if err != nil {
		return Matrix{}, false, err
	}
	copy(scales, table[:])
	binary.LittleEndian.PutUint32(scales[packedTableBytes:], uint32(len(exceptions)))
	idx := scales[packedTableBytes+4:]
	raw := idx[4*len(exceptions):]
	for i, r := range exceptions {
		binary.LittleEndian.PutUint32(idx[4*i:], uint32(r))
		copy(raw[2*cols*i:2*cols*(i+1)], m.Data[2*cols*r:2*cols*(r+1)])
	}
	blocks := rows * cols / packedBlock
	ParallelFor(ParallelChunks(blocks, rows*cols), blocks, func(_, b0, b1 int) {
		for b := b0; b < b1; b++ {
			src := (*[packedBlock]uint16)(w[b*packedBlock:])
			blk := (*[packedBlockBytes]byte)(data[b*packedBlockBytes:])
			for i := range 8 {
				var q uint64
				for m := range 8 {
					v := src[packedOrder[8*i+m]]
					q |= uint64(code[v>>8]) << (5 * m)
					blk[packedCodeBytes+8*i+m] = byte(v)
				}
				blk[5*i], blk[5*i+1], blk[5*i+2], blk[5*i+3], blk[5*i+4] = byte(q), byte(q>>8), byte(q>>16), byte(q>>24), byte(q>>32)
			}
		}
	})
	return Matrix{DType: BF16P, Rows: rows, Cols: cols, Data: data, Scales: scales}, true, nil
}

// PackedNative reports whether the active path computes BF16P in
// assembly (AVX-512 with VBMI); elsewhere its products run in pure Go,
// far slower than BF16's.
func PackedNative() bool { return cur().packedNative }

// packedTable returns the code table of a BF16P matrix's Scales.
func packedTable(scales []byte) *[packedTableBytes]byte {
	return (*[packedTableBytes]byte)(scales[:packedTableBytes])
}

// exceptionRows are a BF16P matrix's exception rows: their indices
// (little-endian uint32s, read as such on any byte order) and their BF16
// weights, cols a row.
type exceptionRows struct {
	idx []byte
	raw []uint16
}

// packedExceptions returns the exception rows of a BF16P matrix's Scales.
func packedExceptions(scales []byte, cols int) exceptionRows {
	n := int(binary.LittleEndian.Uint32(scales[packedTableBytes:]))
	if n == 0 {
		return exceptionRows{}
	}
	b := scales[packedTableBytes+4:]
	return exceptionRows{idx: b[:4*n], raw: u16View(b[4*n:])[:n*cols]}
}

// count returns how many exception rows there are.
func (e exceptionRows) count() int { return len(e.idx) / 4 }

// row returns the i-th exception row's index.
func (e exceptionRows) row(i int) int { return int(binary.LittleEndian.Uint32(e.idx[4*i:])) }

// from returns the first exception at or after row r.
func (e exceptionRows) from(r int) int {
	return sort.Search(e.count(), func(i int) bool { return e.row(i) >= r })
}

// validPackedScales reports what is wrong with a BF16P matrix's Scales:
// their size for the exception rows they count (constant time: MatVec
// checks it on every call; PackBF16 writes the rows in order).
func validPackedScales(m Matrix) error {
	if len(m.Scales) < packedTableBytes+4 {
		return fmt.Errorf("kernels: BF16P matrix %dx%d has %d bytes of scales, fewer than its table's %d", m.Rows, m.Cols, len(m.Scales), packedTableBytes+4)
	}
	n := int(binary.LittleEndian.Uint32(m.Scales[packedTableBytes:]))
	if n > m.Rows || len(m.Scales) != packedTableBytes+4+n*(4+2*m.Cols) {
		return fmt.Errorf("kernels: BF16P matrix %dx%d: %d exception rows in %d bytes of scales", m.Rows, m.Cols, n, len(m.Scales))
	}
	return nil
}

// unpackBlock writes a block's 64 BF16 weights, in order, into dst.
func unpackBlock(dst *[packedBlock]uint16, blk []byte, table *[packedTableBytes]byte) {
	blk = blk[:packedBlockBytes]
	for i := range 8 {
		q := uint64(blk[5*i]) | uint64(blk[5*i+1])<<8 | uint64(blk[5*i+2])<<16 | uint64(blk[5*i+3])<<24 | uint64(blk[5*i+4])<<32
		for m := range 8 {
			p := 8*i + m
			dst[packedOrder[p]] = uint16(table[q>>(5*m)&31])<<8 | uint16(blk[packedCodeBytes+p])
		}
	}
}

// matVecBF16PGo is the row kernel of BF16P: each row's blocks unpacked
// and applied exactly as dotBF16Go applies its BF16 (16 lanes, then
// fold16). Exception rows come out wrong here: matVecRows redoes them.
func matVecBF16PGo(out []float32, data []byte, table *[packedTableBytes]byte, x []float32) {
	cols := len(x)
	nb := cols / packedBlock
	var w [packedBlock]uint16
	for r := range out {
		var acc [16]float32
		for b := range nb {
			unpackBlock(&w, data[(r*nb+b)*packedBlockBytes:], table)
			xb := x[b*packedBlock:]
			for k := range 4 {
				for j := range 16 {
					acc[j] += float32(BF16ToF32(w[16*k+j]) * xb[16*k+j])
				}
			}
		}
		out[r] = fold16(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7],
			acc[8], acc[9], acc[10], acc[11], acc[12], acc[13], acc[14], acc[15])
	}
}

// unpackRows widens rows [r0, r0+nr) of the BF16P matrix w into dst
// (nr*Cols floats): blocks widens the packed rows (the Go or the assembly
// way), then exception rows are widened from their BF16 copies.
func unpackRows(dst []float32, w Matrix, r0, nr int, blocks func(dst []float32, src []byte, table *[packedTableBytes]byte)) {
	cols := w.Cols
	rb := BF16P.RowBytes(cols)
	blocks(dst[:nr*cols], w.Data[r0*rb:(r0+nr)*rb], packedTable(w.Scales))
	e := packedExceptions(w.Scales, cols)
	for i := e.from(r0); i < e.count() && e.row(i) < r0+nr; i++ {
		r := e.row(i) - r0
		for j, h := range e.raw[i*cols : (i+1)*cols] {
			dst[r*cols+j] = BF16ToF32(h)
		}
	}
}

// widenBlocksGo widens the len(dst)/64 blocks of src into dst.
func widenBlocksGo(dst []float32, src []byte, table *[packedTableBytes]byte) {
	var w [packedBlock]uint16
	for i := range len(dst) / packedBlock {
		unpackBlock(&w, src[i*packedBlockBytes:], table)
		for j, h := range w {
			dst[i*packedBlock+j] = BF16ToF32(h)
		}
	}
}

// fixExceptionRows recomputes out's exception rows (out holds rows
// [r0, r0+len(out)) of w) from their BF16 copies with p's BF16 kernel.
func fixExceptionRows(p *rowKernels, out []float32, w Matrix, x []float32, r0 int) {
	e := packedExceptions(w.Scales, w.Cols)
	r1 := r0 + len(out)
	for i := e.from(r0); i < e.count() && e.row(i) < r1; i++ {
		r := e.row(i)
		p.matVecBF16(out[r-r0:r-r0+1], e.raw[i*w.Cols:(i+1)*w.Cols], x)
	}
}
