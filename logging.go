package main

import (
	"flag"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// logFlags are the logging flags every subcommand takes.
type logFlags struct {
	json  bool
	level string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&l.json, "log-json", false, "log JSON lines instead of the human console format")
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
}

// logger builds the one logger a command passes down.
func (l *logFlags) logger(w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(l.level)
	if err != nil {
		return zerolog.Nop(), usagef("-log-level %q: %v", l.level, err)
	}
	if !l.json {
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
