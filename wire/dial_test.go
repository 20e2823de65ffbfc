package wire

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// syncBuffer is a log sink safe for the dialing goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDialToNobodyLogsProgressAndGivesUpInTime: dialing an address nobody
// answers logs its progress at info level (address and attempt, not every
// attempt) and ends at DialTimeout with an error naming the address, the
// time and the attempts.
func TestDialToNobodyLogsProgressAndGivesUpInTime(t *testing.T) {
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := c.LocalAddr().String()
	c.Close()
	var logs syncBuffer
	cfg := testConfig(t, "dial", "main")
	cfg.Log = zerolog.New(&logs).Level(zerolog.InfoLevel)
	cfg.HandshakeTimeout, cfg.DialAttempts, cfg.DialBackoff, cfg.MaxDialBackoff = 100*time.Millisecond, 1000, 10*time.Millisecond, 50*time.Millisecond
	cfg.DialTimeout = 1500 * time.Millisecond
	start := time.Now()
	_, err = Dial(context.Background(), addr, cfg)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "no answer within 1.5s") || !strings.Contains(err.Error(), "attempts") {
		t.Fatalf("err = %v", err)
	}
	if took > 3*time.Second {
		t.Fatalf("Dial took %v with a 1.5 s DialTimeout", took)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], `"attempt":1`) || !strings.Contains(lines[0], addr) || !strings.Contains(lines[0], "no answer yet") {
		t.Fatalf("progress log: %q", logs.String())
	}
	if len(lines) > 8 { // ~10 attempts: 1, 2, 4, 8 logged
		t.Fatalf("%d progress lines for one dial: %q", len(lines), logs.String())
	}
}
