package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// ProtocolVersion is the version of the message set this build speaks.
// Both ends of a connection must speak the same one.
const ProtocolVersion = 25 // 8: an Alignment in a pass carries prompt chunks (Chunk, PromptLeft); 9: ShadowDone.Reused; 10: SequenceEnd.Last; 11: Alignment.Final; 12: Prediction.Workers, Withdraw.Layer/Experts, ShadowDone.RewoundSeqs; 13: Hello.Device; 14: WorkerStats.CPU, ShadowDone.CPU; 15: Alignment.Sampling, ShadowDone.AgreedSeqs; 16: the stage messages (StageRun, StageRoutes, StageRows, StageKV, StageEnd), Hello.Layers/Quant; 17: Sampling.MinP/Repeat/RepeatN/RepeatTail; 18: StageRun.Batch/Pass/Prefill (a main stage runs its experts under its first stage's step); 19: Hello.Context; 20: Alignment.Pos/Guesses/Draft, Drafts; 21: FetchRequest, FetchData, WorkerStats.StoreFetched/StoreServed, Place; 22: FetchRequest.Model/File/Tensor, Place.Peers, ShareIn; 23: StageRows.CPU; 24: FetchRequest/FetchData over a Stream (TCP + TLS), not QUIC; 25: Place.Holders

// defaultMaxFrameBytes bounds a frame unless Config.MaxFrameBytes says
// otherwise: the largest message is an expert chunk or a prefill batch.
const defaultMaxFrameBytes = 64 << 20

// A frame is
//
//	length  uint32, big-endian: the bytes that follow (>= 2)
//	version uint8: ProtocolVersion
//	type    uint8: the message Type
//	body    length-2 bytes: the message as a msgpack array
const frameHeaderLen = 6

// keepFrameBuf is the largest buffer the control stream keeps between
// frames; keepBulkBuf the largest a pooled bulk encoder keeps.
const (
	keepFrameBuf = 1 << 20
	keepBulkBuf  = 16 << 20
)

// frameEncoder encodes messages into frames, reusing its buffer.
type frameEncoder struct {
	buf  []byte
	keep int // the largest buffer kept for the next frame
	enc  *msgpack.Encoder
}

func newFrameEncoder(keep int) *frameEncoder {
	fe := &frameEncoder{keep: keep}
	fe.enc = msgpack.NewEncoder(fe)
	fe.enc.UseCompactInts(true)
	return fe
}

// Write and WriteByte let the msgpack encoder append to fe.buf directly.
func (fe *frameEncoder) Write(p []byte) (int, error) {
	fe.buf = append(fe.buf, p...)
	return len(p), nil
}

func (fe *frameEncoder) WriteByte(c byte) error {
	fe.buf = append(fe.buf, c)
	return nil
}

// encode returns the frame of m, valid until the next call. A frame
// longer than maxBytes is refused with ErrFrameTooLarge.
func (fe *frameEncoder) encode(m Message, maxBytes int) ([]byte, error) {
	if cap(fe.buf) > fe.keep {
		fe.buf = nil
	}
	fe.buf = slices.Grow(fe.buf[:0], payloadBytes(m)+256) // one allocation for a big message
	fe.buf = append(fe.buf, 0, 0, 0, 0, ProtocolVersion, byte(m.Type()))
	if err := fe.enc.Encode(m); err != nil {
		return nil, connErrorf(CodeInternal, err, "encode %v: %v", m.Type(), err)
	}
	n := len(fe.buf) - 4
	if n > maxBytes || uint64(n) > 0xFFFFFFFF {
		return nil, connErrorf(CodeFrameTooLarge, nil, "%v of %d bytes exceeds the frame limit of %d bytes", m.Type(), n, maxBytes)
	}
	binary.BigEndian.PutUint32(fe.buf, uint32(n))
	return fe.buf, nil
}

// payloadBytes is the size of the tensors and data a message carries.
func payloadBytes(m Message) int {
	switch m := m.(type) {
	case *Activation:
		return len(m.Hidden.Data)
	case *ExpertResult:
		return len(m.Output.Data)
	case *Alignment:
		n := 0
		for i := range m.Keys {
			n += len(m.Keys[i].Data) + 16
		}
		for i := range m.Values {
			n += len(m.Values[i].Data) + 16
		}
		return n
	}
	return 0
}

// frameReader reads frames from one stream.
type frameReader struct {
	r        io.Reader
	maxBytes int
	reuse    bool // keep one buffer for frames up to keepFrameBuf
	// buffers, if set, must make room for a frame's body before it is
	// read (it blocks until there is, or fails when the connection ends);
	// next gives the room back itself only on error.
	buffers interface {
		reserve(n int64) error
		unreserve(n int64)
	}
	// headers, if set, counts every header that passes the checks.
	headers *atomic.Uint64
	// bodyDeadline, if set, is called with the time a body must have
	// arrived by once its room is reserved, and with the zero time once it
	// has (a bulk stream's read deadline: Config.FrameBodyTimeout).
	bodyDeadline func(time.Time)
	bodyTimeout  time.Duration
	hdr          [frameHeaderLen]byte
	buf          []byte
}

// readPiece is the most of a frame body allocated before its bytes
// arrive: a body is never allocated whole from the length its header
// claims (readBody).
const readPiece = 1 << 20

// next reads the next frame and returns its type and body. If owned, the
// body is the caller's to keep (a decoded message may share it);
// otherwise it is valid until the next call. With buffers set, the body's
// length stays reserved until the caller gives it back. At a clean end of
// the stream next returns io.EOF; every other error is a *ConnError (bad
// input), the stream's own error, or the end of the connection while the
// frame waited for buffer room.
func (fr *frameReader) next() (typ Type, body []byte, owned bool, err error) {
	typ, size, err := fr.header()
	if err != nil {
		return 0, nil, false, err
	}
	body, owned, err = fr.body(typ, size)
	return typ, body, owned, err
}

// header reads and checks the next frame's header, and returns its type
// and the size of its body (which body, or the caller, reads next).
func (fr *frameReader) header() (Type, int, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, 0, connErrorf(CodeMalformed, err, "stream ends inside a frame header")
		}
		return 0, 0, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[:4])
	version, typ := fr.hdr[4], Type(fr.hdr[5])
	switch {
	case n < 2:
		return 0, 0, connErrorf(CodeMalformed, nil, "frame length %d is shorter than its header", n)
	case uint64(n) > uint64(fr.maxBytes):
		return 0, 0, connErrorf(CodeFrameTooLarge, nil, "%v frame of %d bytes exceeds the limit of %d bytes", typ, n, fr.maxBytes)
	case version != ProtocolVersion:
		return 0, 0, connErrorf(CodeBadVersion, nil, "peer speaks protocol version %d, this build speaks %d", version, ProtocolVersion)
	case newMessage(typ) == nil:
		return 0, 0, connErrorf(CodeUnknownType, nil, "unknown message type %d", uint8(typ))
	}
	if fr.headers != nil {
		fr.headers.Add(1)
	}
	return typ, int(n) - 2, nil
}

// body reads the body of size bytes of a frame of type typ whose header
// was just read (next says how).
func (fr *frameReader) body(typ Type, size int) (body []byte, owned bool, err error) {
	if fr.buffers != nil {
		if err := fr.buffers.reserve(int64(size)); err != nil {
			return nil, false, fmt.Errorf("waiting for room for a %v frame of %d bytes: %w", typ, size, err)
		}
	}
	if fr.bodyDeadline != nil {
		fr.bodyDeadline(time.Now().Add(fr.bodyTimeout))
		defer fr.bodyDeadline(time.Time{})
	}
	if fr.reuse && size <= keepFrameBuf {
		if cap(fr.buf) < size {
			fr.buf = make([]byte, size, keepFrameBuf)
		}
		body = fr.buf[:size]
		_, err = io.ReadFull(fr.r, body)
	} else {
		body, err = readBody(fr.r, size)
		owned = true
	}
	if err != nil {
		if fr.buffers != nil {
			fr.buffers.unreserve(int64(size))
		}
		if size >= dropAfterBytes { // a body cut short or stalled: its bytes are garbage now
			memoryBack.soon()
		}
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil, false, connErrorf(CodeMalformed, err, "stream ends inside a %v frame", typ)
		}
		return nil, false, err
	}
	return body, owned, nil
}

// readBody reads a frame body of size bytes into a buffer of its own. A
// body up to readPiece is allocated at once. A bigger one is read into a
// pooled first piece, and only once that piece has arrived, so that the
// peer has shown it is sending the frame, is the whole body allocated.
// (The room reserved before, in next, bounds what a connection's frames
// hold together. Growing the body further in step with its bytes was
// tried: pieces until half the body had come made a 64 MiB frame read
// from memory several times slower, BenchmarkReadFrame, for a bound the
// reserved room already gives.)
func readBody(r io.Reader, size int) ([]byte, error) {
	if size <= readPiece {
		body := make([]byte, size)
		_, err := io.ReadFull(r, body)
		return body, err
	}
	piece := firstPieces.Get().(*[]byte)
	defer firstPieces.Put(piece)
	if _, err := io.ReadFull(r, *piece); err != nil {
		return nil, err
	}
	body := make([]byte, size)
	copy(body, *piece)
	if _, err := io.ReadFull(r, body[readPiece:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// firstPieces are the buffers big frames start in (readBody).
var firstPieces = sync.Pool{New: func() any {
	b := make([]byte, readPiece)
	return &b
}}

// messageDecoder decodes frame bodies into messages, reusing its state.
type messageDecoder struct {
	rd  bodyReader
	dec *msgpack.Decoder
}

// bodyReader is the frame body a messageDecoder reads; with alias set,
// byte strings (tensor data, chunks) are slices of body, not copies.
type bodyReader struct {
	bytes.Reader
	body  []byte
	alias bool
}

func newMessageDecoder() *messageDecoder {
	md := &messageDecoder{}
	md.dec = msgpack.NewDecoder(&md.rd)
	return md
}

// decode decodes the body of a frame of type typ. If owned, the message
// may share memory with body (which then must not change); otherwise it
// shares none. Bad input is a *ConnError: ErrUnknownType, ErrMalformed
// or ErrBadTensor.
func (md *messageDecoder) decode(typ Type, body []byte, owned bool) (Message, error) {
	m := newMessage(typ)
	if m == nil {
		return nil, connErrorf(CodeUnknownType, nil, "unknown message type %d", uint8(typ))
	}
	// msgpack allocates what a length field declares before reading the
	// data; checking every length against the body first bounds that.
	if err := checkMsgpack(body); err != nil {
		return nil, connErrorf(CodeMalformed, err, "%v: %v", typ, err)
	}
	md.rd.Reset(body)
	md.rd.body, md.rd.alias = body, owned
	md.dec.Reset(&md.rd)
	defer func() { md.rd.body = nil }()
	if err := md.dec.Decode(m); err != nil {
		return nil, connErrorf(CodeMalformed, err, "%v: %v", typ, err)
	}
	if md.rd.Len() != 0 {
		return nil, connErrorf(CodeMalformed, nil, "%v: %d bytes after the message", typ, md.rd.Len())
	}
	if err := m.validate(); err != nil {
		var ce *ConnError
		if errors.As(err, &ce) {
			ce.Reason = typ.String() + ": " + ce.Reason
		}
		return nil, err
	}
	return m, nil
}

// decodeBytes decodes a msgpack byte string, as a slice of the frame
// body when the decoder may alias it.
func decodeBytes(d *msgpack.Decoder) ([]byte, error) {
	br, ok := d.Buffered().(*bodyReader)
	if !ok || !br.alias {
		return d.DecodeBytes()
	}
	n, err := d.DecodeBytesLen()
	if err != nil || n < 0 {
		return nil, err
	}
	if n > br.Len() {
		return nil, fmt.Errorf("byte string of %d bytes, %d left", n, br.Len())
	}
	off := len(br.body) - br.Len()
	if _, err := br.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, err
	}
	return br.body[off : off+n : off+n], nil
}

// checkMsgpack verifies that b is exactly one msgpack value and that no
// length inside it (string, binary, array, map, extension) claims more
// bytes or items than b has left. It does not recurse, so nesting depth
// costs nothing.
func checkMsgpack(b []byte) error {
	i, pending := 0, uint64(1)
	for pending > 0 {
		if i >= len(b) {
			return errors.New("truncated msgpack")
		}
		c := b[i]
		i++
		pending--
		var skip, items uint64 // bytes to skip, items that follow
		var lenBytes int       // size of a length field that follows c
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixint, nil, bool
		case c <= 0x8f:
			items = 2 * uint64(c&0x0f)
		case c <= 0x9f:
			items = uint64(c & 0x0f)
		case c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			lenBytes = 1
		case c == 0xc5 || c == 0xda:
			lenBytes = 2
		case c == 0xc6 || c == 0xdb:
			lenBytes = 4
		case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext8/16/32: length, then a type byte
			lenBytes = 1 << (c - 0xc7)
			skip = 1
		case c == 0xca:
			skip = 4
		case c == 0xcb:
			skip = 8
		case c >= 0xcc && c <= 0xcf: // uint8..uint64
			skip = 1 << (c - 0xcc)
		case c >= 0xd0 && c <= 0xd3: // int8..int64
			skip = 1 << (c - 0xd0)
		case c >= 0xd4 && c <= 0xd8: // fixext1..16: type byte + data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc || c == 0xde: // array16, map16
			lenBytes = 2
		case c == 0xdd || c == 0xdf:
			lenBytes = 4
		default: // 0xc1: never used
			return fmt.Errorf("msgpack code %#x at byte %d", c, i-1)
		}
		if lenBytes > 0 {
			if len(b)-i < lenBytes {
				return errors.New("truncated msgpack length")
			}
			var n uint64
			for _, x := range b[i : i+lenBytes] {
				n = n<<8 | uint64(x)
			}
			i += lenBytes
			switch c {
			case 0xdc, 0xdd:
				items = n
			case 0xde, 0xdf:
				items = 2 * n
			default:
				skip += n
			}
		}
		left := uint64(len(b) - i)
		if skip > left {
			return fmt.Errorf("msgpack value at byte %d claims %d bytes, %d left", i, skip, left)
		}
		i += int(skip)
		pending += items
		if pending > left-skip { // every item takes at least one byte
			return fmt.Errorf("msgpack container at byte %d claims %d items, %d bytes left", i, pending, left-skip)
		}
	}
	if i != len(b) {
		return fmt.Errorf("%d bytes after the msgpack value", len(b)-i)
	}
	return nil
}
