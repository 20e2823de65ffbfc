package svgplot

import (
	"encoding/xml"
	"strings"
	"testing"
)

// TestChartIsWellFormedSVGWithEveryPoint: the chart parses as XML and
// has a line and a dot per point of every series, and the legend.
func TestChartIsWellFormedSVGWithEveryPoint(t *testing.T) {
	c := Chart{Title: "tokens/s <by> workers", XLabel: "workers", YLabel: "tok/s", X: []float64{4, 8, 16, 32}, LogX: true,
		Series: []Series{{Name: "shadow", Y: []float64{1, 2, 3.5, 4}}, {Name: "resident", Y: []float64{5, 5, 5, 5}}}}
	var b strings.Builder
	if err := c.Write(&b); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(strings.NewReader(b.String()))
	counts := map[string]int{}
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
	if counts["svg"] != 1 || counts["polyline"] != 2 || counts["circle"] != 8 {
		t.Fatalf("elements %v: want one svg, 2 polylines, 8 circles", counts)
	}
	if !strings.Contains(b.String(), "&lt;by&gt;") || !strings.Contains(b.String(), ">resident<") {
		t.Fatal("the title is not escaped or the legend is missing")
	}
	if err := (Chart{X: []float64{1}, Series: []Series{{Y: []float64{1, 2}}}}).Write(&b); err == nil {
		t.Fatal("a series longer than X accepted")
	}
}
