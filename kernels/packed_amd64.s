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

// UNPACKTO leaves block (P)(AX*1)'s weights as float32 in D0-D3, as
// UNPACK does in Z9-Z12.
#define UNPACKTO(P, D0, D1, D2, D3) \
	VPERMB 0(P)(AX*1), Z30, Z4 \
	VPMULTISHIFTQB Z4, Z29, Z4 \
	VPERMB Z31, Z4, Z5 \
	VMOVDQU8 40(P)(AX*1), Z6 \
	VPUNPCKLBW Z5, Z6, Z7 \
	VPUNPCKHBW Z5, Z6, Z8 \
	VPSLLD $16, Z7, D0 \
	VPANDD Z28, Z7, D1 \
	VPSLLD $16, Z8, D2 \
	VPANDD Z28, Z8, D3

// MM2 adds the two rows' unpacked blocks (Z9-Z12, Z20-Z23) times vector
// XP's weights at R10 into ACCA and ACCB, in the order ROW does.
#define MM2(XP, ACCA, ACCB) \
	VMOVUPS 0(XP)(R10*1), Z13 \
	VMULPS Z13, Z9, Z18 \
	VADDPS Z18, ACCA, ACCA \
	VMULPS Z13, Z20, Z19 \
	VADDPS Z19, ACCB, ACCB \
	VMOVUPS 64(XP)(R10*1), Z13 \
	VMULPS Z13, Z10, Z18 \
	VADDPS Z18, ACCA, ACCA \
	VMULPS Z13, Z21, Z19 \
	VADDPS Z19, ACCB, ACCB \
	VMOVUPS 128(XP)(R10*1), Z13 \
	VMULPS Z13, Z11, Z18 \
	VADDPS Z18, ACCA, ACCA \
	VMULPS Z13, Z22, Z19 \
	VADDPS Z19, ACCB, ACCB \
	VMOVUPS 192(XP)(R10*1), Z13 \
	VMULPS Z13, Z12, Z18 \
	VADDPS Z18, ACCA, ACCA \
	VMULPS Z13, Z23, Z19 \
	VADDPS Z19, ACCB, ACCB

// MM1 adds row A's unpacked block (Z9-Z12) times vector XP's weights at
// R10 into ACC.
#define MM1(XP, ACC) \
	VMULPS 0(XP)(R10*1), Z9, Z18 \
	VADDPS Z18, ACC, ACC \
	VMULPS 64(XP)(R10*1), Z10, Z18 \
	VADDPS Z18, ACC, ACC \
	VMULPS 128(XP)(R10*1), Z11, Z18 \
	VADDPS Z18, ACC, ACC \
	VMULPS 192(XP)(R10*1), Z12, Z18 \
	VADDPS Z18, ACC, ACC

// func mmBF16Px4AVX512(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table *[64]byte, consts *[2][64]byte)
//
// Two rows at a time, each block unpacked once for the four vectors and
// each vector's weights loaded once for the two rows, then a last odd row
// alone. Every cache line of the two rows is prefetched 4 KiB ahead (a
// block is 1.6 lines: one prefetch a block left every third line to the
// hardware, and ran at 0.6-0.9 of BF16's direct kernel; 2 or 8 KiB ahead,
// or T0, no better). go test -bench PackedAgainstBF16MatMul, Zen 4 VM:
// 0.96-0.98 of BF16 at 4 vectors, 1.2 at 3 (BF16's by vector); at 2
// vectors by vector (1.04) beat this kernel's pairs (0.87).
TEXT ·mmBF16Px4AVX512(SB), NOSPLIT, $0-80
	MOVQ out+0(FP), DI
	MOVQ outStride+8(FP), BX
	MOVQ w+16(FP), R12
	MOVQ wStride+24(FP), DX
	MOVQ rows+32(FP), CX
	MOVQ x+40(FP), R8
	MOVQ xStride+48(FP), AX
	MOVQ nblk+56(FP), SI
	LEAQ (R8)(AX*1), R9
	LEAQ (R9)(AX*1), R11
	LEAQ (R11)(AX*1), R14
	MOVQ table+64(FP), AX
	MOVQ consts+72(FP), R13
	CONSTS(AX, R13)
pair:
	CMPQ CX, $2
	JLT odd
	LEAQ (R12)(DX*1), R15
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	XORQ AX, AX
	XORQ R10, R10
	MOVQ SI, R13
	TESTQ R13, R13
	JEQ foldpair
looppair:
	PREFETCHNTA 4096(R12)(AX*1)
	PREFETCHNTA 4160(R12)(AX*1)
	PREFETCHNTA 4096(R15)(AX*1)
	PREFETCHNTA 4160(R15)(AX*1)
	UNPACKTO(R12, Z9, Z10, Z11, Z12)
	UNPACKTO(R15, Z20, Z21, Z22, Z23)
	MM2(R8, Z0, Z14)
	MM2(R9, Z1, Z15)
	MM2(R11, Z2, Z16)
	MM2(R14, Z3, Z17)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ R13
	JNE looppair
foldpair:
	LEAQ (DI)(BX*2), R13
	FOLD(Z0, Y0, X0, (DI))
	FOLD(Z1, Y1, X1, (DI)(BX*1))
	FOLD(Z2, Y2, X2, (R13))
	FOLD(Z3, Y3, X3, (R13)(BX*1))
	FOLD(Z14, Y14, X14, 4(DI))
	FOLD(Z15, Y15, X15, 4(DI)(BX*1))
	VMOVAPS Z16, Z4 // FOLD's VEX extract takes registers below 16
	VMOVAPS Z17, Z5
	FOLD(Z4, Y4, X4, 4(R13))
	FOLD(Z5, Y5, X5, 4(R13)(BX*1))
	ADDQ $8, DI
	LEAQ (R12)(DX*2), R12
	SUBQ $2, CX
	JMP pair
odd:
	TESTQ CX, CX
	JEQ donex4
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	XORQ AX, AX
	XORQ R10, R10
	MOVQ SI, R13
	TESTQ R13, R13
	JEQ foldodd
loopodd:
	UNPACK(R12)
	MM1(R8, Z0)
	MM1(R9, Z1)
	MM1(R11, Z2)
	MM1(R14, Z3)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ R13
	JNE loopodd
foldodd:
	LEAQ (DI)(BX*2), R13
	FOLD(Z0, Y0, X0, (DI))
	FOLD(Z1, Y1, X1, (DI)(BX*1))
	FOLD(Z2, Y2, X2, (R13))
	FOLD(Z3, Y3, X3, (R13)(BX*1))
donex4:
	VZEROUPPER
	RET

// func mmBF16Px3AVX512(out *float32, outStride int, w unsafe.Pointer, wStride, rows int, x *float32, xStride, nblk int, table *[64]byte, consts *[2][64]byte)
//
// mmBF16Px4AVX512 for three vectors.
TEXT ·mmBF16Px3AVX512(SB), NOSPLIT, $0-80
	MOVQ out+0(FP), DI
	MOVQ outStride+8(FP), BX
	MOVQ w+16(FP), R12
	MOVQ wStride+24(FP), DX
	MOVQ rows+32(FP), CX
	MOVQ x+40(FP), R8
	MOVQ xStride+48(FP), AX
	MOVQ nblk+56(FP), SI
	LEAQ (R8)(AX*1), R9
	LEAQ (R9)(AX*1), R11
	MOVQ table+64(FP), AX
	MOVQ consts+72(FP), R13
	CONSTS(AX, R13)
pair3:
	CMPQ CX, $2
	JLT odd3
	LEAQ (R12)(DX*1), R15
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	VPXORD Z16, Z16, Z16
	XORQ AX, AX
	XORQ R10, R10
	MOVQ SI, R13
	TESTQ R13, R13
	JEQ foldpair3
looppair3:
	PREFETCHNTA 4096(R12)(AX*1)
	PREFETCHNTA 4160(R12)(AX*1)
	PREFETCHNTA 4096(R15)(AX*1)
	PREFETCHNTA 4160(R15)(AX*1)
	UNPACKTO(R12, Z9, Z10, Z11, Z12)
	UNPACKTO(R15, Z20, Z21, Z22, Z23)
	MM2(R8, Z0, Z14)
	MM2(R9, Z1, Z15)
	MM2(R11, Z2, Z16)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ R13
	JNE looppair3
foldpair3:
	LEAQ (DI)(BX*2), R13
	FOLD(Z0, Y0, X0, (DI))
	FOLD(Z1, Y1, X1, (DI)(BX*1))
	FOLD(Z2, Y2, X2, (R13))
	FOLD(Z14, Y14, X14, 4(DI))
	FOLD(Z15, Y15, X15, 4(DI)(BX*1))
	VMOVAPS Z16, Z4 // FOLD's VEX extract takes registers below 16
	FOLD(Z4, Y4, X4, 4(R13))
	ADDQ $8, DI
	LEAQ (R12)(DX*2), R12
	SUBQ $2, CX
	JMP pair3
odd3:
	TESTQ CX, CX
	JEQ donex3
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	XORQ AX, AX
	XORQ R10, R10
	MOVQ SI, R13
	TESTQ R13, R13
	JEQ foldodd3
loopodd3:
	UNPACK(R12)
	MM1(R8, Z0)
	MM1(R9, Z1)
	MM1(R11, Z2)
	ADDQ $104, AX
	ADDQ $256, R10
	DECQ R13
	JNE loopodd3
foldodd3:
	LEAQ (DI)(BX*2), R13
	FOLD(Z0, Y0, X0, (DI))
	FOLD(Z1, Y1, X1, (DI)(BX*1))
	FOLD(Z2, Y2, X2, (R13))
donex3:
	VZEROUPPER
	RET
