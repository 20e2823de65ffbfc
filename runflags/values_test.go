package runflags

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/kernels"
)

func TestParseBytesReadsBothKindsOfUnit(t *testing.T) {
	for s, want := range map[string]int64{"0": 0, "4096": 4096, "1KiB": 1024, "1.5 MiB": 3 << 19, "2GiB": 2 << 30, "4GB": 4e9, "250MB": 250e6, "7B": 7, "1TiB": 1 << 40} {
		if got, err := ParseBytes(s); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "one", "1XB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) succeeded", bad)
		}
	}
}

func TestParseIntsItersAndQuantRefuseWhatTheyCannotRead(t *testing.T) {
	if got, err := ParseInts("1, 2,16"); err != nil || len(got) != 3 || got[2] != 16 {
		t.Errorf("ParseInts: %v, %v", got, err)
	}
	for _, bad := range []string{"0", "1,,2", "-3", "x"} {
		if _, err := ParseInts(bad); err == nil {
			t.Errorf("ParseInts(%q) succeeded", bad)
		}
	}
	if from, to, err := ParseIters("2:4"); err != nil || from != 2 || to != 4 {
		t.Errorf("ParseIters(2:4) = %d, %d, %v", from, to, err)
	}
	for _, bad := range []string{"0:3", "4:2", "2", "a:b"} {
		if _, _, err := ParseIters(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseIters(%q): %v, want an error naming it", bad, err)
		}
	}
	for s, want := range map[string]kernels.DType{"fp16": kernels.F16, "int8": kernels.Q8, "nf4": kernels.NF4} {
		if got, err := ParseQuant(s); err != nil || got != want {
			t.Errorf("ParseQuant(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseQuant("int4"); err == nil {
		t.Error("ParseQuant(int4) succeeded")
	}
}

func TestLoggerWritesJSONOrConsoleAndRefusesAnUnknownLevel(t *testing.T) {
	var b bytes.Buffer
	log, err := Log{JSON: true, Level: "info"}.Logger(&b)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug().Msg("hidden")
	log.Info().Str("k", "v").Dur("took", 1500*time.Microsecond).Msg("shown")
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"k":"v"`) || !strings.HasPrefix(out, "{") || !strings.Contains(out, `"took":"1.5ms"`) {
		t.Errorf("JSON logger wrote %q (a duration wants its unit)", out)
	}
	b.Reset()
	log, _ = Log{Level: "debug"}.Logger(&b)
	log.Debug().Str("k", "v").Msg("shown")
	if out := b.String(); !strings.Contains(out, "k=v") || strings.HasPrefix(out, "{") {
		t.Errorf("console logger wrote %q", out)
	}
	if _, err := (Log{Level: "loud"}).Logger(&b); err == nil || !strings.Contains(err.Error(), "loud") {
		t.Errorf("level loud: %v", err)
	}
}

func TestStartCPUProfileWritesAProfile(t *testing.T) {
	f := For(RoleWorker)
	f.CPUProfile = t.TempDir() + "/cpu.pprof"
	stop, err := f.StartCPUProfile()
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if st, err := os.Stat(f.CPUProfile); err != nil || st.Size() == 0 {
		t.Fatalf("profile: %v, %v", st, err)
	}
	f.CPUProfile = t.TempDir() + "/no/such/dir/cpu.pprof"
	if _, err := f.StartCPUProfile(); err == nil || !strings.Contains(err.Error(), "-cpuprofile") {
		t.Fatalf("an unwritable -cpuprofile: %v", err)
	}
}

func TestWorkerListRefusesAWorkerListedTwice(t *testing.T) {
	f := For(RoleMain)
	f.Workers = "10.0.0.1:7400, 10.0.0.2:7400,host-a:7400"
	if got, err := f.WorkerList(); err != nil || len(got) != 3 || got[1] != "10.0.0.2:7400" {
		t.Fatalf("WorkerList() = %q, %v", got, err)
	}
	for list, want := range map[string]string{
		"10.0.0.1:7400,10.0.0.1:7400":  "10.0.0.1:7400 is listed twice (addresses 1 and 2)",
		"a:1,b:2,A:1":                  "A:1 is listed twice (addresses 1 and 3)",
		"[::1]:7400,[0:0::1]:7400":     "listed twice",
		"10.0.0.1:7400,,10.0.0.2:7400": "address 2 is empty",
	} {
		f.Workers = list
		if _, err := f.WorkerList(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("-workers %s: %v, want an error saying %q", list, err, want)
		}
	}
	for s, want := range map[string]bool{"on": true, "off": false} {
		if got, err := ParseResidency(s); err != nil || got != want {
			t.Errorf("ParseResidency(%s) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseResidency("yes"); err == nil {
		t.Error("ParseResidency(yes) succeeded")
	}
}

func TestKeyFallsBackToTheEnvironment(t *testing.T) {
	t.Setenv("ODMOE_API_KEY", "from-env")
	f := For(RoleMain)
	if f.Key() != "from-env" {
		t.Errorf("Key() = %q without -api-key, want the environment's", f.Key())
	}
	f.APIKey = "from-flag"
	if f.Key() != "from-flag" {
		t.Errorf("Key() = %q with -api-key, want the flag's", f.Key())
	}
}
