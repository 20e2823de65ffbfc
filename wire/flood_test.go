package wire

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vmRSS is this process's resident memory (VmRSS), 0 where unknown.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// claimHeader is a bulk stream's class byte and a frame header claiming
// size bytes of an Alignment.
func claimHeader(size uint32) []byte {
	h := []byte{classBulk, 0, 0, 0, 0, ProtocolVersion, byte(TypeAlignment)}
	binary.BigEndian.PutUint32(h[1:], size+2)
	return h
}

// TestFrameBodyGrowsOnlyAsItsBytesArrive: a header claiming 64 MiB
// followed by a few bytes and the end of the stream costs about the bytes
// that came, not what the header claimed, and is reported as malformed.
func TestFrameBodyGrowsOnlyAsItsBytesArrive(t *testing.T) {
	in := append(claimHeader(64<<20 - 2)[1:], bytes.Repeat([]byte{7}, 100)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fr := &frameReader{r: bytes.NewReader(in), maxBytes: DefaultMaxFrameBytes}
	_, _, _, err := fr.next()
	runtime.ReadMemStats(&after)
	if !errorsIsMalformed(err) {
		t.Fatalf("err = %v, want a malformed frame", err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 2<<20 {
		t.Fatalf("reading a 64 MiB claim backed by 100 bytes allocated %d bytes", got)
	}
	// and a real frame still reads whole, across many pieces
	body := bytes.Repeat([]byte{1, 2, 3}, 1<<20)
	fr = &frameReader{r: io.MultiReader(bytes.NewReader(claimHeader(uint32(len(body)))[1:]), bytes.NewReader(body)), maxBytes: DefaultMaxFrameBytes}
	_, got, owned, err := fr.next()
	if err != nil || !owned || !bytes.Equal(got, body) {
		t.Fatalf("a 3 MiB frame: err %v, owned %v, %d bytes, equal %v", err, owned, len(got), bytes.Equal(got, body))
	}
}

func errorsIsMalformed(err error) bool {
	ce, ok := err.(*ConnError)
	return ok && ce.Code == CodeMalformed
}

// TestConnectionBufferCapHoldsFramesBackUntilReceived: with room for one
// frame per connection, a second waits (counted) until the application
// receives the first, then every message arrives intact.
func TestConnectionBufferCapHoldsFramesBackUntilReceived(t *testing.T) {
	scfg := testConfig(t, "buf", "w1")
	scfg.MaxFrameBytes, scfg.MaxConnBufferedBytes = 1<<20, 1<<20
	l := listen(t, scfg)
	client, server := connect(t, l, testConfig(t, "buf", "main"))
	for i := range 3 {
		send(t, client, bulk(uint64(i), bytes.Repeat([]byte{byte(i)}, 600<<10)))
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().BufferWaits.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no frame waited for buffer room")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(server.bulkIn); n > 1 {
		t.Fatalf("%d frames of 600 KiB queued with room for 1 MiB", n)
	}
	seen := map[uint64]bool{}
	for range 3 {
		a := recv(t, server).(*Alignment)
		if d := bulkData(a); len(d) != 600<<10 || d[0] != byte(a.Seq) {
			t.Fatalf("alignment %d: %d bytes", a.Seq, len(d))
		}
		seen[a.Seq] = true
	}
	if len(seen) != 3 {
		t.Fatalf("received %v", seen)
	}
}
