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
// the command exits 0. It is flag.ErrHelp to errors.Is. A command may
// write its own (write set).
type helpRequest struct {
	fs    *flag.FlagSet
	write func(w io.Writer)
}

func (h helpRequest) Error() string        { return flag.ErrHelp.Error() }
func (h helpRequest) Is(target error) bool { return target == flag.ErrHelp }

// print writes the command's flags to w.
func (h helpRequest) print(w io.Writer) {
	if h.write != nil {
		h.write(w)
		return
	}
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
			return helpRequest{fs: fs}
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

// helpWidth is where help text wraps.
const helpWidth = 99

// writeFlag writes one flag's help: its name and value, then its usage
// wrapped under it at helpWidth.
func writeFlag(w io.Writer, f *flag.Flag, text string) {
	name, usage := flag.UnquoteUsage(f)
	text = strings.ReplaceAll(text, "`", "") // the value's name, shown beside the flag
	line := "  -" + f.Name
	if name != "" {
		line += " " + name
	}
	fmt.Fprintln(w, line)
	if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && !strings.Contains(usage, "(default") {
		text += " (default " + f.DefValue + ")"
	}
	for _, l := range wrap(text, helpWidth-6) {
		fmt.Fprintln(w, "      "+l)
	}
}

// wrap breaks text into lines of at most width bytes at spaces (a word
// longer than width has a line of its own).
func wrap(text string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) > width:
			lines, line = append(lines, line), word
		default:
			line += " " + word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
