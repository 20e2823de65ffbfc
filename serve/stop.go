package serve

import "strings"

// stopFilter cuts generated text at the first stop string. Text arrives
// in pieces (one per token, as the stream decoder gives it) and a stop
// string may span pieces, so the filter holds back any tail that could
// still begin one; the stop string itself is never emitted.
type stopFilter struct {
	stops   []string
	held    string
	stopped bool
}

func newStopFilter(stops []string) *stopFilter {
	var s []string
	for _, x := range stops {
		if x != "" {
			s = append(s, x)
		}
	}
	return &stopFilter{stops: s}
}

// Push feeds a piece and returns the text that is now safe to emit, and
// whether a stop string was found (then nothing more is emitted).
func (f *stopFilter) Push(piece string) (out string, stopped bool) {
	if f.stopped {
		return "", true
	}
	text := f.held + piece
	first := -1
	for _, s := range f.stops {
		if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		f.stopped, f.held = true, ""
		return text[:first], true
	}
	keep := 0 // the longest tail of text that is a proper prefix of a stop string
	for _, s := range f.stops {
		for n := min(len(s)-1, len(text)); n > keep; n-- {
			if strings.HasSuffix(text, s[:n]) {
				keep = n
				break
			}
		}
	}
	f.held = text[len(text)-keep:]
	return text[:len(text)-keep], false
}

// Flush returns the text held back at the end of generation.
func (f *stopFilter) Flush() string {
	out := f.held
	f.held = ""
	if f.stopped {
		return ""
	}
	return out
}
