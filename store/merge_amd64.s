//go:build !purego

#include "textflag.h"

// func mergeBF16x16(dst, exp, sm *byte, blocks int)
//
// Per 16 elements: interleave sm (low) and exponent (high) bytes into
// 16-bit lanes r, then rotate each lane right by one: r>>1 | r<<15.
// Both inputs are loaded before the two stores (see merge's overlap rule).
TEXT ·mergeBF16x16(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ exp+8(FP), SI
	MOVQ sm+16(FP), DX
	MOVQ blocks+24(FP), CX
	TESTQ CX, CX
	JZ   done

loop:
	MOVOU (SI), X0
	MOVOU (DX), X1
	MOVO  X1, X2
	PUNPCKLBW X0, X1
	PUNPCKHBW X0, X2
	MOVO  X1, X3
	MOVO  X2, X4
	PSRLW $1, X1
	PSLLW $15, X3
	PSRLW $1, X2
	PSLLW $15, X4
	POR   X3, X1
	POR   X4, X2
	MOVOU X1, (DI)
	MOVOU X2, 16(DI)
	ADDQ  $16, SI
	ADDQ  $16, DX
	ADDQ  $32, DI
	DECQ  CX
	JNZ   loop

done:
	RET
