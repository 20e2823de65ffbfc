package store

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/huff0"

	"github.com/odmoe/odmoe/kernels"
)

// An exponent chunk is the blocks of one shard's exponent stream, each a
// 4-byte header (payload length in the low 24 bits, mode in the high 8)
// and its payload. A block holds blockElems exponent bytes, the last one
// of a shard fewer.
const (
	blockHeaderLen = 4

	// defaultTableLog caps huff0 code lengths at 8 bits, which keeps the
	// decoder on its fastest (8-bit table) path: about 8% faster decoding
	// for 0.3% more bytes than huff0's own choice (up to 11); FORMAT.md.
	defaultTableLog = 8

	modeRaw   = 0 // payload is the exponent bytes
	modeRLE   = 1 // payload is one byte, repeated
	modeHuff0 = 2 // payload is a huff0 table and 4X stream
)

// encoder turns shards into chunks; one per converting goroutine.
type encoder struct {
	// tableLog caps huff0 code lengths (0: defaultTableLog).
	tableLog uint8
	huff     huff0.Scratch
	exp      []byte
	check    []byte
	dec      decoder
}

// encodeShard splits raw (one shard, whole elements of dt) and returns its
// exponent chunk and sign-mantissa chunk; it adds the exponent bytes to
// hist. The chunks are decoded again and compared with raw before they are
// returned: a coder bug fails the conversion instead of shipping wrong
// weights.
func (enc *encoder) encodeShard(dt kernels.DType, raw []byte, blockElems int, hist *[256]uint64) (expChunk, sm []byte, err error) {
	n := len(raw) / elemSize(dt)
	enc.exp = grow(enc.exp, n)
	exp := enc.exp[:n]
	sm = make([]byte, n*smWidth(dt))
	split(dt, exp, sm, raw)
	for _, e := range exp {
		hist[e]++
	}
	expChunk = make([]byte, 0, n/2+64)
	for lo := 0; lo < n; lo += blockElems {
		if expChunk, err = enc.appendBlock(expChunk, exp[lo:min(lo+blockElems, n)]); err != nil {
			return nil, nil, err
		}
	}
	// Round trip through the reader's own code path, in the reader's layout.
	enc.check = grow(enc.check, len(raw))
	check := enc.check[:len(raw)]
	copy(check[n:], sm)
	if err := enc.dec.decodeShard(dt, expChunk, check, n, blockElems); err != nil {
		return nil, nil, fmt.Errorf("round trip: %w", err)
	}
	if !bytes.Equal(check, raw) {
		return nil, nil, errors.New("round trip: decoded bytes differ from the original")
	}
	return expChunk, sm, nil
}

// appendBlock codes one block of exponent bytes.
func (enc *encoder) appendBlock(dst, block []byte) ([]byte, error) {
	enc.huff.Reuse = huff0.ReusePolicyNone // every block carries its own table
	enc.huff.TableLog = cmp.Or(enc.tableLog, defaultTableLog)
	out, _, err := huff0.Compress4X(block, &enc.huff)
	switch {
	case err == nil && len(out) < len(block):
		return append(appendBlockHeader(dst, modeHuff0, len(out)), out...), nil
	case errors.Is(err, huff0.ErrUseRLE):
		return append(appendBlockHeader(dst, modeRLE, 1), block[0]), nil
	case err == nil || errors.Is(err, huff0.ErrIncompressible):
		return append(appendBlockHeader(dst, modeRaw, len(block)), block...), nil
	}
	return nil, fmt.Errorf("huff0: %w", err)
}

func appendBlockHeader(dst []byte, mode, size int) []byte {
	return binary.LittleEndian.AppendUint32(dst, uint32(mode)<<24|uint32(size))
}

// decoder turns chunks back into weights; one per decoding goroutine.
type decoder struct {
	huff  huff0.Scratch
	exp   []byte // one decoded block
	chunk []byte // the exponent chunk being decoded
}

// decodeShard decodes one shard of n elements into out (n*elemSize(dt)
// bytes), whose tail out[n:] already holds the sign-mantissa chunk.
func (d *decoder) decodeShard(dt kernels.DType, expChunk, out []byte, n, blockElems int) error {
	sm := out[n:]
	w := smWidth(dt)
	d.exp = grow(d.exp, blockElems)
	p := expChunk
	for lo := 0; lo < n; lo += blockElems {
		bn := min(blockElems, n-lo)
		if len(p) < blockHeaderLen {
			return fmt.Errorf("block at element %d: chunk ends: %w", lo, ErrCorrupt)
		}
		h := binary.LittleEndian.Uint32(p)
		mode, size := int(h>>24), int(h&0xffffff)
		p = p[blockHeaderLen:]
		if size > len(p) {
			return fmt.Errorf("block at element %d: %d-byte payload, %d bytes left: %w", lo, size, len(p), ErrCorrupt)
		}
		payload := p[:size]
		p = p[size:]
		var exp []byte
		switch mode {
		case modeRaw:
			if size != bn {
				return fmt.Errorf("block at element %d: raw block of %d bytes, want %d: %w", lo, size, bn, ErrCorrupt)
			}
			exp = payload
		case modeRLE:
			if size != 1 {
				return fmt.Errorf("block at element %d: run block of %d bytes: %w", lo, size, ErrCorrupt)
			}
			exp = d.exp[:bn]
			for i := range exp {
				exp[i] = payload[0]
			}
		case modeHuff0:
			s, rest, err := huff0.ReadTable(payload, &d.huff)
			if err != nil {
				return fmt.Errorf("block at element %d: huff0 table: %v: %w", lo, err, ErrCorrupt)
			}
			if exp, err = s.Decoder().Decompress4X(d.exp[:0:bn], rest); err != nil {
				return fmt.Errorf("block at element %d: huff0: %v: %w", lo, err, ErrCorrupt)
			}
			if len(exp) != bn {
				return fmt.Errorf("block at element %d: decoded %d bytes, want %d: %w", lo, len(exp), bn, ErrCorrupt)
			}
		default:
			return fmt.Errorf("block at element %d: unknown mode %d: %w", lo, mode, ErrCorrupt)
		}
		merge(dt, out[lo*elemSize(dt):(lo+bn)*elemSize(dt)], exp, sm[lo*w:(lo+bn)*w])
	}
	if len(p) != 0 {
		return fmt.Errorf("%d stray bytes after the last block: %w", len(p), ErrCorrupt)
	}
	return nil
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
