package worker

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestFillProgressSaysHowFarAndHowLong: a fill's progress lines say the
// bytes done of the share, the rate and the time left, at most once a
// period, and none at the end (which has its own).
func TestFillProgressSaysHowFarAndHowLong(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	start := time.Now().Add(-10 * time.Second)
	p := fillProgress(start, time.Hour, log)
	p(100<<20, 400<<20) // 10 s into a period of an hour
	if buf.Len() != 0 {
		t.Fatalf("a line within the period: %s", buf.String())
	}
	p = fillProgress(start, time.Second, log)
	p(100<<20, 400<<20) // 10 MiB/s: 30 s left
	line := buf.String()
	for _, want := range []string{`"done":"100.0 MiB"`, `"share":"400.0 MiB"`, `"rate":"10.0 MiB/s"`, `"left":30000`, "filling its share"} {
		if !strings.Contains(line, want) {
			t.Errorf("the progress line lacks %s: %s", want, line)
		}
	}
	buf.Reset()
	p(200<<20, 400<<20) // within a second of the last line
	p(400<<20, 400<<20) // the end
	if buf.Len() != 0 {
		t.Fatalf("lines within the period or at the end: %s", buf.String())
	}
}
