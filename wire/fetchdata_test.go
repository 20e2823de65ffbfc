package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// TestAFetchDataArrivesWhereItIsKept: FetchData sent over a stream, its
// data written without a frame buffer of its own where it is big, comes
// out of RecvInto with its data in the buffer into gave for its ID and
// length (none given, or of another length: a buffer of its own), and out
// of Recv alike, whatever the ID's size, the data's (none, small: the
// generic frame) and the error text's.
func TestAFetchDataArrivesWhereItIsKept(t *testing.T) {
	l := listenStream(t, testConfig(t, "streams", "w1", RoleWorker))
	ctx := context.Background()
	c, s := pair(t, l, "w2", "w2's stream")
	for _, id := range []uint64{0, 127, 128, 255, 256, 65535, 65536, 1 << 40} {
		for _, n := range []int{0, 1, directDataMin - 1, directDataMin, 300 << 10} {
			for _, e := range []string{"", "short", strings.Repeat("x", 40), strings.Repeat("y", 300)} {
				data := bytes.Repeat([]byte{byte(id), byte(n), 7}, n/3+1)[:n]
				if n == 0 {
					data = nil
				}
				for _, mode := range []string{"into", "wrong length", "none", "Recv"} {
					if err := s.Send(ctx, &FetchData{ID: id, Data: data, Err: e}); err != nil {
						t.Fatal(err)
					}
					dst := make([]byte, n)
					asked := false
					var m Message
					var err error
					switch mode {
					case "Recv":
						m, err = c.Recv(ctx)
					default:
						m, err = c.RecvInto(ctx, func(gotID uint64, gotN int) []byte {
							asked = true
							if gotID != id || gotN != n {
								t.Errorf("into asked for %d bytes of %d, want %d of %d", gotN, gotID, n, id)
							}
							switch mode {
							case "wrong length":
								return make([]byte, n+1)
							case "none":
								return nil
							}
							return dst
						})
					}
					d, ok := m.(*FetchData)
					if err != nil || !ok || d.ID != id || !bytes.Equal(d.Data, data) || d.Err != e {
						t.Fatalf("%s: id %d, %d bytes, error %q: got %+v, %v", mode, id, n, e, m, err)
					}
					direct := n >= directDataMin
					if mode == "into" && direct && (!asked || &d.Data[0] != &dst[0]) {
						t.Fatalf("id %d, %d bytes: the data did not land in into's buffer", id, n)
					}
					if mode == "wrong length" && direct && &d.Data[0] == &dst[0] {
						t.Fatalf("a buffer of another length was used")
					}
				}
			}
		}
	}
}

// TestAMalformedFetchDataClosesItsStream: a FetchData frame whose data
// runs past its end, whose error is not a string, or which ends inside
// its prefix is refused as malformed, naming what was wrong; one whose
// prefix is not the one a FetchData is written with (a map, its data
// nil) is read by the generic decoder.
func TestAMalformedFetchDataClosesItsStream(t *testing.T) {
	l := listenStream(t, testConfig(t, "streams", "w1", RoleWorker))
	ctx := context.Background()
	into := func(uint64, int) []byte { return nil }
	generic, err := msgpack.Marshal(&FetchData{ID: 9, Err: "no chunk"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		body       []byte
	}{
		{"data past the end", "bytes of data", []byte{0x93, 0x01, 0xc6, 0, 0, 1, 0, 1, 2, 3, 0xa0}},
		{"an error that is not a string", "not a msgpack string", append([]byte{0x93, 0x01, 0xc4, 3, 1, 2, 3}, 0x01)},
		{"an error longer than its bytes", "not a msgpack string", append([]byte{0x93, 0x01, 0xc4, 3, 1, 2, 3}, 0xa5, 'x')},
		{"nothing after the data", "after its data", []byte{0x93, 0x01, 0xc4, 3, 1, 2, 3}},
		{"ends inside its prefix", "inside its prefix", []byte{0x93, 0xcf, 0, 0}},
		{"generic", "", generic},
	} {
		c, s := pair(t, l, "w2", tc.name)
		s.wmu.Lock()
		_, err := s.conn.Write(rawFrame(typeFetchData, tc.body))
		s.wmu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		m, err := c.RecvInto(ctx, into)
		c.Close()
		s.Close() // (four streams an identity)
		if tc.want == "" {
			if d, ok := m.(*FetchData); err != nil || !ok || d.ID != 9 || d.Err != "no chunk" || d.Data != nil {
				t.Fatalf("%s: %+v, %v", tc.name, m, err)
			}
			continue
		}
		var ce *ConnError
		if !errors.As(err, &ce) || ce.Code != CodeMalformed || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want it malformed: %s", tc.name, err, tc.want)
		}
	}
}

// TestAFetchDataHeaderAloneAllocatesNothingBig: a peer that sends a
// FetchData frame's header claiming 48 MiB and a few bytes of it, then
// stalls, costs the fetcher no more than readBody's first piece, for an
// ID nobody waits for (no buffer of into's) and for a prefix the generic
// decoder reads (an int64 ID): a body is allocated whole only once its
// first piece has come. (Found by a review: both allocated the claim.)
func TestAFetchDataHeaderAloneAllocatesNothingBig(t *testing.T) {
	l := listenStream(t, testConfig(t, "streams", "w1", RoleWorker))
	for _, tc := range []struct {
		name   string
		prefix []byte
	}{
		{"an ID nobody waits for", []byte{0x93, 0x01, 0xc6, 0, 0, 0, 0}},
		{"a prefix for the generic decoder (an int64 ID)", []byte{0x93, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1}},
	} {
		c, s := pair(t, l, "w2", tc.name)
		const claim = 48 << 20
		p := tc.prefix
		if p[2] == 0xc6 {
			binary.BigEndian.PutUint32(p[3:], uint32(claim-len(p)-1))
		}
		hdr := make([]byte, 6)
		binary.BigEndian.PutUint32(hdr, uint32(claim+2))
		hdr[4], hdr[5] = ProtocolVersion, byte(typeFetchData)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.RecvInto(context.Background(), func(uint64, int) []byte { return nil })
		}()
		s.wmu.Lock()
		s.conn.Write(append(hdr, p...))
		s.wmu.Unlock()
		time.Sleep(300 * time.Millisecond) // the peer stalls
		runtime.ReadMemStats(&after)
		c.Close()
		<-done
		if got := after.TotalAlloc - before.TotalAlloc; got > 8<<20 {
			t.Errorf("%s: %d MiB allocated for a frame whose first %d bytes came", tc.name, got>>20, len(p))
		}
	}
}
