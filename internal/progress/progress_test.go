package progress

import (
	"strings"
	"testing"
	"time"
)

func TestPlainOutputPrintsEveryTenthOnce(t *testing.T) {
	var sb strings.Builder
	b := NewWriter(&sb, false, "gen", 1000)
	clock := b.start
	b.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	for range 100 {
		b.Add(10)
	}
	b.Finish()
	lines := strings.Split(strings.TrimSpace(sb.String()), "\n")
	// 10 steps (10%..100%); Finish adds nothing when 100% is shown
	if len(lines) != 10 {
		t.Fatalf("%d lines:\n%s", len(lines), sb.String())
	}
	if !strings.Contains(lines[len(lines)-1], "100.0%") || !strings.Contains(lines[0], "10.0%") {
		t.Fatalf("unexpected lines:\n%s", sb.String())
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
