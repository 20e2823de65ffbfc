package main

// The command line's shared pieces: usage errors, flag sets, the logger,
// and the readers of sizes, lists and formats the commands share.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// newFlagSet returns a flag set that reports errors instead of exiting.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("odmoe "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args and refuses stray positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return nil
}

// parseQuant maps -quant onto a weight format.
func parseQuant(s string) (kernels.DType, error) {
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

// parseIters reads "FROM:TO" (inclusive, FROM >= 1).
func parseIters(s string) (from, to int64, err error) {
	if _, err := fmt.Sscanf(s, "%d:%d", &from, &to); err != nil || from < 1 || to < from {
		return 0, 0, fmt.Errorf("%q: want FROM:TO with 1 <= FROM <= TO, e.g. 2:4", s)
	}
	return from, to, nil
}

// parseBytes reads a size: a number with an optional unit (B, KB, MB, GB,
// TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
func parseBytes(s string) (int64, error) {
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

// parseInts reads comma-separated positive integers.
func parseInts(s string) ([]int, error) {
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

// flagGiven reports whether the command line set flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// newLogger builds the one logger a command passes down, as its
// logging flags l say.
func newLogger(l runflags.Log, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(l.Level)
	if err != nil {
		return zerolog.Nop(), usagef("-log-level %q: %v", l.Level, err)
	}
	if !l.JSON {
		noColor := true
		if f, ok := w.(*os.File); ok {
			noColor = !term.IsTerminal(int(f.Fd()))
		}
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: noColor}
		// durations with their unit for people ("load=123.4ms"); JSON
		// lines keep zerolog's milliseconds as numbers
		zerolog.DurationFieldFormat = zerolog.DurationFormatString
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
