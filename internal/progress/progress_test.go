package progress

import (
	"strings"
	"testing"
	"time"
)

// TestOffATerminalThereIsNoBar: off a terminal, work of under 30 s is
// one plain line when done; longer work says how far it is every 30 s.
func TestOffATerminalThereIsNoBar(t *testing.T) {
	for _, tc := range []struct {
		step  time.Duration
		lines int
	}{{100 * time.Millisecond, 1}, {time.Second, 4}} { // 10 s, 100 s of work
		var sb strings.Builder
		b := NewWriter(&sb, false, "gen", 1000)
		clock := b.start
		b.now = func() time.Time { clock = clock.Add(tc.step); return clock }
		for range 100 {
			b.Add(10)
		}
		b.Finish()
		lines := strings.Split(strings.TrimSpace(sb.String()), "\n")
		if len(lines) != tc.lines || strings.Contains(sb.String(), "[") || !strings.HasPrefix(lines[len(lines)-1], "gen: 1000 B in ") {
			t.Fatalf("steps of %v: %d lines, want %d and no bar:\n%s", tc.step, len(lines), tc.lines, sb.String())
		}
	}
}

func TestBytesUnits(t *testing.T) {
	cases := map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 30: "5.0 GiB"}
	for n, want := range cases {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
