//go:build !purego

#include "textflag.h"

// func mergeBF16x16(dst, exp, sm *byte, blocks int)
//
// Per 16 elements: ZIP sm (even bytes) with exponent (odd bytes) into
// 16-bit lanes r, then r<<15 with r>>1 shifted in (SRI): a rotate right
// by one. Both inputs are loaded before the store (see merge's overlap rule).
TEXT ·mergeBF16x16(SB), NOSPLIT, $0-32
	MOVD dst+0(FP), R0
	MOVD exp+8(FP), R1
	MOVD sm+16(FP), R2
	MOVD blocks+24(FP), R3
	CBZ  R3, done

loop:
	VLD1.P 16(R1), [V0.B16]
	VLD1.P 16(R2), [V1.B16]
	VZIP1  V0.B16, V1.B16, V2.B16
	VZIP2  V0.B16, V1.B16, V3.B16
	VSHL   $15, V2.H8, V4.H8
	VSHL   $15, V3.H8, V5.H8
	VSRI   $1, V2.H8, V4.H8
	VSRI   $1, V3.H8, V5.H8
	VST1.P [V4.B16, V5.B16], 32(R0)
	SUBS   $1, R3, R3
	BNE    loop

done:
	RET
