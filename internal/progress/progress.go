// Package progress draws a one-line progress bar for long work (model
// generation, conversion, loading): bytes done, rate and ETA. On a terminal
// it redraws in place at most every 100 ms; otherwise (logs, CI) there is
// no bar: a plain line every 30 s of long work, and one when it is done.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Bar tracks one piece of work measured in bytes. Safe for concurrent use.
type Bar struct {
	mu       sync.Mutex
	w        io.Writer
	tty      bool
	label    string
	total    int64
	done     int64
	start    time.Time
	lastDraw time.Time
	drawnAt  int64 // done when last drawn
	now      func() time.Time
}

// New starts a bar on stderr.
func New(label string, total int64) *Bar {
	return NewWriter(os.Stderr, term.IsTerminal(int(os.Stderr.Fd())), label, total)
}

// NewWriter starts a bar on w; tty selects in-place redrawing.
func NewWriter(w io.Writer, tty bool, label string, total int64) *Bar {
	return &Bar{w: w, tty: tty, label: label, total: total, start: time.Now(), now: time.Now}
}

// Set records absolute progress.
func (b *Bar) Set(done int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = done
	b.draw(false)
}

// Add records n more bytes done.
func (b *Bar) Add(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done += n
	b.draw(false)
}

// Finish draws the final state (unless it is already shown) and ends the
// line.
func (b *Bar) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tty || b.drawnAt != b.done || b.lastDraw.IsZero() {
		b.draw(true)
	}
	if b.tty {
		fmt.Fprintln(b.w)
	}
}

func (b *Bar) draw(final bool) {
	now := b.now()
	if b.tty {
		if !final && now.Sub(b.lastDraw) < 100*time.Millisecond {
			return
		}
	} else if !final && now.Sub(b.lastPlain()) < plainEvery {
		return
	}
	b.lastDraw = now
	b.drawnAt = b.done
	if b.tty {
		fmt.Fprintf(b.w, "\r%s\x1b[K", b.line(now))
	} else {
		fmt.Fprintln(b.w, b.plain(now, final))
	}
}

// plainEvery is how often a bar off a terminal says how far it is.
const plainEvery = 30 * time.Second

// lastPlain is when the last plain line went out (the start before any).
func (b *Bar) lastPlain() time.Time {
	if b.lastDraw.IsZero() {
		return b.start
	}
	return b.lastDraw
}

// plain is the line off a terminal: how far, or, final, what it did.
func (b *Bar) plain(now time.Time, final bool) string {
	el := now.Sub(b.start)
	rate := int64(0)
	if el > 0 {
		rate = int64(float64(b.done) / el.Seconds())
	}
	if final {
		return fmt.Sprintf("%s: %s in %s (%s/s)", b.label, Bytes(b.done), el.Round(time.Millisecond), Bytes(rate))
	}
	pct := 100.0
	if b.total > 0 {
		pct = 100 * float64(b.done) / float64(b.total)
	}
	return fmt.Sprintf("%s: %s of %s (%.0f%%), %s/s", b.label, Bytes(b.done), Bytes(b.total), pct, Bytes(rate))
}

func (b *Bar) line(now time.Time) string {
	el := now.Sub(b.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(b.done) / el
	}
	frac := 1.0
	if b.total > 0 {
		frac = min(float64(b.done)/float64(b.total), 1)
	}
	const width = 30
	fillN := int(frac * width)
	eta := "--"
	if rate > 0 && b.total > b.done {
		eta = time.Duration(float64(b.total-b.done) / rate * float64(time.Second)).Round(time.Second).String()
	} else if b.done >= b.total {
		eta = "0s"
	}
	return fmt.Sprintf("%s [%s%s] %5.1f%% %s/%s %s/s ETA %s", b.label,
		strings.Repeat("=", fillN), strings.Repeat(" ", width-fillN), 100*frac,
		Bytes(b.done), Bytes(b.total), Bytes(int64(rate)), eta)
}

// Bytes formats n with a binary unit (KiB, MiB, GiB).
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Reporter returns the progress callback that long operations (Generate,
// Convert, Verify) take — called with bytes done and the total — drawing
// a bar labelled label from its first call, and finish, which ends the
// bar if one was drawn.
func Reporter(label string) (update func(done, total int64), finish func()) {
	var bar *Bar
	update = func(done, total int64) {
		if bar == nil {
			bar = New(label, total)
		}
		bar.Set(done)
	}
	finish = func() {
		if bar != nil {
			bar.Finish()
		}
	}
	return update, finish
}
