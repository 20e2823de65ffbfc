package main

// The command line's shared pieces: usage errors, flag sets and the
// logger (the readers of sizes, lists and formats are runflags').

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/odmoe/odmoe/runflags"
	"github.com/rs/zerolog"
)

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// newFlagSet returns a flag set that reports errors instead of exiting
// and prints nothing itself: parseFlags turns -h into a helpRequest, whose
// flags dispatch prints on stdout, and a bad flag into one line.
func newFlagSet(name string, _ io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("odmoe "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// helpRequest is -h (or -help) on a command: its flags go to stdout and
// the command exits 0. It is flag.ErrHelp to errors.Is.
type helpRequest struct{ fs *flag.FlagSet }

func (h helpRequest) Error() string        { return flag.ErrHelp.Error() }
func (h helpRequest) Is(target error) bool { return target == flag.ErrHelp }

// print writes the command's flags to w.
func (h helpRequest) print(w io.Writer) {
	fmt.Fprintf(w, "Usage of %s:\n", h.fs.Name())
	h.fs.SetOutput(w)
	h.fs.PrintDefaults()
	h.fs.SetOutput(io.Discard)
}

// parseFlags parses args and refuses stray positional arguments; a bad
// flag is one line saying how to list the flags.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return helpRequest{fs}
		}
		return usagef("%v (%s -h lists its flags)", err, fs.Name())
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return nil
}

// flagGiven reports whether the command line set flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// newLogger builds the one logger a command passes down, as its
// logging flags l say (a bad level is a usage error).
func newLogger(l runflags.Log, w io.Writer) (zerolog.Logger, error) {
	log, err := l.Logger(w)
	if err != nil {
		return log, usagef("%v", err)
	}
	return log, nil
}
