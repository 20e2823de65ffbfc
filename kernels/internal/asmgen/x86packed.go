package main

import "fmt"

// The kernels of BF16P (kernels/packed.go: BF16 packed losslessly into
// 13 bits a weight), AVX-512 only (F, BW and VBMI). A block's 64 weights
// become four registers of 16 float32 lanes, weights 16k to 16k+15 in the
// k-th, with five byte shuffles and four bit operations (unpackBlock):
// vpermb gathers each qword's 40 bits of codes, vpmultishiftqb cuts them
// into bytes, vpermb looks up their high bytes in the table, a byte
// interleave with the low bytes makes BF16 words, and a shift (even
// words) or a mask (odd words) makes them float32 bits. (Word interleaves
// with zeros instead of the shift and mask streamed 0-9% slower on the
// Zen 4 VM, go test -bench PackedAgainstBF16.) Products and sums are
// vmulps and vaddps in the lanes of the BF16 kernel, so every result is
// bit-identical to it.
//
// Registers held through a kernel: Z31 the table, Z30 the gather, Z29 the
// bit selection, Z28 0xffff0000 in every lane.

const (
	packedBlockBytes = 104 // 40 bytes of codes, 64 low bytes
	packedCodeBytes  = 40
	// packedPrefetch is how far ahead the 2-row MatMul kernel asks for
	// every cache line of its rows: a block is 1.6 lines, and one
	// prefetch a block left every third line to the hardware (0.6-0.9 of
	// BF16's direct kernel); 2 or 8 KiB ahead, or T0, no better.
	packedPrefetch = 4096
)

func packedAVX512(a *asm) {
	packedRows(a)
	packedWiden(a)
	for _, t := range []int{3, 4} {
		packedMM(a, t)
	}
}

// packedConsts loads the held registers: the table from register tab,
// the gather and bit selection from cs (kernels.packedConsts).
func packedConsts(a *asm, tab, cs string) {
	a.i("VMOVDQU64 0(%s), Z31", tab)
	a.i("VMOVDQU64 0(%s), Z30", cs)
	a.i("VMOVDQU64 64(%s), Z29", cs)
	a.i("VPTERNLOGD $0xff, Z28, Z28, Z28")
	a.i("VPSLLD $16, Z28, Z28")
}

// unpackBlock leaves the block at (p)(AX*1) as float32 in Z(dst) to
// Z(dst+3); it uses Z4-Z8.
func unpackBlock(a *asm, p string, dst int) {
	a.i("VPERMB 0(%s)(AX*1), Z30, Z4", p)
	a.i("VPMULTISHIFTQB Z4, Z29, Z4")
	a.i("VPERMB Z31, Z4, Z5")
	a.i("VMOVDQU8 %d(%s)(AX*1), Z6", packedCodeBytes, p)
	a.i("VPUNPCKLBW Z5, Z6, Z7")
	a.i("VPUNPCKHBW Z5, Z6, Z8")
	a.i("VPSLLD $16, Z7, Z%d", dst)
	a.i("VPANDD Z28, Z7, Z%d", dst+1)
	a.i("VPSLLD $16, Z8, Z%d", dst+2)
	a.i("VPANDD Z28, Z8, Z%d", dst+3)
}

// foldTo sums Z(acc)'s 16 lanes as fold16 does into the float at addr;
// a register from 16 up goes through Z(via) first (the fold's VEX
// extract takes registers below 16).
func foldTo(a *asm, acc, via int, addr string) {
	if acc >= 16 {
		a.i("VMOVAPS Z%d, Z%d", acc, via)
		acc = via
	}
	avx512.fold(a, []int{acc}, 8)
	a.i("VMOVSS X%d, %s", acc, addr)
}

// packedRows emits rowsBF16PAVX512(out *float32, w unsafe.Pointer, x
// *float32, rows, nblk int, table *[64]byte, consts *[2][64]byte): rows
// four at a time from the four quarters of the range, as the BF16 row
// kernel takes them, then the rows%4 left one at a time.
func packedRows(a *asm) {
	name := "rowsBF16PAVX512"
	a.comment("func %s(out *float32, w unsafe.Pointer, x *float32, rows, nblk int, table *[64]byte, consts *[2][64]byte)", name)
	a.text(name, 56)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ w+8(FP), SI")
	a.i("MOVQ x+16(FP), DX")
	a.i("MOVQ rows+24(FP), CX")
	a.i("MOVQ nblk+32(FP), R9")
	a.i("MOVQ table+40(FP), AX")
	a.i("MOVQ consts+48(FP), BX")
	packedConsts(a, "AX", "BX")
	// BX = a row's bytes; R15 = q, the 4-row groups; R8 = q rows' bytes,
	// the distance between a group's rows; R11 = their outputs'
	a.i("IMUL3Q $%d, R9, BX", packedBlockBytes)
	a.i("MOVQ CX, R15")
	a.i("SHRQ $2, R15")
	a.i("MOVQ R15, R8")
	a.i("IMULQ BX, R8")
	a.i("MOVQ R15, R11")
	a.i("SHLQ $2, R11")
	a.i("LEAQ (SI)(R8*1), R12")
	a.i("LEAQ (SI)(R8*2), R13")
	a.i("LEAQ (R12)(R8*2), R14")
	// loop runs the blocks of the rows at bases into Z0.., x in Z16-Z19
	loop := func(sfx string, bases []string) {
		for r := range bases {
			a.i("VPXORD Z%d, Z%d, Z%d", r, r, r)
		}
		a.i("XORQ AX, AX")
		a.i("XORQ R10, R10")
		a.i("MOVQ R9, CX")
		a.i("TESTQ CX, CX")
		a.i("JEQ fold" + sfx)
		a.label("loop" + sfx)
		for k := range 4 {
			a.i("VMOVUPS %d(DX)(R10*1), Z%d", 64*k, 16+k)
		}
		for r, base := range bases {
			unpackBlock(a, base, 9)
			for k := range 4 {
				a.i("VMULPS Z%d, Z%d, Z%d", 16+k, 9+k, 9+k)
				a.i("VADDPS Z%d, Z%d, Z%d", 9+k, r, r)
			}
		}
		a.i("ADDQ $%d, AX", packedBlockBytes)
		a.i("ADDQ $256, R10")
		a.i("DECQ CX")
		a.i("JNE loop" + sfx)
		a.label("fold" + sfx)
	}
	quarterRows(a, "R15", true,
		func() {
			loop("4", []string{"SI", "R12", "R13", "R14"})
			a.i("LEAQ (R11)(R11*2), AX")
			for r, addr := range []string{"(DI)", "(DI)(R11*1)", "(DI)(R11*2)", "(DI)(AX*1)"} {
				foldTo(a, r, 0, addr)
			}
			a.i("ADDQ $4, DI")
		},
		func() {
			loop("1", []string{"SI"})
			foldTo(a, 0, 0, "(DI)")
			a.i("ADDQ $4, DI")
		})
}

// packedWiden emits widenBF16PAVX512(dst *float32, src unsafe.Pointer,
// nblk int, table *[64]byte, consts *[2][64]byte): nblk blocks widened to
// 64 floats each (a MatMul tile).
func packedWiden(a *asm) {
	name := "widenBF16PAVX512"
	a.comment("func %s(dst *float32, src unsafe.Pointer, nblk int, table *[64]byte, consts *[2][64]byte)", name)
	a.text(name, 40)
	a.i("MOVQ dst+0(FP), DI")
	a.i("MOVQ src+8(FP), SI")
	a.i("MOVQ nblk+16(FP), CX")
	a.i("MOVQ table+24(FP), AX")
	a.i("MOVQ consts+32(FP), BX")
	packedConsts(a, "AX", "BX")
	a.i("XORQ AX, AX")
	a.i("TESTQ CX, CX")
	a.i("JEQ wdone")
	a.label("wloop")
	unpackBlock(a, "SI", 9)
	for k := range 4 {
		a.i("VMOVUPS Z%d, %d(DI)", 9+k, 64*k)
	}
	a.i("ADDQ $%d, AX", packedBlockBytes)
	a.i("ADDQ $256, DI")
	a.i("DECQ CX")
	a.i("JNE wloop")
	a.label("wdone")
	a.i("VZEROUPPER")
	a.i("RET")
}

// packedMM emits mmBF16Px<T>AVX512(out *float32, outStride int, w
// unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table
// *[64]byte, consts *[2][64]byte), T 3 or 4: out[t*outStride + r] =
// Dot(row r, vector t). Two rows at a time, each block unpacked once for
// the T vectors and each vector's weights loaded once for the two rows
// (row A's accumulators Z0.., row B's Z14..), every cache line of both
// rows prefetched packedPrefetch ahead; then a last odd row alone. go
// test -bench PackedAgainstBF16MatMul, Zen 4 VM: 0.96-0.98 of BF16's
// direct kernel at 4 vectors, 1.2 of BF16 at 3 (BF16's by vector); at 2
// vectors by vector (1.04) beat these pairs (0.87), so there is no x2.
func packedMM(a *asm, T int) {
	name := fmt.Sprintf("mmBF16Px%dAVX512", T)
	a.comment("func %s(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table *[64]byte, consts *[2][64]byte)", name)
	a.text(name, 80)
	a.i("MOVQ out+0(FP), DI")
	a.i("MOVQ outStride+8(FP), BX")
	a.i("MOVQ w+16(FP), R12")
	a.i("MOVQ wStride+24(FP), DX")
	a.i("MOVQ rows+32(FP), CX")
	a.i("MOVQ x+40(FP), R8")
	a.i("MOVQ xStride+48(FP), AX")
	a.i("MOVQ nblk+56(FP), SI")
	xp := []string{"R8", "R9", "R11", "R14"}[:T]
	for t := 1; t < T; t++ {
		a.i("LEAQ (%s)(AX*1), %s", xp[t-1], xp[t])
	}
	a.i("MOVQ table+64(FP), AX")
	a.i("MOVQ consts+72(FP), R13")
	packedConsts(a, "AX", "R13")
	sfx := fmt.Sprint(T)
	// blocks runs the blocks of the rows in R12 (and R15, pair) into the
	// accumulators; R13 counts them, then holds out + 2*outStride
	blocks := func(pair bool) (outA, outB []string) {
		lab := "odd" + sfx
		if pair {
			lab = "pair" + sfx
		}
		for t := range T {
			a.i("VPXORD Z%d, Z%d, Z%d", t, t, t)
			if pair {
				a.i("VPXORD Z%d, Z%d, Z%d", 14+t, 14+t, 14+t)
			}
		}
		a.i("XORQ AX, AX")
		a.i("XORQ R10, R10")
		a.i("MOVQ SI, R13")
		a.i("TESTQ R13, R13")
		a.i("JEQ fold" + lab)
		a.label("loop" + lab)
		rows := []string{"R12"}
		if pair {
			rows = append(rows, "R15")
			for _, r := range rows {
				a.i("PREFETCHNTA %d(%s)(AX*1)", packedPrefetch, r)
				a.i("PREFETCHNTA %d(%s)(AX*1)", packedPrefetch+64, r)
			}
		}
		unpackBlock(a, "R12", 9)
		if pair {
			unpackBlock(a, "R15", 20)
		}
		for t, x := range xp {
			for k := range 4 {
				if pair { // one load of x for both rows
					a.i("VMOVUPS %d(%s)(R10*1), Z13", 64*k, x)
					a.i("VMULPS Z13, Z%d, Z18", 9+k)
					a.i("VADDPS Z18, Z%d, Z%d", t, t)
					a.i("VMULPS Z13, Z%d, Z19", 20+k)
					a.i("VADDPS Z19, Z%d, Z%d", 14+t, 14+t)
				} else {
					a.i("VMULPS %d(%s)(R10*1), Z%d, Z18", 64*k, x, 9+k)
					a.i("VADDPS Z18, Z%d, Z%d", t, t)
				}
			}
		}
		a.i("ADDQ $%d, AX", packedBlockBytes)
		a.i("ADDQ $256, R10")
		a.i("DECQ R13")
		a.i("JNE loop" + lab)
		a.label("fold" + lab)
		a.i("LEAQ (DI)(BX*2), R13")
		outA = []string{"(DI)", "(DI)(BX*1)", "(R13)", "(R13)(BX*1)"}[:T]
		outB = []string{"4(DI)", "4(DI)(BX*1)", "4(R13)", "4(R13)(BX*1)"}[:T]
		return outA, outB
	}
	a.label("pair" + sfx)
	a.i("CMPQ CX, $2")
	a.i("JLT odd" + sfx)
	a.i("LEAQ (R12)(DX*1), R15")
	outA, outB := blocks(true)
	for t := range T {
		foldTo(a, t, 0, outA[t])
	}
	for t := range T {
		foldTo(a, 14+t, 4+t, outB[t])
	}
	a.i("ADDQ $8, DI")
	a.i("LEAQ (R12)(DX*2), R12")
	a.i("SUBQ $2, CX")
	a.i("JMP pair" + sfx)
	a.label("odd" + sfx)
	a.i("TESTQ CX, CX")
	a.i("JEQ done" + sfx)
	outA, _ = blocks(false)
	for t := range T {
		foldTo(a, t, 0, outA[t])
	}
	a.label("done" + sfx)
	a.i("VZEROUPPER")
	a.i("RET")
}
