package main

import (
	"io"
	"os"
	"time"

	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"
	"golang.org/x/term"
)

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
