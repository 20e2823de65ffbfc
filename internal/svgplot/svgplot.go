// Package svgplot draws line charts as standalone SVG: the sweeps of
// odmoe sim (tokens/s against workers, link rate, recall).
package svgplot

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// Series is one line: Y[i] at the chart's X[i].
type Series struct {
	Name string
	Y    []float64
}

// Chart is a line chart over shared X values.
type Chart struct {
	Title, XLabel, YLabel string
	X                     []float64
	LogX                  bool // X on a log scale (workers, link rates)
	Series                []Series
}

const (
	width, height          = 640, 400
	left, right, top, bott = 70, 160, 40, 50
)

var colors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}

// Write draws c. It refuses a chart with no points or with a series whose
// length differs from X's.
func (c Chart) Write(w io.Writer) error {
	if len(c.X) == 0 || len(c.Series) == 0 {
		return fmt.Errorf("svgplot: %q has no points", c.Title)
	}
	ymax := 0.0
	for _, s := range c.Series {
		if len(s.Y) != len(c.X) {
			return fmt.Errorf("svgplot: %q: series %q has %d values for %d x", c.Title, s.Name, len(s.Y), len(c.X))
		}
		for _, y := range s.Y {
			ymax = max(ymax, y)
		}
	}
	if ymax <= 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	fx := func(x float64) float64 { return x }
	if c.LogX {
		fx = math.Log10
	}
	x0, x1 := fx(c.X[0]), fx(c.X[len(c.X)-1])
	if x1 == x0 {
		x1 = x0 + 1
	}
	px := func(x float64) float64 { return left + (fx(x)-x0)/(x1-x0)*(width-left-right) }
	py := func(y float64) float64 { return height - bott - y/ymax*(height-top-bott) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(c.Title))
	// axes, y grid every fifth of ymax, x ticks at the points
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, height-bott, width-right, height-bott)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, height-bott)
	for i := 0; i <= 5; i++ {
		y := ymax * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, py(y), width-right, py(y), left-6, py(y)+4, num(y))
	}
	for _, x := range c.X {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(x), height-bott+16, num(x))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (left+width-right)/2, height-10, html.EscapeString(c.XLabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", (top+height-bott)/2, (top+height-bott)/2, html.EscapeString(c.YLabel))
	for i, s := range c.Series {
		col := colors[i%len(colors)]
		var pts []string
		for j, y := range s.Y {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(c.X[j]), py(y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
		for j, y := range s.Y {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(c.X[j]), py(y), col)
		}
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			width-right+10, top+10+18*i, width-right+30, top+10+18*i, col, width-right+34, top+14+18*i, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func num(v float64) string {
	switch {
	case v >= 1e9 && math.Mod(v, 1e9) == 0:
		return fmt.Sprintf("%.0fG", v/1e9)
	case v >= 1e6 && math.Mod(v, 1e6) == 0:
		return fmt.Sprintf("%.0fM", v/1e6)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
