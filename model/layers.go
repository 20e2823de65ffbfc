package model

import (
	"fmt"
	"strconv"
	"strings"
)

// LayerRange is the layers [First, End) one stage of a staged model
// holds and runs (a main stage's or a shadow stage's): the first stage's
// rows begin with the embedding, the last's end at the output head.
type LayerRange struct{ First, End int }

// AllLayers is the whole of a model of layers layers.
func AllLayers(layers int) LayerRange { return LayerRange{0, layers} }

// ParseLayerRange reads "A-B" (0-based, inclusive, as -layers takes it)
// for a model of layers layers.
func ParseLayerRange(s string, layers int) (LayerRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil {
		return LayerRange{}, fmt.Errorf("layers %q: want A-B, the first and last layer (0-based)", s)
	}
	r := LayerRange{first, last + 1}
	return r, r.Within(layers)
}

// Within checks r is a non-empty range of a model's layers layers.
func (r LayerRange) Within(layers int) error {
	if r.First < 0 || r.End <= r.First || r.End > layers {
		return fmt.Errorf("layers %s: not a range of the model's %d layers (0-%d)", r, layers, layers-1)
	}
	return nil
}

// Contains reports whether r holds layer l.
func (r LayerRange) Contains(l int) bool { return r.First <= l && l < r.End }

// Covers reports whether r holds every layer of o.
func (r LayerRange) Covers(o LayerRange) bool { return r.First <= o.First && o.End <= r.End }

// String is r as -layers takes it: "A-B", inclusive.
func (r LayerRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.End-1) }
