package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// frames encodes msgs into one byte stream.
func frames(t testing.TB, msgs ...Message) []byte {
	t.Helper()
	var out []byte
	fe := newFrameEncoder(keepFrameBuf)
	for _, m := range msgs {
		f, err := fe.encode(m, defaultMaxFrameBytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f...)
	}
	return out
}

// readAll decodes every frame of b, reusing one buffer (and copying) if
// reuse, else aliasing each frame's buffer.
func readAll(b []byte, maxBytes int, reuse bool) ([]Message, error) {
	fr := &frameReader{r: bytes.NewReader(b), maxBytes: maxBytes, reuse: reuse}
	md := newMessageDecoder()
	var msgs []Message
	for {
		typ, body, owned, err := fr.next()
		if err == io.EOF {
			return msgs, nil
		}
		if err != nil {
			return msgs, err
		}
		m, err := md.decode(typ, body, owned)
		if err != nil {
			return msgs, err
		}
		msgs = append(msgs, m)
	}
}

func TestFramesRoundTripEveryMessageType(t *testing.T) {
	msgs := append(sampleMessages(4096), &Hello{Name: "w1", Role: RoleWorker, Version: "dev", Arch: "arm64", DeviceMemBytes: 1 << 30, Features: []string{"bf16"}})
	for _, reuse := range []bool{true, false} {
		got, err := readAll(frames(t, msgs...), defaultMaxFrameBytes, reuse)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(msgs) {
			t.Fatalf("decoded %d messages, want %d", len(got), len(msgs))
		}
		for i := range msgs { // with reuse, a message sharing the buffer would be overwritten by now
			if !reflect.DeepEqual(got[i], msgs[i]) {
				t.Errorf("reuse=%v %v: decoded\n%+v\nwant\n%+v", reuse, msgs[i].Type(), got[i], msgs[i])
			}
		}
	}
}

func TestTensorBitsSurviveTheWire(t *testing.T) {
	want := ramp(1000)
	got, err := readAll(frames(t, &Activation{Tokens: 1, Hidden: Float32Tensor(want, 1, 1000)}), defaultMaxFrameBytes, false)
	if err != nil {
		t.Fatal(err)
	}
	v, err := got[0].(*Activation).Hidden.Float32s()
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if f32bits(v[i]) != f32bits(want[i]) {
			t.Fatalf("element %d: bits %#x, want %#x", i, f32bits(v[i]), f32bits(want[i]))
		}
	}
}

// frame builds a raw frame with the given header fields and body.
func frame(length uint32, version byte, typ Type, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, length)
	return append(append(b, version, byte(typ)), body...)
}

func rawFrame(typ Type, body []byte) []byte {
	return frame(uint32(len(body)+2), ProtocolVersion, typ, body)
}

func mustMsgpack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// badFrames are inputs the decoder must refuse, with the code it must
// refuse them with.
func badFrames(t testing.TB) []struct {
	name  string
	input []byte
	code  ErrorCode
} {
	pred := mustMsgpack(t, &Prediction{Pass: 1, Layer: 2, Experts: []int32{3}})
	badTensor := mustMsgpack(t, &Activation{Tokens: 1, Hidden: Tensor{DType: F32, Shape: []int{1, 4}, Data: make([]byte, 15)}})
	return []struct {
		name  string
		input []byte
		code  ErrorCode
	}{
		{"oversized frame", frame(1<<30, ProtocolVersion, typePrediction, nil), CodeFrameTooLarge},
		{"length shorter than header", frame(1, ProtocolVersion, typePrediction, nil), CodeMalformed},
		{"an older protocol version", frame(uint32(len(pred)+2), ProtocolVersion-1, typePrediction, pred), CodeBadVersion},
		{"a newer protocol version", frame(uint32(len(pred)+2), ProtocolVersion+1, typePrediction, pred), CodeBadVersion},
		{"unknown type", rawFrame(200, pred), CodeUnknownType},
		{"type zero", rawFrame(0, pred), CodeUnknownType},
		{"truncated header", rawFrame(typePrediction, pred)[:3], CodeMalformed},
		{"truncated body", rawFrame(typePrediction, pred)[:8], CodeMalformed},
		{"not msgpack", rawFrame(typePrediction, []byte{0xc1, 0xc1}), CodeMalformed},
		{"wrong shape of struct", rawFrame(typePrediction, mustMsgpack(t, []int{1, 2})), CodeMalformed},
		{"a string where a number goes", rawFrame(typePrediction, mustMsgpack(t, []any{"x", 1, []int{1}})), CodeMalformed},
		{"trailing bytes", rawFrame(typePrediction, append(pred, 0x01)), CodeMalformed},
		{"binary claims 4 GiB", rawFrame(typeActivation, []byte{0x99, 1, 1, 1, 1, 0x90, 0x93, 1, 0x91, 1, 0xc6, 0xff, 0xff, 0xff, 0xff}), CodeMalformed},
		{"array claims 2^32 items", rawFrame(typePrediction, []byte{0x93, 1, 1, 0xdd, 0xff, 0xff, 0xff, 0xff}), CodeMalformed},
		{"tensor bytes do not match shape", rawFrame(typeActivation, badTensor), CodeBadTensor},
		{"negative layer", rawFrame(typePrediction, mustMsgpack(t, &Prediction{Layer: -1})), CodeMalformed},
		{"placement owners for other shape", rawFrame(typePlacement, mustMsgpack(t, &Placement{Workers: 2, Experts: 2, Layers: []int32{0}, Owners: []int32{0}})), CodeMalformed},
		{"withdraw from a negative pass", rawFrame(typeWithdraw, mustMsgpack(t, &Withdraw{Seq: 1, From: -2})), CodeMalformed},
		{"prediction with workers for some experts", rawFrame(typePrediction, mustMsgpack(t, &Prediction{Seq: 1, Pass: 2, Experts: []int32{1, 2}, Workers: []int32{0}})), CodeMalformed},
		{"withdraw at a negative layer", rawFrame(typeWithdraw, mustMsgpack(t, &Withdraw{Seq: 1, From: 2, Layer: -1, Experts: []int32{3}})), CodeMalformed},
		{"alignment with too many guesses", rawFrame(typeAlignment, mustMsgpack(t, &Alignment{Seq: 1, Pass: 2, Token: 3, Batch: 1, BatchPass: 2, BatchSize: 1, Guesses: make([]int32, MaxGuesses+1)})), CodeMalformed},
		{"alignment with guesses after a chunk", rawFrame(typeAlignment, mustMsgpack(t, &Alignment{Seq: 1, Pass: 2, Token: -1, Batch: 1, BatchPass: 2, BatchSize: 1, Chunk: []int32{5}, Guesses: []int32{4}})), CodeMalformed},
		{"fetch of a negative offset", rawFrame(typeFetchRequest, mustMsgpack(t, &FetchRequest{ID: 1, Offset: -1, Size: 4})), CodeMalformed},
		{"place outside the layout", rawFrame(typePlace, mustMsgpack(t, &Place{Worker: 8, Workers: 8, Group: 2})), CodeMalformed},
		{"place with too few peers", rawFrame(typePlace, mustMsgpack(t, &Place{Worker: 1, Workers: 2, Group: 2, Peers: []string{"a:1"}})), CodeMalformed},
		{"place with a holder's address too long", rawFrame(typePlace, mustMsgpack(t, &Place{Worker: 1, Workers: 2, Group: 2, Holders: []string{strings.Repeat("a", maxFetchName+1)}})), CodeMalformed},
		{"place with too many holders", rawFrame(typePlace, mustMsgpack(t, &Place{Worker: 1, Workers: 2, Group: 2, Holders: make([]string, maxPlaceHolders+1)})), CodeMalformed},
		{"fetch past the bound", rawFrame(typeFetchRequest, mustMsgpack(t, &FetchRequest{ID: 1, Size: MaxFetchBytes + 1})), CodeMalformed},
		{"fetch of a tensor from the store", rawFrame(typeFetchRequest, mustMsgpack(t, &FetchRequest{ID: 1, Tensor: "lm_head.weight", Size: 4})), CodeMalformed},
		{"fetch of a name past the bound", rawFrame(typeFetchRequest, mustMsgpack(t, &FetchRequest{ID: 1, Model: true, File: strings.Repeat("x", maxFetchName+1)})), CodeMalformed},
		{"drafts with a member of no rows", rawFrame(typeDrafts, mustMsgpack(t, &Drafts{Batch: 1, Pass: 2, Seqs: []uint64{1}, Pos: []int{3}, Tokens: [][]int32{{}}})), CodeMalformed},
		{"drafts with rows for fewer members", rawFrame(typeDrafts, mustMsgpack(t, &Drafts{Batch: 1, Pass: 2, Seqs: []uint64{1, 2}, Pos: []int{3, 4}, Tokens: [][]int32{{5}}})), CodeMalformed},
		{"prediction with a negative token", rawFrame(typePrediction, mustMsgpack(t, &Prediction{Seq: 1, Pass: 2, Token: -5})), CodeMalformed},
		{"placement names an unknown worker", rawFrame(typePlacement, mustMsgpack(t, &Placement{Workers: 2, Experts: 1, Layers: []int32{0}, Owners: []int32{2}})), CodeMalformed},
		{"stage run of no layers", rawFrame(typeStageRun, mustMsgpack(t, &StageRun{First: 3, End: 3, Seqs: []uint64{1}, Starts: []int32{0}, Counts: []int32{1}})), CodeMalformed},
		{"stage rows with figures of more decode than prefill layers", rawFrame(typeStageRows, mustMsgpack(t, &StageRows{Figures: &StageFigures{Decode: make([]LayerFigures, 2), Prefill: make([]LayerFigures, 1)}})), CodeMalformed},
		{"stage run with a start a sequence short", rawFrame(typeStageRun, mustMsgpack(t, &StageRun{First: 1, End: 3, Seqs: []uint64{1, 2}, Starts: []int32{0}, Counts: []int32{1, 1}})), CodeMalformed},
		{"stage routes without their weights", rawFrame(typeStageRoutes, mustMsgpack(t, &StageRoutes{Layer: 1, Experts: []int32{1, 2}, Weights: []float32{1}})), CodeMalformed},
	}
}

func TestDecoderRefusesBadInputWithItsCode(t *testing.T) {
	for _, tc := range badFrames(t) {
		t.Run(tc.name, func(t *testing.T) {
			_, err := readAll(tc.input, 1<<20, true)
			var ce *ConnError
			if !errors.As(err, &ce) || ce.Code != tc.code {
				t.Fatalf("got %v, want code %v", err, tc.code)
			}
			if !errors.Is(err, &ConnError{Code: tc.code}) {
				t.Fatalf("errors.Is does not match %v", tc.code)
			}
		})
	}
}

func TestEncoderRefusesFramesOverTheLimit(t *testing.T) {
	_, err := newFrameEncoder(keepFrameBuf).encode(bulk(0, make([]byte, 5000)), 4096)
	if !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("got %v, want ErrFrameTooLarge", err)
	}
}

func TestCheckMsgpackAcceptsWhatTheEncoderWrites(t *testing.T) {
	values := []any{nil, true, 1, -1, -33, 1 << 40, -(1 << 40), 1.5, float32(2.5), "", "short", string(make([]byte, 300)),
		make([]byte, 70000), []int{}, make([]int, 20), map[string]int{"a": 1}, map[string]any{"x": []any{1, "y", nil}},
		msgpack.RawMessage{0xd4, 1, 2}}
	values = append(values, func() (v []any) {
		for _, m := range sampleMessages(16) {
			v = append(v, m)
		}
		return
	}()...)
	for _, v := range values {
		b := mustMsgpack(t, v)
		if err := checkMsgpack(b); err != nil {
			t.Errorf("%T %x: %v", v, b[:min(len(b), 16)], err)
		}
	}
}

func TestTensorValidate(t *testing.T) {
	cases := []struct {
		name string
		t    Tensor
		ok   bool
	}{
		{"absent", Tensor{}, true},
		{"f32 vector", Tensor{DType: F32, Shape: []int{3}, Data: make([]byte, 12)}, true},
		{"bf16 matrix", Tensor{DType: BF16, Shape: []int{2, 3}, Data: make([]byte, 12)}, true},
		{"zero rows", Tensor{DType: F32, Shape: []int{0, 4096}, Data: nil}, true},
		{"short", Tensor{DType: F32, Shape: []int{3}, Data: make([]byte, 11)}, false},
		{"long", Tensor{DType: I8, Shape: []int{3}, Data: make([]byte, 4)}, false},
		{"unknown dtype", Tensor{DType: 77, Shape: []int{1}, Data: make([]byte, 1)}, false},
		{"no shape", Tensor{DType: F32, Data: make([]byte, 4)}, false},
		{"negative dim", Tensor{DType: F32, Shape: []int{-1, -4}, Data: make([]byte, 16)}, false},
		{"overflowing shape", Tensor{DType: F32, Shape: []int{1 << 40, 1 << 40}, Data: nil}, false},
		{"too many dims", Tensor{DType: U8, Shape: make([]int, 9)}, false},
	}
	for _, tc := range cases {
		err := tc.t.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrBadTensor) {
			t.Errorf("%s: %v is not ErrBadTensor", tc.name, err)
		}
	}
}

func TestSendClassOfMessages(t *testing.T) {
	big := Float32Tensor(make([]float32, 128*1024), 128, 1024)
	cases := []struct {
		m    Message
		want byte
	}{
		{&Prediction{}, classControl},
		{&Activation{Hidden: Float32Tensor(make([]float32, 4096))}, classControl},
		{&Activation{Tokens: 128, Hidden: big}, classBulk},
		{&ExpertResult{Output: big}, classBulk},
		{&SequenceEnd{}, classControl},
		{&StatsRequest{}, classControl},
		{&WorkerStats{}, classControl},
		{&ShadowDone{}, classControl},
		{&Withdraw{}, classControl},
		{&Drafts{}, classControl},
		{&FetchRequest{}, classControl},
		{&FetchData{}, classBulk},
		{&StageRun{Hidden: big}, classControl}, // ordered with a sequence's KV rows and end, whatever its size
		{&StageRows{Hidden: big}, classControl},
		{&Alignment{}, classBulk},
		{&Placement{}, classBulk},
		{&Heartbeat{}, classControl},
		{&Error{}, classControl},
	}
	for _, tc := range cases {
		if got := classOf(tc.m); got != tc.want {
			t.Errorf("%v: class %q, want %q", tc.m.Type(), got, tc.want)
		}
	}
}

func f32bits(f float32) uint32 { return math.Float32bits(f) }

// TestOlderPeerIsRefusedNamingBothVersions: a peer of the previous protocol
// (no sequence ids) is refused with an error that names its version and
// ours, so an operator knows which side to upgrade.
func TestOlderPeerIsRefusedNamingBothVersions(t *testing.T) {
	pred := mustMsgpack(t, &Prediction{Pass: 1, Layer: 2, Experts: []int32{3}})
	_, err := readAll(frame(uint32(len(pred)+2), ProtocolVersion-1, typePrediction, pred), 1<<20, true)
	if !errors.Is(err, ErrBadVersion) {
		t.Fatalf("got %v, want ErrBadVersion", err)
	}
	for _, want := range []string{fmt.Sprintf("version %d", ProtocolVersion-1), fmt.Sprintf("speaks %d", ProtocolVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestHelloWithImpossibleCapacitiesIsMalformed: a worker's Hello feeds the
// main node's placement, so a negative, NaN or infinite load bandwidth,
// or a negative budget, is refused rather than believed.
func TestHelloWithImpossibleCapacitiesIsMalformed(t *testing.T) {
	for _, h := range []Hello{
		{Name: "w1", Role: RoleWorker, LoadBytesSec: -1},
		{Name: "w1", Role: RoleWorker, LoadBytesSec: math.NaN()},
		{Name: "w1", Role: RoleWorker, LoadBytesSec: math.Inf(1)},
		{Name: "w1", Role: RoleWorker, DeviceMemBytes: -1},
	} {
		_, err := readAll(rawFrame(typeHello, mustMsgpack(t, &h)), defaultMaxFrameBytes, false)
		var ce *ConnError
		if !errors.As(err, &ce) || ce.Code != CodeMalformed {
			t.Errorf("hello %+v: %v, want a malformed message", h, err)
		}
	}
	if err := (&Hello{Name: "w1", Role: RoleWorker, LoadBytesSec: 4e9, DeviceMemBytes: 1 << 30}).validate(); err != nil {
		t.Errorf("a sound hello: %v", err)
	}
}
