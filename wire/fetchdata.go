package wire

import (
	"context"
	"encoding/binary"
	"io"
)

// A FetchData's frame is read and written here without passing its data
// through a frame buffer of its own: a chunk of a store on its way to a
// filling node is written from the holder's buffer and read into the
// fetcher's, where it is kept. (Every other message, and a FetchData
// with little or no data, goes through the generic codec; both ends
// read either form.) On a rig whose nodes fill their stores, copies and
// fresh buffers were a fifth of the CPU.

// directDataMin is the least data a FetchData is sent with directly.
const directDataMin = 4 << 10

// maxFetchErr bounds the error text after a FetchData's data.
const maxFetchErr = 64 << 10

// sendFetchData writes d's frame as its header and msgpack prefix, its
// data, and its error text, with no copy of the data. Call with wmu held.
func (s *Stream) sendFetchData(ctx context.Context, d *FetchData) error {
	var pre [6 + 1 + 9 + 5]byte
	p := append(pre[:0], 0, 0, 0, 0, ProtocolVersion, byte(typeFetchData), 0x93) // a msgpack array of 3: ID, Data, Err
	p = appendUint(p, d.ID)
	p = append(p, 0xc6) // bin32
	p = binary.BigEndian.AppendUint32(p, uint32(len(d.Data)))
	suffix := appendStr(nil, d.Err)
	n := len(p) - 4 + len(d.Data) + len(suffix)
	if n > s.cfg.MaxFrameBytes || uint64(n) > 0xFFFFFFFF {
		return connErrorf(CodeFrameTooLarge, nil, "%v of %d bytes exceeds the frame limit of %d bytes", typeFetchData, n, s.cfg.MaxFrameBytes)
	}
	binary.BigEndian.PutUint32(p, uint32(n))
	return s.writeParts(ctx, p, d.Data, suffix)
}

// appendUint appends v as a msgpack unsigned integer, in its shortest
// form.
func appendUint(b []byte, v uint64) []byte {
	switch {
	case v < 0x80:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

// appendStr appends s as a msgpack string.
func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= 0xff:
		b = append(b, 0xd9, byte(n))
	case n <= 0xffff:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

// readFetchData reads the body of a FetchData frame of size bytes from r,
// its data into the buffer into gives for its ID and length where it
// gives one of that length (otherwise one of its own). A body whose
// prefix is not the one expected (its data nil, say) is read whole and
// handed to the generic decoder.
func (s *Stream) readFetchData(r io.Reader, size int, into func(id uint64, n int) []byte) (Message, error) {
	var pre [1 + 9 + 5]byte
	got := 0
	next := func(n int) ([]byte, error) { // the prefix's next n bytes
		if got+n > size || got+n > len(pre) {
			return nil, connErrorf(CodeMalformed, nil, "%v: a frame of %d bytes ends inside its prefix", typeFetchData, size)
		}
		b := pre[got : got+n]
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, bodyErr(err)
		}
		got += n
		return b, nil
	}
	generic := func() (Message, error) { // the rest of the body, decoded as any frame
		rest, err := readBody(r, size-got) // (allocated whole only once its first piece has come)
		if err != nil {
			return nil, bodyErr(err)
		}
		return s.md.decode(typeFetchData, append(pre[:got:got], rest...), true)
	}
	b, err := next(2)
	if err != nil {
		return nil, err
	}
	if b[0] != 0x93 {
		return generic()
	}
	var id uint64
	switch m := b[1]; {
	case m < 0x80:
		id = uint64(m)
	case m >= 0xcc && m <= 0xcf:
		v, err := next(1 << (m - 0xcc))
		if err != nil {
			return nil, err
		}
		id = bigEndian(v)
	default:
		return generic()
	}
	b, err = next(1)
	if err != nil {
		return nil, err
	}
	if b[0] < 0xc4 || b[0] > 0xc6 {
		return generic()
	}
	l, err := next(1 << (b[0] - 0xc4))
	if err != nil {
		return nil, err
	}
	n := bigEndian(l)
	if n > uint64(size-got) {
		return nil, connErrorf(CodeMalformed, nil, "%v: %d bytes of data in a frame of %d", typeFetchData, n, size)
	}
	rest := size - got - int(n)
	if rest > maxFetchErr || rest < 1 {
		return nil, connErrorf(CodeMalformed, nil, "%v: %d bytes after its data", typeFetchData, rest)
	}
	data := into(id, int(n))
	if len(data) == int(n) {
		_, err = io.ReadFull(r, data)
	} else { // nobody waits for it: a buffer of its own, allocated whole once its first piece has come
		data, err = readBody(r, int(n))
	}
	if err != nil {
		return nil, bodyErr(err)
	}
	tail := make([]byte, rest)
	if _, err := io.ReadFull(r, tail); err != nil {
		return nil, bodyErr(err)
	}
	msg, ok := parseStr(tail)
	if !ok {
		return nil, connErrorf(CodeMalformed, nil, "%v: its error is not a msgpack string of %d bytes", typeFetchData, rest)
	}
	return &FetchData{ID: id, Data: data, Err: msg}, nil
}

// parseStr is b as one msgpack string (or nil) and nothing more.
func parseStr(b []byte) (string, bool) {
	if len(b) == 1 && b[0] == 0xc0 {
		return "", true
	}
	var hdr, n int
	switch m := b[0]; {
	case m >= 0xa0 && m <= 0xbf:
		hdr, n = 1, int(m&0x1f)
	case m >= 0xd9 && m <= 0xdb:
		hdr = 1 + 1<<(m-0xd9)
		if len(b) < hdr {
			return "", false
		}
		n = int(bigEndian(b[1:hdr]))
	default:
		return "", false
	}
	if len(b) != hdr+n {
		return "", false
	}
	return string(b[hdr:]), true
}

// bigEndian is b (1, 2, 4 or 8 bytes) as an unsigned number.
func bigEndian(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// bodyErr is a body read's error as frameReader.next says it.
func bodyErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return connErrorf(CodeMalformed, err, "stream ends inside a %v frame", typeFetchData)
	}
	return err
}
