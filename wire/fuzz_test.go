package wire

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzFrames feeds arbitrary bytes to the frame reader and the message
// decoder, as a hostile or broken peer's stream would. They must never
// panic, and whatever they accept must re-encode to a frame that decodes
// to the same bytes again.
func FuzzFrames(f *testing.F) {
	all := append(sampleMessages(8), &Hello{Name: "w1", Role: RoleWorker, Features: []string{"x"}})
	f.Add(frames(f, all...))
	for _, m := range all {
		f.Add(frames(f, m))
	}
	for _, tc := range badFrames(f) {
		f.Add(tc.input)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, _ := readAll(data, 1<<20, len(data)%2 == 0)
		fe := newFrameEncoder(keepFrameBuf)
		for _, m := range msgs {
			b1, err := fe.encode(m, 1<<22)
			if err != nil {
				t.Fatalf("re-encoding a decoded %v: %v", m.Type(), err)
			}
			b1 = bytes.Clone(b1)
			again, err := readAll(b1, 1<<22, false)
			if err != nil || len(again) != 1 {
				t.Fatalf("a re-encoded %v does not decode: %v", m.Type(), err)
			}
			b2, _ := fe.encode(again[0], 1<<22)
			if !bytes.Equal(b1, b2) {
				t.Fatalf("%v changes on a second round trip", m.Type())
			}
		}
	})
}

// FuzzMessageBody feeds arbitrary bodies of every message type to the
// decoder (the frame header being valid), which reaches deeper into
// msgpack than FuzzFrames finds by itself.
func FuzzMessageBody(f *testing.F) {
	all := append(sampleMessages(8), &Hello{Name: "w1", Role: RoleWorker, Features: []string{"x"}})
	for _, m := range all {
		fr := frames(f, m)
		f.Add(byte(m.Type()), false, fr[frameHeaderLen:])
		f.Add(byte(m.Type()), true, fr[frameHeaderLen:])
	}
	f.Add(byte(typeActivation), true, []byte{0x99, 1, 1, 1, 1, 0x90, 0x93, 1, 0x91, 1, 0xc6, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, typ byte, owned bool, body []byte) {
		md := newMessageDecoder()
		m, err := md.decode(Type(typ), body, owned)
		if err != nil {
			if m != nil {
				t.Fatal("message and error")
			}
			return
		}
		if err := m.validate(); err != nil {
			t.Fatalf("decoded %v fails validation: %v", m.Type(), err)
		}
	})
}

// FuzzCheckMsgpack: the length checker never panics, and what it accepts
// msgpack reads as exactly one value, to the last byte. (Only accepted
// input is decoded: unchecked, msgpack would allocate what it is told.)
func FuzzCheckMsgpack(f *testing.F) {
	for _, m := range sampleMessages(4) {
		fr := frames(f, m)
		f.Add(fr[frameHeaderLen:])
	}
	f.Add([]byte{0x92, 0xc4, 0x01, 0xff, 0xde, 0x00, 0x01, 0xa1, 'k', 0xc0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkMsgpack(b) != nil {
			return
		}
		r := bytes.NewReader(b)
		var v any
		if err := msgpack.NewDecoder(r).Decode(&v); err == nil && r.Len() != 0 {
			t.Fatalf("checker accepted %x, but msgpack reads only %d of its %d bytes", b, len(b)-r.Len(), len(b))
		}
	})
}
