package wire

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

func TestSmallUDPBuffersAreReportedOnceWithTheFix(t *testing.T) {
	defer os.Unsetenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING")
	udpBufferWarning = sync.Once{} // a listener of an earlier test may have warned already
	var out bytes.Buffer
	log := zerolog.New(&out)
	warnSmallUDPBuffers(wantUDPBuffer, -1, log) // big enough, or unknown: silent
	if out.Len() != 0 {
		t.Fatalf("warned about adequate buffers: %s", out.String())
	}
	warnSmallUDPBuffers(416<<10, 416<<10, log)
	warnSmallUDPBuffers(416<<10, 416<<10, log)
	if got := strings.Count(out.String(), "net.core.rmem_max"); got != 1 {
		t.Fatalf("%d warnings naming net.core.rmem_max, want 1:\n%s", got, out.String())
	}
	if os.Getenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING") == "" {
		t.Error("quic-go's own copy of the warning is not silenced")
	}
}
