package testbed

import (
	"bytes"
	"cmp"
	"encoding/xml"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/internal/trace"
)

var timelineOut = flag.String("timeline", "", "write the synthetic example timeline to this SVG `path`")

// synthTrace is a swarm of main, shadow and four workers running a
// two-layer model for passes 1..4: the shadow runs ahead and sends
// predictions, workers load on prediction and compute on activation (w3
// stalls on a slow load in layer 0, w4 hits a cached expert in layer 1),
// and the main node aligns the shadow at the end of each pass.
func synthTrace() *trace.File {
	const (
		layers   = 2
		periodUs = 4000
		base     = int64(1_700_000_000_000_000_000)
	)
	f := &trace.File{From: 1, To: 4, Layers: layers,
		Nodes: []string{"main", "shadow", "w1", "w2", "w3", "w4"}}
	span := func(node string, k trace.Kind, it int64, layer, expert int, startUs, endUs int64) {
		f.Events = append(f.Events, trace.Event{Node: node, Kind: k, Pass: it, Layer: layer, Expert: expert,
			Start: base + startUs*1000, End: base + endUs*1000})
	}
	hop := func(from, to, msg string, it int64, layer, expert int, id uint64, sentUs, latencyUs int64) {
		s := trace.Event{Node: from, Kind: trace.Send, Peer: to, Msg: msg, Pass: it, Layer: layer, Expert: expert, ID: id,
			Start: base + sentUs*1000, End: base + sentUs*1000}
		r := s
		r.Node, r.Kind, r.Peer = to, trace.Recv, from
		r.Start = base + (sentUs+latencyUs)*1000
		r.End = r.Start
		f.Events = append(f.Events, s, r)
	}
	for it := int64(1); it <= 4; it++ {
		tb := (it - 1) * periodUs
		// shadow: ahead of main, a prediction per layer to every worker
		loadFree := map[string]int64{}
		predicted := map[string][]int64{} // worker -> when its layer-l load ends
		for l := 0; l <= layers; l++ {
			s := tb - 1000 + int64(l)*400
			e := s + 400
			if l == layers {
				e = s + 200 // the head
			}
			span("shadow", trace.Shadow, it, l, -1, s, e)
			if l == layers {
				break
			}
			for k := range 4 {
				w := "w" + strconv.Itoa(k+1)
				hop("shadow", w, trace.MsgPrediction, it, l, -1, 0, e, 30)
				expert := int(it*3+int64(l)*5+int64(k)) % 16
				dur := int64(1000)
				switch {
				case w == "w3" && l == 0:
					dur = 1500
				case w == "w4" && l == 1:
					dur = 0
				}
				ls := max(e+30, loadFree[w])
				span(w, trace.Load, it, l, expert, ls, ls+dur)
				loadFree[w] = ls + dur
				predicted[w] = append(predicted[w], ls+dur)
			}
		}
		// main: a layer's activation to every worker, results back
		t := tb
		for l := range layers {
			m := int64(600)
			if l == 0 {
				m = 800 // sampling and embedding too
			}
			span("main", trace.Main, it, l, -1, t, t+m)
			t += m
			last := t
			for k := range 4 {
				w := "w" + strconv.Itoa(k+1)
				expert := int(it*3+int64(l)*5+int64(k)) % 16
				id := uint64(it*100 + int64(l)*10 + int64(k))
				hop("main", w, trace.MsgActivation, it, l, -1, id, t, 40)
				arrive := t + 40
				start := max(arrive, predicted[w][l])
				if start > arrive {
					span(w, trace.Stall, it, l, expert, arrive, start)
				}
				span(w, trace.Compute, it, l, expert, start, start+400)
				hop(w, "main", trace.MsgResult, it, l, expert, id, start+400, 45)
				last = max(last, start+445)
			}
			t = last + 100
		}
		hop("main", "shadow", trace.MsgAlignment, it, layers-1, -1, 0, t, 50)
		span("shadow", trace.Align, it, 0, -1, t+50, t+250)
	}
	return f
}

// element is an SVG element decoded generically.
type element struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Text     string     `xml:",chardata"`
	Children []element  `xml:",any"`
}

func (e *element) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (e *element) num(t *testing.T, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(e.attr(name), 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", e.XMLName.Local, name, e.attr(name), err)
	}
	return v
}

func (e *element) title() string {
	for _, c := range e.Children {
		if c.XMLName.Local == "title" {
			return c.Text
		}
	}
	return ""
}

// walk calls fn on e and every element below it, in document order.
func (e *element) walk(fn func(*element)) {
	fn(e)
	for i := range e.Children {
		e.Children[i].walk(fn)
	}
}

// render draws f and decodes the result, failing unless it is one
// well-formed <svg> document.
func render(t *testing.T, f *trace.File, opt TimelineOptions) (*element, []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := Timeline(&buf, f, opt); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed: %v", err)
		}
	}
	var root element
	if err := xml.Unmarshal(buf.Bytes(), &root); err != nil {
		t.Fatal(err)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" ||
		root.attr("viewBox") == "" || root.attr("width") == "" || root.attr("height") == "" {
		t.Fatalf("root is <%s> in %q, viewBox %q", root.XMLName.Local, root.XMLName.Space, root.attr("viewBox"))
	}
	return &root, buf.Bytes()
}

// withClass returns the elements whose class starts with prefix.
func withClass(root *element, prefix string) []*element {
	var out []*element
	root.walk(func(e *element) {
		if strings.HasPrefix(e.attr("class"), prefix) {
			out = append(out, e)
		}
	})
	return out
}

func inWindow(f *trace.File, from, to int64) []trace.Event {
	var out []trace.Event
	for _, e := range f.Events {
		if e.Pass >= from && e.Pass <= to {
			out = append(out, e)
		}
	}
	return out
}

func TestTimelineDrawsOneBarPerSpanInWindow(t *testing.T) {
	f := synthTrace()
	root, _ := render(t, f, TimelineOptions{From: 2, To: 3, Title: "synthetic"})
	want := map[string]int{}
	for _, e := range inWindow(f, 2, 3) {
		if e.Kind != trace.Send && e.Kind != trace.Recv {
			want[string(e.Kind)]++
		}
	}
	for _, k := range []trace.Kind{trace.Main, trace.Shadow, trace.Load, trace.Compute, trace.Stall, trace.Align} {
		bars := withClass(root, "span "+string(k))
		if want[string(k)] == 0 || len(bars) != want[string(k)] {
			t.Errorf("%s: %d bars, want %d", k, len(bars), want[string(k)])
		}
		for _, b := range bars {
			if b.XMLName.Local != "rect" || b.title() == "" || b.num(t, "width") < 1 {
				t.Errorf("%s bar <%s> width %q title %q", k, b.XMLName.Local, b.attr("width"), b.title())
			}
		}
	}
}

func TestTimelineDrawsOneArrowPerHopInWindow(t *testing.T) {
	f := synthTrace()
	root, _ := render(t, f, TimelineOptions{From: 2, To: 3})
	hops := trace.Join(inWindow(f, 2, 3))
	lines := withClass(root, "hop ")
	if len(lines) != len(hops) {
		t.Fatalf("%d hop lines, want %d", len(lines), len(hops))
	}
	for _, msg := range []string{trace.MsgActivation, trace.MsgResult, trace.MsgPrediction, trace.MsgAlignment} {
		if len(withClass(root, "hop "+msg)) == 0 {
			t.Errorf("no %s hop drawn", msg)
		}
	}
	for _, l := range lines {
		if !strings.Contains(l.title(), "µs") || l.num(t, "x2") < l.num(t, "x1") {
			t.Errorf("hop %q runs from x %s to %s", l.title(), l.attr("x1"), l.attr("x2"))
		}
	}
}

func TestTimelineLabelsEveryRowInNodeOrder(t *testing.T) {
	f := synthTrace()
	root, _ := render(t, f, TimelineOptions{From: 3, To: 3})
	labels := withClass(root, "row")
	var names []string
	prevY := -1.0
	for _, l := range labels {
		names = append(names, l.Text)
		if y := l.num(t, "y"); y <= prevY {
			t.Errorf("row %q at y %v, above the row before it", l.Text, y)
		} else {
			prevY = y
		}
	}
	if !slices.Equal(names, f.Nodes) {
		t.Fatalf("rows %q, want %q", names, f.Nodes)
	}
}

func TestTimelineLeavesOutOtherPasses(t *testing.T) {
	f := synthTrace()
	f.Events = append(f.Events, trace.Event{Node: "w2", Kind: trace.Compute, Pass: 4, Layer: 1, Expert: 99,
		Start: f.Events[0].Start, End: f.Events[0].Start + 1000})
	root, _ := render(t, f, TimelineOptions{From: 2, To: 3})
	root.walk(func(e *element) {
		if strings.Contains(e.Text, "expert 99") || strings.Contains(e.Text, "it 4") || strings.Contains(e.Text, "it 1") {
			t.Errorf("<%s> of another pass drawn: %q", e.XMLName.Local, e.Text)
		}
	})
	if n := len(withClass(root, "iter")); n != 2 {
		t.Errorf("%d pass marks, want 2", n)
	}
}

func TestTimelinePlacesLaterSpansFurtherRight(t *testing.T) {
	root, _ := render(t, synthTrace(), TimelineOptions{From: 2, To: 3})
	type bar struct{ at, x float64 }
	var bars []bar
	for _, b := range withClass(root, "span ") {
		title := b.title()
		i := strings.LastIndex(title, "at ")
		at, err := strconv.ParseFloat(strings.TrimSuffix(title[i+3:], " ms"), 64)
		if i < 0 || err != nil {
			t.Fatalf("no start in %q: %v", title, err)
		}
		bars = append(bars, bar{at, b.num(t, "x")})
	}
	slices.SortFunc(bars, func(a, b bar) int { return cmp.Compare(a.at, b.at) })
	if bars[0].at != 0 {
		t.Errorf("first span at %v ms, want 0", bars[0].at)
	}
	for i := 1; i < len(bars); i++ {
		if bars[i].at > bars[i-1].at && bars[i].x <= bars[i-1].x {
			t.Errorf("span at %v ms drawn at x %v, not right of the span at %v ms (x %v)",
				bars[i].at, bars[i].x, bars[i-1].at, bars[i-1].x)
		}
	}
}

func TestTimelineIsDeterministic(t *testing.T) {
	f := synthTrace()
	f.Dropped = map[string]int{"w3": 2, "w1": 1}
	_, first := render(t, f, TimelineOptions{})
	_, again := render(t, f, TimelineOptions{})
	if !bytes.Equal(first, again) {
		t.Fatal("two renderings of one trace differ")
	}
	// the order events arrive in must not matter either
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(f.Events), func(i, j int) { f.Events[i], f.Events[j] = f.Events[j], f.Events[i] })
	if _, shuffled := render(t, f, TimelineOptions{}); !bytes.Equal(first, shuffled) {
		t.Fatal("rendering depends on the order of events")
	}
}

func TestTimelineAddsRowsForUnlistedNodes(t *testing.T) {
	f := synthTrace()
	at := f.Events[0].Start
	f.Events = append(f.Events,
		trace.Event{Node: "w9", Kind: trace.Compute, Pass: 2, Layer: 0, Expert: 7, Start: at, End: at + 5000},
		trace.Event{Node: "aux<&>", Kind: trace.Main, Pass: 2, Layer: 1, Expert: -1, Start: at, End: at}) // zero length
	root, _ := render(t, f, TimelineOptions{From: 2, To: 2})
	var names []string
	for _, l := range withClass(root, "row") {
		names = append(names, l.Text)
	}
	if want := append(slices.Clone(f.Nodes), "aux<&>", "w9"); !slices.Equal(names, want) {
		t.Fatalf("rows %q, want %q", names, want)
	}
	for _, b := range withClass(root, "span M") {
		if strings.HasPrefix(b.title(), "aux<&>") && b.num(t, "width") != 1 {
			t.Errorf("zero-length span %s px wide, want 1", b.attr("width"))
		}
	}
}

func TestTimelineRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *trace.File
		opt  TimelineOptions
		want string
	}{
		{"an empty window", synthTrace(), TimelineOptions{From: 10, To: 12}, "passes 10..12"},
		{"an empty trace", &trace.File{Nodes: []string{"main"}}, TimelineOptions{}, "no events"},
		{"a window ending before it starts", synthTrace(), TimelineOptions{From: 3, To: 2}, "3..2"},
		{"no trace", nil, TimelineOptions{}, "no trace"},
		{"a narrow page", synthTrace(), TimelineOptions{Width: 100}, "width 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Timeline(&buf, tc.f, tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one naming %q", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Errorf("wrote %d bytes on error", buf.Len())
			}
		})
	}
}

func TestTickStepGivesSevenToSixteenTicks(t *testing.T) {
	for _, spanMs := range []float64{0.001, 0.0173, 1, 3.7, 9.99, 10, 12.3, 47, 150, 999, 12345} {
		step, _ := tickStep(spanMs)
		n := int(spanMs/step) + 1
		if n < 7 || n > 16 {
			t.Errorf("span %v ms: step %v gives %d ticks", spanMs, step, n)
		}
	}
}

// TestTimelineExample writes the synthetic timeline for a person to look
// at: go test ./testbed/ -run Example -timeline /tmp/timeline_example.svg
func TestTimelineExample(t *testing.T) {
	if *timelineOut == "" {
		t.Skip("no -timeline path")
	}
	var buf bytes.Buffer
	opt := TimelineOptions{From: 2, To: 3, Title: "OD-MoE timing, synthetic trace (2 layers, 4 workers)"}
	if err := Timeline(&buf, synthTrace(), opt); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*timelineOut, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
