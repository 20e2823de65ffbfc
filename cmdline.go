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
