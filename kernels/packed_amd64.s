#include "textflag.h"

// BF16P's AVX-512 kernels (AVX512F, BW and VBMI), written by hand beside
// internal/asmgen's: see packed.go for the block layout. A block's 64
// weights become four registers of 16 float32 lanes, weights 16k to
// 16k+15 in the k-th, with five byte shuffles and four bit operations:
// vpermb gathers each qword's 40 bits of codes, vpmultishiftqb cuts them
// into bytes, vpermb looks up their high bytes in the table, a byte
// interleave with the low bytes makes BF16 words, and a shift (even
// words) or a mask (odd words) makes them float32 bits. (Word interleaves
// with zeros instead of the shift and mask streamed 0-9% slower on the
// Zen 4 VM, go test -bench PackedAgainstBF16.) Products and sums
// are vmulps and vaddps in the lanes of the BF16 kernel, so every result
// is bit-identical to it.

// UNPACK leaves block (P)(AX*1)'s weights as float32 in Z9-Z12.
// Z31: table; Z30: gather; Z29: bit selection; Z28: 0xffff0000 a lane.
#define UNPACK(P) \
	VPERMB 0(P)(AX*1), Z30, Z4 \
	VPMULTISHIFTQB Z4, Z29, Z4 \
	VPERMB Z31, Z4, Z5 \
	VMOVDQU8 40(P)(AX*1), Z6 \
	VPUNPCKLBW Z5, Z6, Z7 \
	VPUNPCKHBW Z5, Z6, Z8 \
	VPSLLD $16, Z7, Z9 \
	VPANDD Z28, Z7, Z10 \
	VPSLLD $16, Z8, Z11 \
	VPANDD Z28, Z8, Z12

// ROW adds block (P)(AX*1) times x's Z16-Z19 into ACC.
#define ROW(P, ACC) \
	UNPACK(P) \
	VMULPS Z16, Z9, Z9 \
	VADDPS Z9, ACC, ACC \
	VMULPS Z17, Z10, Z10 \
	VADDPS Z10, ACC, ACC \
	VMULPS Z18, Z11, Z11 \
	VADDPS Z11, ACC, ACC \
	VMULPS Z19, Z12, Z12 \
	VADDPS Z12, ACC, ACC

// FOLD sums Z's 16 lanes as fold16 does into DST.
#define FOLD(Z, Y, X, DST) \
	VEXTRACTF64X4 $1, Z, Y8 \
	VADDPS Y8, Y, Y \
	VEXTRACTF128 $1, Y, X8 \
	VADDPS X8, X, X \
	VPERMILPS $0x0E, X, X8 \
	VADDPS X8, X, X \
	VMOVSHDUP X, X8 \
	VADDSS X8, X, X \
	VMOVSS X, DST

#define CONSTS(T, C) \
	VMOVDQU64 0(T), Z31 \
	VMOVDQU64 0(C), Z30 \
	VMOVDQU64 64(C), Z29 \
	VPTERNLOGD $0xff, Z28, Z28, Z28 \
	VPSLLD $16, Z28, Z28

// func rowsBF16PAVX512(out *float32, w unsafe.Pointer, x *float32, rows, nblk int, table *[64]byte, consts *[2][64]byte)
//
// Rows are taken four at a time from the four quarters of the range, as
// the BF16 kernel does, then the rows%4 left one at a time.
TEXT ·rowsBF16PAVX512(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DX
	MOVQ rows+24(FP), CX
	MOVQ nblk+32(FP), R9
	MOVQ table+40(FP), AX
	MOVQ consts+48(FP), BX
	CONSTS(AX, BX)
	IMUL3Q $104, R9, BX
	MOVQ CX, R15
	SHRQ $2, R15
	MOVQ R15, R8
	IMULQ BX, R8
	MOVQ R15, R11
	SHLQ $2, R11
	LEAQ (SI)(R8*1), R12
	LEAQ (SI)(R8*2), R13
	LEAQ (R12)(R8*2), R14
group4:
	TESTQ R15, R15
	JEQ rest
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ AX, AX
	XORQ R10, R10
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ fold4
loop4:
	VMOVUPS 0(DX)(R10*1), Z16
	VMOVUPS 64(DX)(R10*1), Z17
	VMOVUPS 128(DX)(R10*1), Z18
	VMOVUPS 192(DX)(R10*1), Z19
	ROW(SI, Z0)
	ROW(R12, Z1)
	ROW(R13, Z2)
	ROW(R14, Z3)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ CX
	JNE loop4
fold4:
	LEAQ (R11)(R11*2), AX
	FOLD(Z0, Y0, X0, (DI))
	FOLD(Z1, Y1, X1, (DI)(R11*1))
	FOLD(Z2, Y2, X2, (DI)(R11*2))
	FOLD(Z3, Y3, X3, (DI)(AX*1))
	ADDQ $4, DI
	ADDQ BX, SI
	ADDQ BX, R12
	ADDQ BX, R13
	ADDQ BX, R14
	DECQ R15
	JMP group4
rest:
	MOVQ R14, SI
	LEAQ (R11)(R11*2), AX
	ADDQ AX, DI
	MOVQ rows+24(FP), R15
	ANDQ $3, R15
single:
	TESTQ R15, R15
	JEQ done
	VPXORD Z0, Z0, Z0
	XORQ AX, AX
	XORQ R10, R10
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ fold1
loop1:
	VMOVUPS 0(DX)(R10*1), Z16
	VMOVUPS 64(DX)(R10*1), Z17
	VMOVUPS 128(DX)(R10*1), Z18
	VMOVUPS 192(DX)(R10*1), Z19
	ROW(SI, Z0)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ CX
	JNE loop1
fold1:
	FOLD(Z0, Y0, X0, (DI))
	ADDQ $4, DI
	ADDQ BX, SI
	DECQ R15
	JMP single
done:
	VZEROUPPER
	RET

// func widenBF16PAVX512(dst *float32, src unsafe.Pointer, nblk int, table *[64]byte, consts *[2][64]byte)
TEXT ·widenBF16PAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ nblk+16(FP), CX
	MOVQ table+24(FP), AX
	MOVQ consts+32(FP), BX
	CONSTS(AX, BX)
	XORQ AX, AX
	TESTQ CX, CX
	JEQ wdone
wloop:
	UNPACK(SI)
	VMOVUPS Z9, 0(DI)
	VMOVUPS Z10, 64(DI)
	VMOVUPS Z11, 128(DI)
	VMOVUPS Z12, 192(DI)
	ADDQ $104, AX
	ADDQ $256, DI
	DECQ CX
	JNE wloop
wdone:
	VZEROUPPER
	RET
