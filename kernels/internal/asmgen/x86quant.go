package main

import (
	"fmt"
	"math"
)

// The Q8 and NF4 kernels (kernels/doc.go has the layouts): each row
// starts with its float32 scales (Q8: one per 32 weights, NF4: one absmax
// per 64), its codes follow at byte sb. A 16-element block never straddles
// a group or block, so each block is dequantized with one scale:
//
//	Q8:  w = float32(int8 code) * scale   VPMOVSXBD, VCVTDQ2PS (exact), VMULPS
//	NF4: w = code[q] * absmax             VMULPS makes the block's 16-entry
//	                                      table, VPERMPS looks the codes up
//
// then the product with x and the add to the lanes, as for the float
// dtypes (never fused).

// nf4Codes are the NF4 values of kernels/quant.go (QLoRA, bitsandbytes);
// a mistyped digit fails the kernels' path tests.
var nf4Codes = [16]float32{
	-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
	-0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
	0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
	0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
}

// nf4Data emits the NF4 table as the file-local symbol nf4codes<>.
func nf4Data(a *asm) {
	a.comment("The 16 NF4 code values (kernels/quant.go nf4Codes).")
	for i, c := range nf4Codes {
		fmt.Fprintf(&a.b, "DATA nf4codes<>+%d(SB)/4, $0x%08x\n", 4*i, math.Float32bits(c))
	}
	a.b.WriteString("GLOBL nf4codes<>(SB), RODATA|NOPTR, $64\n")
}

// nf4Perm512Data emits the constants of the AVX-512 NF4 kernel (see
// quantLoad512): per-qword shifts 4j, the x permutation (lane 2j <- x[j],
// lane 2j+1 <- x[j+8]) and its inverse for the lanes.
func nf4Perm512Data(a *asm) {
	a.comment("AVX-512 NF4: qword shifts, x lane permutation and its inverse.")
	for j := range 8 {
		fmt.Fprintf(&a.b, "DATA nf4shift<>+%d(SB)/8, $%d\n", 8*j, 4*j)
	}
	a.b.WriteString("GLOBL nf4shift<>(SB), RODATA|NOPTR, $64\n")
	for j := range 8 {
		fmt.Fprintf(&a.b, "DATA nf4xperm<>+%d(SB)/4, $%d\n", 8*j, j)
		fmt.Fprintf(&a.b, "DATA nf4xperm<>+%d(SB)/4, $%d\n", 8*j+4, j+8)
	}
	a.b.WriteString("GLOBL nf4xperm<>(SB), RODATA|NOPTR, $64\n")
	for l := range 16 {
		lane := 2 * l
		if l >= 8 {
			lane = 2*(l-8) + 1
		}
		fmt.Fprintf(&a.b, "DATA nf4unperm<>+%d(SB)/4, $%d\n", 4*l, lane)
	}
	a.b.WriteString("GLOBL nf4unperm<>(SB), RODATA|NOPTR, $64\n")
}

// quantPrefetchBytes is how far ahead of its loads each Q8 or NF4 row
// stream asks for its codes (PREFETCHNTA, as the 16-bit rows do). On the
// Zen 5 VM of docs/BENCHMARKS.md, 2 KiB beat 0.5, 1 and 4 KiB.
const quantPrefetchBytes = 2048

// quantRows emits rows<Q8|NF4><ISA>(out *float32, w unsafe.Pointer, x
// *float32, rows, n16, stride, sb int, lanes bool): x86.rows for Q8 or NF4
// rows of stride bytes whose codes start at byte sb. Four rows i, i+q,
// i+2q, i+3q at a time, then the rows%4 last ones.
//
// Registers: DI out, SI R12 R13 R14 the group's rows, DX x, BX stride,
// R8 q*stride, R11 the distance between the four outputs, R15 the groups
// left, R9 sb, AX the element index; per block the scale index
// (element/32 or /64) and the codes' byte offset go to R10 and CX (4-row
// groups) or R12 and R13 (single rows, where CX counts the rows left).
// rows, n16 and lanes are read from the frame where needed.
func (k x86) quantRows(a *asm, q8 bool) {
	d := "NF4"
	if q8 {
		d = "Q8"
	}
	name := "rows" + d + k.name
	a.comment("func %s(out *float32, w unsafe.Pointer, x *float32, rows, n16, stride, sb int, lanes bool)", name)
	a.text(name, 57)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ w+8(FP), SI")
	a.i("MOVQ x+16(FP), DX")
	a.i("MOVQ rows+24(FP), CX")
	a.i("MOVQ stride+40(FP), BX")
	a.i("MOVQ sb+48(FP), R9")
	a.i("MOVBLZX lanes+56(FP), R10")
	a.i("MOVQ CX, R15")
	a.i("SHRQ $2, R15")
	a.i("MOVQ R15, R8")
	a.i("IMULQ BX, R8")
	a.i("MOVQ R15, R11")
	a.i("SHLQ $2, R11")
	a.i("TESTQ R10, R10")
	a.i("JEQ setup")
	a.i("SHLQ $4, R11")
	a.label("setup")
	a.i("LEAQ (SI)(R8*1), R12")
	a.i("LEAQ (SI)(R8*2), R13")
	a.i("LEAQ (R12)(R8*2), R14")
	// AVX-512: acc Z0-Z3, temporaries Z4-Z15, x Z16 and Z18-Z20; NF4: the
	// code values Z17, the rows' tables of a 64-element chunk Z21-Z24, the
	// qword shifts Z25, the x permutation Z26. AVX2: acc Y0-Y7 (two per
	// row), x Y8-Y9, temporaries Y10-Y15.
	xreg, foldTmp := 16, 8
	if k.parts == 2 {
		xreg, foldTmp = 8, 15
	}
	perm := k.parts == 1 && !q8    // AVX-512 NF4: lanes permuted, see quantLoad512
	perm256 := k.parts == 2 && !q8 // AVX2 NF4: lanes permuted, see quantLoad256
	if perm {
		a.i("VMOVUPS nf4codes<>(SB), Z17")
		a.i("VMOVUPS nf4shift<>(SB), Z25")
		a.i("VMOVUPS nf4xperm<>(SB), Z26")
	}
	index := func(bases []string, si, ci string) { quantIndex(a, q8, bases, si, ci, true) }
	// block computes the 16-element block at element AX.
	block := func(bases []string, si, ci string) {
		for p := range k.parts {
			a.i("VMOVUPS %d(DX)(AX*4), %s", p*k.width*4, k.r(xreg+p))
		}
		if perm {
			a.i("VPERMPS Z%d, Z26, Z%d", xreg, xreg)
		}
		if perm256 {
			a.i("VUNPCKHPS Y9, Y8, Y10")
			a.i("VUNPCKLPS Y9, Y8, Y8")
			a.i("VMOVAPS Y10, Y9")
		}
		index(bases, si, ci)
		for r, base := range bases {
			if k.parts == 1 {
				k.quantBlock512(a, q8, base, si, ci, 0, r, 4+2*r, 5+2*r, 16, -1)
			} else {
				k.quantBlock256(a, q8, base, si, ci, r)
			}
		}
	}
	// chunk computes the 64 elements at AX, a multiple of 64 (AVX-512):
	// each row's NF4 table is made once, the index arithmetic and the
	// prefetch are shared by four blocks.
	chunk := func(bases []string, si, ci string) {
		xs := []int{16, 18, 19, 20}
		for u, x := range xs {
			a.i("VMOVUPS %d(DX)(AX*4), Z%d", 64*u, x)
			if perm {
				a.i("VPERMPS Z%d, Z26, Z%d", x, x)
			}
		}
		index(bases, si, ci)
		n := 0
		for r, base := range bases {
			tab := -1
			if !q8 {
				tab = 21 + r
				a.i("VMULPS.BCST (%s)(%s*4), Z17, Z%d", base, si, tab)
			}
			for u, x := range xs {
				t := 4 + 2*(n%6)
				n++
				k.quantBlock512(a, q8, base, si, ci, u, r, t, t+1, x, tab)
			}
		}
	}
	group := func(nrows int, bases, outs []string, si, ci, sfx string) {
		for i := range nrows * k.parts {
			a.i("%s %s, %s, %s", k.zero, k.r(i), k.r(i), k.r(i))
		}
		a.i("XORQ AX, AX")
		if k.parts == 1 {
			a.label("chunk" + sfx)
			a.i("LEAQ 64(AX), %s", si)
			a.i("CMPQ %s, n16+32(FP)", si)
			a.i("JGT block%s", sfx)
			chunk(bases, si, ci)
			a.i("ADDQ $64, AX")
			a.i("JMP chunk%s", sfx)
		}
		a.label("block" + sfx)
		a.i("CMPQ AX, n16+32(FP)")
		a.i("JGE fold%s", sfx)
		block(bases, si, ci)
		a.i("ADDQ $16, AX")
		a.i("JMP block%s", sfx)
		a.label("fold" + sfx)
		if perm {
			a.i("VMOVUPS nf4unperm<>(SB), Z16")
			for r := range nrows {
				a.i("VPERMPS Z%d, Z16, Z%d", r, r)
			}
		}
		if perm256 {
			for r := range nrows {
				unpermute256(a, 2*r, 2*r+1, 15)
			}
		}
		if nrows == 4 {
			a.i("LEAQ (R11)(R11*2), AX")
		}
		a.i("CMPB lanes+56(FP), $0")
		a.i("JNE lanes%s", sfx)
		for r := range nrows {
			acc := []int{r * k.parts, r*k.parts + 1}
			k.fold(a, acc, foldTmp)
			a.i("VMOVSS X%d, %s", acc[0], outs[r])
		}
		a.i("ADDQ $4, DI")
		a.i("JMP next%s", sfx)
		a.label("lanes" + sfx)
		for r := range nrows {
			for p := range k.parts {
				a.i("VMOVUPS %s, %d%s", k.r(r*k.parts+p), 4*k.width*p, outs[r])
			}
		}
		a.i("ADDQ $64, DI")
		a.label("next" + sfx)
	}
	quarterRows(a, "CX", true,
		func() {
			group(4, []string{"SI", "R12", "R13", "R14"}, []string{"(DI)", "(DI)(R11*1)", "(DI)(R11*2)", "(DI)(AX*1)"}, "R10", "CX", "4")
		},
		func() { group(1, []string{"SI"}, []string{"(DI)"}, "R12", "R13", "1") })
}

// quantIndex sets si to the scale index of element AX and ci to the byte
// offset of its codes (sb in R9), and prefetches each row's codes.
func quantIndex(a *asm, q8 bool, bases []string, si, ci string, prefetch bool) {
	a.i("MOVQ AX, %s", si)
	if q8 {
		a.i("SHRQ $5, %s", si)
		a.i("LEAQ (R9)(AX*1), %s", ci)
	} else {
		a.i("SHRQ $6, %s", si)
		a.i("MOVQ AX, %s", ci)
		a.i("SHRQ $1, %s", ci)
		a.i("ADDQ R9, %s", ci)
	}
	for _, base := range bases {
		if prefetch {
			a.i("PREFETCHNTA %d(%s)(%s*1)", quantPrefetchBytes, base, ci)
		}
	}
}

// quantBlock512 emits block u (elements AX+16u..) of row r (base) with
// AVX-512: scale at (base)(si*4), codes at (base)(ci*1) (plus the block's
// offsets), lanes in Z<r>, x in Z<x>, t and u temporaries; tab >= 0 holds
// the row's NF4 table already, else it is made in u.
//
// NF4 unpacks the block's 8 bytes (16 codes, code e in bits 4e..4e+3) by
// broadcasting them to every qword and shifting qword j right by 4j: dword
// 2j then holds code j in its low nibble, dword 2j+1 code j+8, and VPERMPS
// reads only an index's low 4 bits. So lane 2j holds element j and lane
// 2j+1 element j+8 of every block: x is permuted the same way when it is
// loaded, and the lanes are put back in order (nf4unperm) before the fold.
// Each lane still sums its elements in order with the same operations:
// only where the lane sits in the register changes.
func (k x86) quantBlock512(a *asm, q8 bool, base, si, ci string, blk, r, t, u, x, tab int) {
	k.quantLoad512(a, q8, base, si, ci, blk, t, u, tab)
	a.i("VMULPS Z%d, Z%d, Z%d", x, t, t)
	a.i("VADDPS Z%d, Z%d, Z%d", t, r, r)
}

// quantLoad512 leaves the dequantized weights of block u in Z<t> (NF4: in
// the permuted lane order).
func (k x86) quantLoad512(a *asm, q8 bool, base, si, ci string, blk, t, u, tab int) {
	if q8 {
		a.i("VPMOVSXBD %d(%s)(%s*1), Z%d", 16*blk, base, ci, t)
		a.i("VCVTDQ2PS Z%d, Z%d", t, t)
		a.i("VMULPS.BCST %d(%s)(%s*4), Z%d, Z%d", 4*(blk/2), base, si, t, t)
		return
	}
	a.i("VPBROADCASTQ %d(%s)(%s*1), Z%d", 8*blk, base, ci, t)
	a.i("VPSRLVQ Z25, Z%d, Z%d", t, t)
	if tab < 0 {
		tab = u
		a.i("VMULPS.BCST (%s)(%s*4), Z17, Z%d", base, si, tab)
	}
	a.i("VPERMPS Z%d, Z%d, Z%d", tab, t, t)
}

// quantBlock256 emits one 16-element block of row r with AVX2: lanes 0-7
// in Y<2r>, 8-15 in Y<2r+1>, x in Y8-Y9.
func (k x86) quantBlock256(a *asm, q8 bool, base, si, ci string, r int) {
	scale, codes := quantAddrs(base, si, ci)
	w := k.quantLoad256(a, q8, scale, codes)
	for p := range 2 {
		a.i("VMULPS Y%d, Y%d, Y%d", 8+p, w[p], w[p])
		a.i("VADDPS Y%d, Y%d, Y%d", w[p], 2*r+p, 2*r+p)
	}
}

// quantAddrs are the addresses of a block's scale, (base)(si*4), and
// codes, (base)(ci*1), for quantLoad256.
func quantAddrs(base, si, ci string) (scale, codes string) {
	return fmt.Sprintf("(%s)(%s*4)", base, si), fmt.Sprintf("(%s)(%s*1)", base, ci)
}

// quantLoad256 dequantizes the block whose scale and codes are at the
// addresses scale and codes with AVX2 into the returned two registers,
// with temporaries Y10-Y15: Q8 lanes 0-7 and 8-15; NF4 in a
// permuted order. NF4 broadcasts the block's 8 code bytes to the four
// qwords and shifts them right by nf4shiftA (0, 4, 16, 20) and nf4shiftB
// (8, 12, 24, 28) bits: dwords 2j and 2j+1 of the first register then
// hold codes e and e+8 for e = 0, 1, 4, 5 in their low nibbles, of the
// second register for e = 2, 3, 6, 7. That is the order VUNPCKLPS and
// VUNPCKHPS put x in; unpermute256 puts the lanes back. AVX2's VPERMPS
// indexes 8 entries, so NF4 looks up both halves of the table and blends
// on the code's bit 3.
func (k x86) quantLoad256(a *asm, q8 bool, scale, codes string) [2]int {
	if q8 {
		a.i("VBROADCASTSS %s, Y10", scale)
		for p := range 2 {
			t := 11 + p
			a.i("VPMOVSXBD %d%s, Y%d", 8*p, codes, t)
			a.i("VCVTDQ2PS Y%d, Y%d", t, t)
			a.i("VMULPS Y10, Y%d, Y%d", t, t)
		}
		return [2]int{11, 12}
	}
	a.i("VPBROADCASTQ %s, Y10", codes)
	a.i("VPSRLVQ nf4shiftA<>(SB), Y10, Y11")
	a.i("VPSRLVQ nf4shiftB<>(SB), Y10, Y10")
	a.i("VBROADCASTSS %s, Y12", scale)
	a.i("VMULPS nf4codes<>+0(SB), Y12, Y13")  // table, codes 0-7
	a.i("VMULPS nf4codes<>+32(SB), Y12, Y12") // table, codes 8-15
	a.i("VPERMPS Y13, Y11, Y14")
	a.i("VPERMPS Y12, Y11, Y15")
	a.i("VPSLLD $28, Y11, Y11") // bit 3 to the sign
	a.i("VBLENDVPS Y11, Y15, Y14, Y14")
	a.i("VPERMPS Y13, Y10, Y11")
	a.i("VPERMPS Y12, Y10, Y15")
	a.i("VPSLLD $28, Y10, Y10")
	a.i("VBLENDVPS Y10, Y15, Y11, Y15")
	return [2]int{14, 15}
}

// unpermute256 puts the lanes of an AVX2 NF4 pair (lo: elements 0 8 1 9
// 4 12 5 13, hi: 2 10 3 11 6 14 7 15) back in order, with temporary t.
func unpermute256(a *asm, lo, hi, t int) {
	a.i("VSHUFPS $0x88, Y%d, Y%d, Y%d", hi, lo, t)  // 0 1 2 3 4 5 6 7
	a.i("VSHUFPS $0xDD, Y%d, Y%d, Y%d", hi, lo, hi) // 8 .. 15
	a.i("VMOVAPS Y%d, Y%d", t, lo)
}

// nf4Shift256Data emits the qword shifts of the AVX2 NF4 unpacking.
func nf4Shift256Data(a *asm) {
	a.comment("AVX2 NF4: qword shifts.")
	for j, sh := range []int{0, 4, 16, 20} {
		fmt.Fprintf(&a.b, "DATA nf4shiftA<>+%d(SB)/8, $%d\n", 8*j, sh)
	}
	a.b.WriteString("GLOBL nf4shiftA<>(SB), RODATA|NOPTR, $32\n")
	for j, sh := range []int{8, 12, 24, 28} {
		fmt.Fprintf(&a.b, "DATA nf4shiftB<>+%d(SB)/8, $%d\n", 8*j, sh)
	}
	a.b.WriteString("GLOBL nf4shiftB<>(SB), RODATA|NOPTR, $32\n")
}

// quantDequant emits dequant<Q8|NF4><ISA>(dst *float32, w unsafe.Pointer,
// rows, n16, stride, sb int): the first n16 (a multiple of 16) weights of
// each of rows rows of stride bytes (codes at byte sb), dequantized
// exactly as the row kernels do, to dst one row after the other. MatMul
// dequantizes its weight tiles with it.
func (k x86) quantDequant(a *asm, q8 bool) {
	d := "NF4"
	if q8 {
		d = "Q8"
	}
	name := "dequant" + d + k.name
	a.comment("func %s(dst *float32, w unsafe.Pointer, rows, n16, stride, sb int)", name)
	a.text(name, 48)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ w+8(FP), SI")
	a.i("MOVQ rows+16(FP), CX")
	a.i("MOVQ n16+24(FP), R8")
	a.i("MOVQ stride+32(FP), BX")
	a.i("MOVQ sb+40(FP), R9")
	if k.parts == 1 && !q8 {
		a.i("VMOVUPS nf4codes<>(SB), Z17")
		a.i("VMOVUPS nf4shift<>(SB), Z25")
		a.i("VMOVUPS nf4unperm<>(SB), Z27")
	}
	a.label("row")
	a.i("TESTQ CX, CX")
	a.i("JEQ done")
	a.i("XORQ AX, AX")
	a.label("block")
	a.i("CMPQ AX, R8")
	a.i("JGE next")
	quantIndex(a, q8, nil, "R10", "R11", false)
	if k.parts == 1 {
		k.quantLoad512(a, q8, "SI", "R10", "R11", 0, 4, 5, -1)
		if !q8 {
			a.i("VPERMPS Z4, Z27, Z4") // lanes back in order
		}
		a.i("VMOVUPS Z4, (DI)")
	} else {
		scale, codes := quantAddrs("SI", "R10", "R11")
		w := k.quantLoad256(a, q8, scale, codes)
		if !q8 {
			unpermute256(a, w[0], w[1], 13)
		}
		a.i("VMOVUPS Y%d, (DI)", w[0])
		a.i("VMOVUPS Y%d, 32(DI)", w[1])
	}
	a.i("ADDQ $64, DI")
	a.i("ADDQ $16, AX")
	a.i("JMP block")
	a.label("next")
	a.i("ADDQ BX, SI")
	a.i("DECQ CX")
	a.i("JMP row")
	a.label("done")
	a.i("VZEROUPPER")
	a.i("RET")
}

// mmQ8 emits mmQ8x<T>AVX2(out *float32, outStride int, w unsafe.Pointer,
// wStride, rows int, x *float32, xStride, n16, sb int), T 2 to 4: for
// each of rows Q8 rows (row r at w + r*wStride, its codes from byte sb)
// and the T vectors at x, x+xStride, ..., out[t*outStride + r] =
// Dot(row r, vector t) over n16 elements (a multiple of 16). Each block
// of 16 weights is dequantized once, by the row kernels' own emitter
// (quantLoad256), for all T vectors, whose
// products go to the lanes as the row kernels' do: the bits are MatVec's.
// acc[t] part p is Y(2t+p), the block Y11-Y12 (scale Y10), products Y8-Y9
// and Y13-Y15; x is read by the multiplies. R15 holds the row's codes,
// R14 a block's scale index.
func (k x86) mmQ8(a *asm, T int) {
	name := fmt.Sprintf("mmQ8x%d%s", T, k.name)
	a.comment("func %s(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, n16, sb int)", name)
	a.comment("1 row x %d vectors per register tile, Q8 weights dequantized in registers.", T)
	rowSetup := func() {
		a.i("MOVQ sb+64(FP), R15")
		a.i("ADDQ R12, R15")
	}
	k.mmOneRow(a, name, T, 72, rowSetup, func(xp []string) {
		a.i("MOVQ AX, R14")
		a.i("SHRQ $5, R14")
		a.i("PREFETCHNTA %d(R15)(AX*1)", quantPrefetchBytes)
		w := k.quantLoad256(a, true, "(R12)(R14*4)", "(R15)(AX*1)")
		tmps := []int{8, 9, 13, 14, 15}
		n := 0
		for t := range T {
			for p := range 2 {
				tmp := tmps[n%len(tmps)]
				n++
				a.i("VMULPS %d(%s)(AX*4), Y%d, Y%d", 32*p, xp[t], w[p], tmp)
				a.i("VADDPS Y%d, Y%d, Y%d", tmp, 2*t+p, 2*t+p)
			}
		}
	})
}
