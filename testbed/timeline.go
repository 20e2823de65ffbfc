// Package testbed holds what runs around a swarm on a test rig: Timeline
// draws a recorded trace.File as the timing diagram of OD-MoE's figure 2.
// It does not record traces (trace) or run nodes (the roles).
package testbed

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/odmoe/odmoe/internal/trace"
)

// TimelineOptions choose what Timeline draws.
type TimelineOptions struct {
	From, To int64  // passes to draw (inclusive); 0, 0: all in the file
	Width    int    // SVG width in px; 0: 1600
	Title    string // drawn at the top
}

// Geometry, in px. A row is rowPx high; its bars leave padPx above and
// below; a worker row splits its bars into two lanes laneGapPx apart.
const (
	defaultWidthPx = 1600
	minWidthPx     = 400
	marginPx       = 12 // page edge to title, legend and caption
	rightPx        = 28
	plotTopPx      = 48
	rowPx          = 44
	padPx          = 5
	laneGapPx      = 2
	stallPx        = 6
	labelCharPx    = 7.0 // a row label's character (12px font)
	charPx         = 6.5 // a bar label's character (11px font)
	legendRowPx    = 18
)

type spanStyle struct {
	fill, text string // bar fill, label color
	name       string // for tooltips
}

var spanStyles = map[trace.Kind]spanStyle{
	trace.Main:    {"#4e79a7", "#fff", "main compute"},
	trace.Shadow:  {"#b07aa1", "#fff", "shadow compute"},
	trace.Load:    {"#e15759", "#fff", "expert load"},
	trace.Compute: {"#59a14f", "#fff", "expert compute"},
	trace.Stall:   {"url(#stall)", "#000", "stall"},
	trace.Align:   {"#edc948", "#000", "align"},
}

type hopStyle struct{ color, dash string }

var hopStyles = map[string]hopStyle{
	trace.MsgActivation: {"#1f3b73", ""},
	trace.MsgResult:     {"#1b5e20", ""},
	trace.MsgPrediction: {"#6a3d9a", "4 2"},
	trace.MsgAlignment:  {"#f28e2b", ""},
}

var otherHop = hopStyle{"#555", "1 2"}

func styleOfHop(msg string) (hopStyle, string) {
	if s, ok := hopStyles[msg]; ok {
		return s, msg
	}
	return otherHop, "other"
}

// Timeline writes an SVG timing diagram of f's passes opt.From..opt.To:
// one row per node, every span a node recorded as a bar in its row, and
// every message between nodes as an arrow from when it left to when it
// arrived. It is OD-MoE's figure 2 drawn from measured timestamps.
func Timeline(w io.Writer, f *trace.File, opt TimelineOptions) error {
	if f == nil {
		return errors.New("testbed: timeline: no trace")
	}
	width := opt.Width
	if width == 0 {
		width = defaultWidthPx
	}
	if width < minWidthPx {
		return fmt.Errorf("testbed: timeline width %d px: want at least %d", width, minWidthPx)
	}
	if opt.From > opt.To {
		return fmt.Errorf("testbed: timeline passes %d..%d: from after to", opt.From, opt.To)
	}
	tl, err := layout(f, opt, float64(width))
	if err != nil {
		return err
	}
	var s svg
	tl.draw(&s, opt.Title)
	_, err = w.Write(s.Bytes())
	return err
}

// timeline is what Timeline draws, placed on the page.
type timeline struct {
	layers          int
	spans           []trace.Event // in drawing order
	hops            []trace.Hop
	marks           []iterMark
	rows            []string
	rowOf           map[string]int
	split           []bool // row has expert lanes
	firstIt, lastIt int64
	t0, t1          int64   // ns
	left, width     float64 // px
	scale           float64 // px per ns
	dropped         map[string]int
}

// iterMark is where a pass starts: its first M_0.
type iterMark struct {
	it    int64
	start int64
}

func isSpan(k trace.Kind) bool {
	_, ok := spanStyles[k]
	return ok
}

func layout(f *trace.File, opt TimelineOptions, width float64) (*timeline, error) {
	all := opt.From == 0 && opt.To == 0
	var evs []trace.Event
	for _, e := range f.Events {
		if all || (e.Pass >= opt.From && e.Pass <= opt.To) {
			evs = append(evs, e)
		}
	}
	if len(evs) == 0 {
		if all {
			return nil, errors.New("testbed: timeline: no events in the trace")
		}
		return nil, fmt.Errorf("testbed: timeline: no events in passes %d..%d", opt.From, opt.To)
	}
	tl := &timeline{
		layers: f.Layers, width: width, rowOf: map[string]int{}, dropped: f.Dropped,
		t0: evs[0].Start, t1: evs[0].Start, firstIt: evs[0].Pass, lastIt: evs[0].Pass,
	}
	for _, n := range f.Nodes {
		tl.addRow(n)
	}
	extra := map[string]bool{}
	marks := map[int64]int64{}
	for _, e := range evs {
		tl.t0 = min(tl.t0, e.Start, e.End)
		tl.t1 = max(tl.t1, e.Start, e.End)
		tl.firstIt, tl.lastIt = min(tl.firstIt, e.Pass), max(tl.lastIt, e.Pass)
		if _, ok := tl.rowOf[e.Node]; !ok {
			extra[e.Node] = true
		}
		if isSpan(e.Kind) {
			tl.spans = append(tl.spans, e)
		}
		if e.Kind == trace.Main && e.Layer == 0 {
			if t, ok := marks[e.Pass]; !ok || e.Start < t {
				marks[e.Pass] = e.Start
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(extra)) {
		tl.addRow(n)
	}
	for _, it := range slices.Sorted(maps.Keys(marks)) {
		tl.marks = append(tl.marks, iterMark{it, marks[it]})
	}
	tl.split = make([]bool, len(tl.rows))
	for _, e := range tl.spans {
		if e.Kind == trace.Load || e.Kind == trace.Compute || e.Kind == trace.Stall {
			tl.split[tl.rowOf[e.Node]] = true
		}
	}
	slices.SortFunc(tl.spans, tl.drawOrder)
	tl.hops = trace.Join(evs)
	// Join orders by time only; ties must not fall back on map order.
	slices.SortFunc(tl.hops, func(a, b trace.Hop) int {
		return cmp.Or(cmp.Compare(a.Sent, b.Sent), cmp.Compare(a.Received, b.Received),
			cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To), cmp.Compare(a.Msg, b.Msg),
			cmp.Compare(a.Pass, b.Pass), cmp.Compare(a.Layer, b.Layer), cmp.Compare(a.Expert, b.Expert))
	})
	tl.t1 = max(tl.t1, tl.t0+1000) // at least 1 µs wide
	longest := 0
	for _, n := range tl.rows {
		longest = max(longest, len([]rune(n)))
	}
	tl.left = min(max(64, float64(longest)*labelCharPx+16), width/4)
	tl.scale = (width - tl.left - rightPx) / float64(tl.t1-tl.t0)
	return tl, nil
}

func (tl *timeline) addRow(node string) {
	if _, ok := tl.rowOf[node]; ok {
		return
	}
	tl.rowOf[node] = len(tl.rows)
	tl.rows = append(tl.rows, node)
}

// drawOrder sorts spans by row and time; stalls come last so that they
// lie on top of the lane they share.
func (tl *timeline) drawOrder(a, b trace.Event) int {
	stall := func(e trace.Event) bool { return e.Kind == trace.Stall }
	return cmp.Or(cmp.Compare(tl.rowOf[a.Node], tl.rowOf[b.Node]),
		compareBool(stall(a), stall(b)), cmp.Compare(a.Start, b.Start), cmp.Compare(a.End, b.End),
		cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Pass, b.Pass), cmp.Compare(a.Layer, b.Layer),
		cmp.Compare(a.Expert, b.Expert))
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func (tl *timeline) x(t int64) float64 { return tl.left + float64(t-tl.t0)*tl.scale }

func (tl *timeline) plotBottom() float64 { return plotTopPx + float64(len(tl.rows)*rowPx) }

// box is where a span's bar goes vertically: expert loads in the upper
// lane of a worker row, computes (and their stalls) in the lower one.
func (tl *timeline) box(e trace.Event) (y, h float64) {
	row := tl.rowOf[e.Node]
	top := plotTopPx + float64(row*rowPx) + padPx
	full := float64(rowPx - 2*padPx)
	lane := (full - laneGapPx) / 2
	switch {
	case tl.split[row] && e.Kind == trace.Load:
		return top, lane
	case tl.split[row] && e.Kind == trace.Compute:
		return top + lane + laneGapPx, lane
	case tl.split[row] && e.Kind == trace.Stall:
		return top + lane + laneGapPx + (lane-stallPx)/2, stallPx
	case e.Kind == trace.Stall:
		return top + (full-stallPx)/2, stallPx
	}
	return top, full
}

// labels returns a bar's label and a shorter one for narrow bars.
func (tl *timeline) labels(e trace.Event) (long, short string) {
	switch e.Kind {
	case trace.Stall:
		return "", ""
	case trace.Align:
		return "align", "A"
	case trace.Shadow:
		if tl.layers > 0 && e.Layer == tl.layers {
			return "S_head", "Sh"
		}
	}
	l := string(e.Kind) + strconv.Itoa(e.Layer)
	return l, l
}

func (tl *timeline) draw(s *svg, title string) {
	legend, legendLines := legendLayout(tl.width)
	bottom := tl.plotBottom()
	legendTop := bottom + 36
	captionY := legendTop + float64(legendLines)*legendRowPx + 10
	height := captionY + 14
	s.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="11">`+"\n",
		px(tl.width), px(height), px(tl.width), px(height))
	s.defs()
	s.printf(`<rect width="%s" height="%s" fill="#fff"/>`+"\n", px(tl.width), px(height))
	if title != "" {
		s.printf(`<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", marginPx, esc(title))
	}
	tl.drawRows(s)
	tl.drawAxis(s)
	tl.drawSpans(s)
	tl.drawHops(s)
	drawLegend(s, legend, marginPx, legendTop)
	s.printf(`<text class="caption" x="%d" y="%s" fill="#333">%s</text>`+"\n", marginPx, px(captionY), esc(tl.caption()))
	s.printf("</svg>\n")
}

func (tl *timeline) drawRows(s *svg) {
	maxChars := int((tl.left - 16) / labelCharPx)
	for i, n := range tl.rows {
		y := plotTopPx + float64(i*rowPx)
		if i%2 == 0 {
			s.printf(`<rect x="0" y="%s" width="%s" height="%d" fill="#f3f5f8"/>`+"\n", px(y), px(tl.width), rowPx)
		}
		if tl.split[i] {
			mid := y + rowPx/2
			s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e2e2e2"/>`+"\n", px(tl.left), px(mid), px(tl.width-rightPx), px(mid))
		}
		label := n
		if r := []rune(n); len(r) > maxChars {
			label = string(r[:max(1, maxChars-1)]) + "…"
		}
		s.printf(`<text class="row" x="%s" y="%s" text-anchor="end" font-size="12" font-weight="bold">%s</text>`+"\n",
			px(tl.left-8), px(y+rowPx/2+4), esc(label))
	}
}

// drawAxis draws the time grid with its labels (ms since the first event)
// and a dashed line where each pass starts.
func (tl *timeline) drawAxis(s *svg) {
	top, bottom := float64(plotTopPx), tl.plotBottom()
	spanMs := float64(tl.t1-tl.t0) / 1e6
	step, decimals := tickStep(spanMs)
	for i := 0; float64(i)*step <= spanMs*(1+1e-9); i++ {
		ms := float64(i) * step
		x := tl.left + ms*1e6*tl.scale
		s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", px(x), px(top), px(x), px(bottom+4))
		s.printf(`<text class="tick" x="%s" y="%s" text-anchor="middle" fill="#444">%s</text>`+"\n",
			px(x), px(bottom+16), strconv.FormatFloat(ms, 'f', decimals, 64))
	}
	s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#888"/>`+"\n", px(tl.left), px(bottom), px(tl.width-rightPx), px(bottom))
	s.printf(`<text x="%s" y="%s" text-anchor="end" fill="#444">ms</text>`+"\n", px(tl.left-8), px(bottom+16))
	for _, m := range tl.marks {
		x := tl.x(m.start)
		s.printf(`<line class="iter" x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333" stroke-dasharray="6 3"/>`+"\n",
			px(x), px(top-14), px(x), px(bottom))
		s.printf(`<text x="%s" y="%s" fill="#333" font-weight="bold">it %d</text>`+"\n", px(x+3), px(top-4), m.it)
	}
}

// tickStep returns the smallest 1, 2 or 5 × 10^k ms step that puts at most
// 15 ticks on spanMs, and the decimals its labels need.
func tickStep(spanMs float64) (step float64, decimals int) {
	for k := int(math.Floor(math.Log10(spanMs / 15))); ; k++ {
		for _, m := range []float64{1, 2, 5} {
			if s := m * math.Pow10(k); spanMs/s <= 15 {
				return s, max(0, -k)
			}
		}
	}
}

func (tl *timeline) drawSpans(s *svg) {
	var labels svg
	for _, e := range tl.spans {
		st := spanStyles[e.Kind]
		x := tl.x(e.Start)
		w := max(1, float64(e.End-e.Start)*tl.scale)
		y, h := tl.box(e)
		s.printf(`<rect class="span %s" x="%s" y="%s" width="%s" height="%s" fill="%s" stroke="#fff" stroke-width="0.5"><title>%s</title></rect>`+"\n",
			esc(string(e.Kind)), px(x), px(y), px(w), px(h), st.fill, esc(tl.tooltip(e)))
		long, short := tl.labels(e)
		label := ""
		switch {
		case long != "" && fits(long, w):
			label = long
		case short != "" && fits(short, w):
			label = short
		}
		if label != "" {
			labels.printf(`<text x="%s" y="%s" text-anchor="middle" fill="%s">%s</text>`+"\n",
				px(x+w/2), px(y+h/2+4), st.text, esc(label))
		}
	}
	// labels above all bars, and transparent to the pointer so that the
	// bars' tooltips show through them
	s.printf("<g pointer-events=\"none\">\n%s</g>\n", labels.Bytes())
}

func fits(label string, w float64) bool { return float64(len(label))*charPx+4 <= w }

func (tl *timeline) tooltip(e trace.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s) · it %d · layer %d", e.Node, e.Kind, spanStyles[e.Kind].name, e.Pass, e.Layer)
	if e.Expert >= 0 {
		fmt.Fprintf(&b, " · expert %d", e.Expert)
	}
	fmt.Fprintf(&b, " · %.3f ms, at %.3f ms", float64(e.End-e.Start)/1e6, float64(e.Start-tl.t0)/1e6)
	return b.String()
}

// drawHops draws each message as an arrow from the sender's row, when it
// left, to the receiver's row, when it arrived; between rows it runs from
// the edge of one row's bars to the facing edge of the other's.
func (tl *timeline) drawHops(s *svg) {
	for _, h := range tl.hops {
		from, to := tl.rowOf[h.From], tl.rowOf[h.To]
		y1 := plotTopPx + float64(from*rowPx) + rowPx/2
		y2 := plotTopPx + float64(to*rowPx) + rowPx/2
		switch {
		case from < to:
			y1, y2 = y1+rowPx/2-padPx, y2-rowPx/2+padPx
		case from > to:
			y1, y2 = y1-rowPx/2+padPx, y2+rowPx/2-padPx
		}
		st, name := styleOfHop(h.Msg)
		dash := ""
		if st.dash != "" {
			dash = ` stroke-dasharray="` + st.dash + `"`
		}
		title := fmt.Sprintf("%s %s→%s · it %d · layer %d", h.Msg, h.From, h.To, h.Pass, h.Layer)
		if h.Msg == trace.MsgResult {
			title += fmt.Sprintf(" · expert %d", h.Expert)
		}
		title += fmt.Sprintf(" · %.1f µs", float64(h.Received-h.Sent)/1e3)
		s.printf(`<line class="hop %s" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.3"%s marker-end="url(#arrow-%s)"><title>%s</title></line>`+"\n",
			esc(h.Msg), px(tl.x(h.Sent)), px(y1), px(tl.x(h.Received)), px(y2), st.color, dash, name, esc(title))
	}
}

func (tl *timeline) caption() string {
	var b strings.Builder
	fmt.Fprintf(&b, "passes %d–%d · %.3f ms · %d spans, %d hops · x: ms since the first event",
		tl.firstIt, tl.lastIt, float64(tl.t1-tl.t0)/1e6, len(tl.spans), len(tl.hops))
	if len(tl.dropped) > 0 {
		b.WriteString(" · dropped:")
		for _, n := range slices.Sorted(maps.Keys(tl.dropped)) {
			fmt.Fprintf(&b, " %s %d", n, tl.dropped[n])
		}
	}
	return b.String()
}

type legendItem struct {
	kind trace.Kind // a bar, or
	msg  string     // a hop
	text string
	x    float64 // from the legend's left
	line int
}

var legendItems = []legendItem{
	{kind: trace.Main, text: "M_l main compute"},
	{kind: trace.Shadow, text: "S_l shadow compute"},
	{kind: trace.Load, text: "EL_l expert load (upper half of a worker row)"},
	{kind: trace.Compute, text: "EC_l expert compute (lower half)"},
	{kind: trace.Stall, text: "stall: request waits for its load"},
	{kind: trace.Align, text: "align: shadow applies an alignment"},
	{msg: trace.MsgActivation, text: "activation"},
	{msg: trace.MsgResult, text: "result"},
	{msg: trace.MsgPrediction, text: "prediction"},
	{msg: trace.MsgAlignment, text: "alignment"},
}

const legendMarkPx = 22 // a swatch or line and the gap after it

// legendLayout flows the legend's items into lines that fit width.
func legendLayout(width float64) ([]legendItem, int) {
	items := slices.Clone(legendItems)
	x, line := 0.0, 0
	avail := width - 2*marginPx
	for i := range items {
		w := legendMarkPx + float64(len(items[i].text))*charPx + 18
		if x > 0 && x+w > avail {
			x, line = 0, line+1
		}
		items[i].x, items[i].line = x, line
		x += w
	}
	return items, line + 1
}

func drawLegend(s *svg, items []legendItem, left, top float64) {
	for _, it := range items {
		x, y := left+it.x, top+float64(it.line*legendRowPx)
		if it.msg == "" {
			s.printf(`<rect x="%s" y="%s" width="16" height="10" fill="%s" stroke="#999" stroke-width="0.5"/>`+"\n",
				px(x), px(y-9), spanStyles[it.kind].fill)
		} else {
			st, name := styleOfHop(it.msg)
			dash := ""
			if st.dash != "" {
				dash = ` stroke-dasharray="` + st.dash + `"`
			}
			s.printf(`<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.3"%s marker-end="url(#arrow-%s)"/>`+"\n",
				px(x), px(y-4), px(x+16), px(y-4), st.color, dash, name)
		}
		s.printf(`<text x="%s" y="%s">%s</text>`+"\n", px(x+legendMarkPx), px(y), esc(it.text))
	}
}

// svg accumulates a document; Timeline writes it out at once.
type svg struct{ bytes.Buffer }

func (s *svg) printf(format string, args ...any) { fmt.Fprintf(&s.Buffer, format, args...) }

// defs declares the stall hatch and one arrow head per hop color.
func (s *svg) defs() {
	s.printf("<defs>\n")
	s.printf(`<pattern id="stall" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">` +
		`<rect width="4" height="4" fill="#dcdcdc"/><line x1="0" y1="0" x2="0" y2="4" stroke="#8c8c8c" stroke-width="1.5"/></pattern>` + "\n")
	names := slices.Sorted(maps.Keys(hopStyles))
	for _, n := range append(names, "other") {
		st, _ := styleOfHop(n)
		s.printf(`<marker id="arrow-%s" viewBox="0 0 6 6" refX="6" refY="3" markerWidth="5" markerHeight="5" orient="auto">`+
			`<path d="M0,0L6,3L0,6z" fill="%s"/></marker>`+"\n", n, st.color)
	}
	s.printf("</defs>\n")
}

// px formats a coordinate to 0.01 px.
func px(v float64) string {
	r := math.Round(v*100) / 100
	if r == 0 {
		r = 0 // no "-0"
	}
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// esc escapes text for XML character data and attribute values.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder: cannot fail
	return b.String()
}
