package runflags

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// The readers of the values flags carry as text: sizes, lists, ranges,
// weight formats, and the logger the -log-* flags describe.

// ParseQuant maps -quant onto a weight format.
func ParseQuant(s string) (kernels.DType, error) {
	switch s {
	case "fp16":
		return kernels.F16, nil
	case "int8":
		return kernels.Q8, nil
	case "nf4":
		return kernels.NF4, nil
	}
	return 0, fmt.Errorf("%q unknown: fp16, int8 or nf4", s)
}

// ParseIters reads "FROM:TO" (inclusive, FROM >= 1).
func ParseIters(s string) (from, to int64, err error) {
	if _, err := fmt.Sscanf(s, "%d:%d", &from, &to); err != nil || from < 1 || to < from {
		return 0, 0, fmt.Errorf("%q: want FROM:TO with 1 <= FROM <= TO, e.g. 2:4", s)
	}
	return from, to, nil
}

// ParseBytes reads a size: a number with an optional unit (B, KB, MB, GB,
// TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
	}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	return int64(v * mult), nil
}

// ParseInts reads comma-separated positive integers.
func ParseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// ParseFloats reads comma-separated numbers, each in [lo, hi].
func ParseFloats(s string, lo, hi float64) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < lo || v > hi {
			return nil, fmt.Errorf("%q is not a number in %v..%v", f, lo, hi)
		}
		out = append(out, v)
	}
	return out, nil
}

// StartCPUProfile profiles the process's CPU into -cpuprofile's file
// until stop.
func (f *Flags) StartCPUProfile() (stop func(), err error) {
	out, err := os.Create(f.CPUProfile)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

// ParseResidency reads -residency: off or on.
func ParseResidency(s string) (bool, error) {
	switch s {
	case "off":
		return false, nil
	case "on":
		return true, nil
	}
	return false, fmt.Errorf("-residency %q: off or on", s)
}

// WorkerList is -workers as a list, each address once: a worker listed
// twice (the same host and port, however spelled) would be planned as two
// and is refused, as is an empty entry.
func (f *Flags) WorkerList() ([]string, error) {
	list := strings.Split(f.Workers, ",")
	seen := map[string]int{}
	for i, a := range list {
		a = strings.TrimSpace(a)
		key := strings.ToLower(a)
		if host, port, err := net.SplitHostPort(key); err == nil {
			if ip := net.ParseIP(host); ip != nil {
				host = ip.String()
			}
			key = net.JoinHostPort(host, port)
		}
		switch j, dup := seen[key]; {
		case a == "":
			return nil, fmt.Errorf("-workers %q: address %d is empty", f.Workers, i+1)
		case dup:
			return nil, fmt.Errorf("-workers: %s is listed twice (addresses %d and %d): each worker once", a, j+1, i+1)
		}
		seen[key], list[i] = i, a
	}
	return list, nil
}

// Key is the API key: -api-key, else $ODMOE_API_KEY (which, unlike a
// flag, does not show in the process list).
func (f *Flags) Key() string { return cmp.Or(f.APIKey, os.Getenv("ODMOE_API_KEY")) }

// Logger builds the one logger a command passes down, writing to w as
// l says: zerolog's console format (colours on a terminal) or JSON lines,
// at l.Level.
func (l Log) Logger(w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(l.Level)
	if err != nil || l.Level == "" {
		return zerolog.Nop(), fmt.Errorf("-log-level %q unknown: want debug, info, warn or error", l.Level)
	}
	if !l.JSON {
		noColor := true
		if f, ok := w.(*os.File); ok {
			noColor = !term.IsTerminal(int(f.Fd()))
		}
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: noColor}
	}
	// durations with their unit, for people and for JSON lines alike
	// ("load=123.4ms", "load":"123.4ms"): a bare number leaves the reader
	// to guess milliseconds
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
