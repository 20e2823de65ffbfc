package store

import (
	"encoding/binary"

	"github.com/odmoe/odmoe/kernels"
)

// The bit-field split of FORMAT.md, "Streams": every element becomes one
// exponent byte (entropy-coded) and smWidth sign+mantissa bytes (raw).
//
//	BF16: r = rotl16(x, 1);  exponent = r>>8 (bits 14..7 of x);  sm = r&0xff (mantissa<<1 | sign)
//	F16:  exponent = x>>8 (sign, 5 exponent bits, 2 mantissa bits);  sm = x&0xff
//	F32:  r = rotl32(x, 1);  exponent = r>>24 (bits 30..23 of x);  sm = r&0xffffff, 3 bytes LE

// split writes the exponent and sign-mantissa streams of raw (whole
// elements of dt) into exp (one byte per element) and sm.
func split(dt kernels.DType, exp, sm, raw []byte) {
	le := binary.LittleEndian
	switch dt {
	case kernels.BF16:
		for i := range exp {
			x := le.Uint16(raw[2*i:])
			r := x<<1 | x>>15
			exp[i], sm[i] = byte(r>>8), byte(r)
		}
	case kernels.F16:
		for i := range exp {
			exp[i], sm[i] = raw[2*i+1], raw[2*i]
		}
	case kernels.F32:
		for i := range exp {
			x := le.Uint32(raw[4*i:])
			r := x<<1 | x>>31
			exp[i] = byte(r >> 24)
			sm[3*i], sm[3*i+1], sm[3*i+2] = byte(r), byte(r>>8), byte(r>>16)
		}
	case kernels.MXFP4, kernels.F8E4M3: // every byte coded whole
		copy(exp, raw)
	}
}

// merge is split's inverse: it writes len(exp) elements of dt into dst.
//
// sm may overlap dst in one way only, the way the reader lays a shard out:
// sm starts at or after dst[len(exp)] (the sign-mantissa chunk is read
// into the tail of the shard's output). Each step loads its inputs before
// it stores, and its stores end below the next step's loads, so merging
// in place is exact.
func merge(dt kernels.DType, dst, exp, sm []byte) {
	switch dt {
	case kernels.BF16:
		n := mergeBF16Asm(dst, exp, sm)
		mergeBF16Go(dst[2*n:], exp[n:], sm[n:])
	case kernels.F16:
		mergeF16Go(dst, exp, sm)
	case kernels.F32:
		mergeF32Go(dst, exp, sm)
	case kernels.MXFP4, kernels.F8E4M3:
		copy(dst, exp)
	}
}

// spread moves the low 4 bytes of x into the low bytes of 4 16-bit lanes.
func spread(x uint64) uint64 {
	x &= 0xffffffff
	x = (x | x<<16) & 0x0000ffff0000ffff
	return (x | x<<8) & 0x00ff00ff00ff00ff
}

// rotr1x4 rotates each of four 16-bit lanes right by one bit.
func rotr1x4(x uint64) uint64 {
	return (x>>1)&0x7fff7fff7fff7fff | (x&0x0001000100010001)<<15
}

// mergeBF16Go is the portable BF16 merge, 8 elements per step (SWAR).
func mergeBF16Go(dst, exp, sm []byte) {
	le := binary.LittleEndian
	n := len(exp)
	sm, dst = sm[:n], dst[:2*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		e, s := le.Uint64(exp[i:]), le.Uint64(sm[i:])
		lo := rotr1x4(spread(s) | spread(e)<<8)
		hi := rotr1x4(spread(s>>32) | spread(e>>32)<<8)
		le.PutUint64(dst[2*i:], lo)
		le.PutUint64(dst[2*i+8:], hi)
	}
	for ; i < n; i++ {
		r := uint16(exp[i])<<8 | uint16(sm[i])
		le.PutUint16(dst[2*i:], r>>1|r<<15)
	}
}

// mergeF16Go interleaves the high (exp) and low (sm) bytes of F16.
func mergeF16Go(dst, exp, sm []byte) {
	le := binary.LittleEndian
	n := len(exp)
	sm, dst = sm[:n], dst[:2*n]
	i := 0
	for ; i+8 <= n; i += 8 {
		e, s := le.Uint64(exp[i:]), le.Uint64(sm[i:])
		le.PutUint64(dst[2*i:], spread(s)|spread(e)<<8)
		le.PutUint64(dst[2*i+8:], spread(s>>32)|spread(e>>32)<<8)
	}
	for ; i < n; i++ {
		s := sm[i]
		dst[2*i], dst[2*i+1] = s, exp[i]
	}
}

// mergeF32Go rebuilds F32 elements one at a time (F32 experts are rare;
// the loads of element i still precede its stores, as merge requires).
func mergeF32Go(dst, exp, sm []byte) {
	n := len(exp)
	sm, dst = sm[:3*n], dst[:4*n]
	for i := range n {
		r := uint32(exp[i])<<24 | uint32(sm[3*i+2])<<16 | uint32(sm[3*i+1])<<8 | uint32(sm[3*i])
		binary.LittleEndian.PutUint32(dst[4*i:], r>>1|r<<31)
	}
}
