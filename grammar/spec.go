package grammar

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
)

// A grammar's spec is its nodes written out, so that another node (the
// shadow, guessing a constrained request's tokens) runs the same
// grammar without the request that made it: JSON of every node reachable
// from the root, numbered in the order they are first met, each naming
// the others by number (a recursive schema's cycles included).
type spec struct {
	Version int        `json:"v"`
	Nodes   []specNode `json:"nodes"` // node 0 is the root
}

type specNode struct {
	Kind     kind       `json:"k"`
	Lit      string     `json:"l,omitempty"`
	Lits     []string   `json:"ls,omitempty"`
	Props    []specProp `json:"p,omitempty"`
	Extra    int        `json:"x"` // -1: none
	Items    int        `json:"i"` // -1: none
	MinItems int        `json:"min,omitempty"`
	MaxItems int        `json:"max,omitempty"`
	Alts     []int      `json:"a,omitempty"`
	// a string's pattern (its regular expression, compiled again) and
	// a number's bounds (exact decimals or fractions)
	Pattern  string `json:"re,omitempty"`
	Lo       string `json:"lo,omitempty"`
	Hi       string `json:"hi,omitempty"`
	LoExcl   bool   `json:"lox,omitempty"`
	HiExcl   bool   `json:"hix,omitempty"`
	Multiple string `json:"mul,omitempty"`
	Bounded  bool   `json:"b,omitempty"`
}

type specProp struct {
	Name     string `json:"n"`
	Key      int    `json:"key"`
	Value    int    `json:"val"`
	Required bool   `json:"req,omitempty"`
}

const specVersion = 3 // 2: kLits; 3: string lengths and patterns, number bounds

// maxSpecNodes bounds a spec's nodes: far more than any schema the
// server compiles (whose own limits come first).
const maxSpecNodes = 1 << 20

// Spec writes g out (see spec). The bytes are the same for the same
// grammar.
func (g *Grammar) Spec() ([]byte, error) {
	g.specOnce.Do(func() {
		index := map[*Node]int{}
		var nodes []*Node
		number := func(n *Node) int {
			if n == nil {
				return -1
			}
			if i, ok := index[n]; ok {
				return i
			}
			index[n] = len(nodes)
			nodes = append(nodes, n)
			return index[n]
		}
		number(g.root)
		var s spec
		s.Version = specVersion
		for i := 0; i < len(nodes); i++ { // nodes grows as they are met
			n := nodes[i]
			sn := specNode{Kind: n.kind, Lit: n.lit, Lits: n.lits, MinItems: n.minItems, MaxItems: n.maxItems}
			if n.pattern != nil {
				sn.Pattern = n.pattern.source
			}
			if b := n.bounds; b != nil {
				sn.Bounded, sn.LoExcl, sn.HiExcl = true, b.loExcl, b.hiExcl
				if b.lo != nil {
					sn.Lo = b.lo.RatString()
				}
				if b.hi != nil {
					sn.Hi = b.hi.RatString()
				}
				if b.multiple != nil {
					sn.Multiple = b.multiple.String()
				}
			}
			for _, p := range n.props {
				sn.Props = append(sn.Props, specProp{Name: p.name, Key: number(p.key), Value: number(p.value), Required: p.required})
			}
			sn.Extra, sn.Items = number(n.extra), number(n.items)
			for _, a := range n.alts {
				sn.Alts = append(sn.Alts, number(a))
			}
			s.Nodes = append(s.Nodes, sn)
		}
		g.spec, g.specErr = json.Marshal(s)
	})
	return g.spec, g.specErr
}

// FromSpec reads a grammar Spec wrote. What is malformed (an unknown
// kind, a node numbered out of range, a part a kind needs missing) is
// refused, named.
func FromSpec(b []byte) (*Grammar, error) {
	var s spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("grammar: spec: %w", err)
	}
	switch {
	case s.Version != specVersion:
		return nil, fmt.Errorf("grammar: spec version %d, want %d", s.Version, specVersion)
	case len(s.Nodes) == 0 || len(s.Nodes) > maxSpecNodes:
		return nil, fmt.Errorf("grammar: spec of %d nodes (1 to %d)", len(s.Nodes), maxSpecNodes)
	}
	nodes := make([]*Node, len(s.Nodes))
	for i := range nodes {
		nodes[i] = &Node{}
	}
	ref := func(i, at int, what string, optional bool) (*Node, error) {
		switch {
		case i == -1 && optional:
			return nil, nil
		case i < 0 || i >= len(nodes):
			return nil, fmt.Errorf("grammar: spec node %d's %s is node %d, of %d", at, what, i, len(nodes))
		}
		return nodes[i], nil
	}
	for i, sn := range s.Nodes {
		n := nodes[i]
		if sn.Kind > kLits {
			return nil, fmt.Errorf("grammar: spec node %d of unknown kind %d", i, sn.Kind)
		}
		if sn.MinItems < 0 || sn.MaxItems < -1 || sn.MaxItems >= 0 && sn.MaxItems < sn.MinItems {
			return nil, fmt.Errorf("grammar: spec node %d: %d to %d items", i, sn.MinItems, sn.MaxItems)
		}
		n.kind, n.lit, n.lits, n.minItems, n.maxItems = sn.Kind, sn.Lit, sn.Lits, sn.MinItems, sn.MaxItems
		if sn.Kind == kLits && (len(sn.Lits) < 2 || !slices.IsSorted(sn.Lits) || len(slices.Compact(slices.Clone(sn.Lits))) != len(sn.Lits)) {
			return nil, fmt.Errorf("grammar: spec node %d: texts not two or more, sorted, each once", i)
		}
		var err error
		if sn.Pattern != "" {
			if sn.Kind != kString {
				return nil, fmt.Errorf("grammar: spec node %d: a pattern on a node not a string", i)
			}
			if n.pattern, err = compilePattern(sn.Pattern); err != nil {
				return nil, fmt.Errorf("grammar: spec node %d: %v", i, err)
			}
			if !n.pattern.lengthen(sn.MinItems, sn.MaxItems) {
				return nil, fmt.Errorf("grammar: spec node %d: no string of %d to %d characters matches its pattern", i, sn.MinItems, sn.MaxItems)
			}
		}
		if sn.Bounded {
			if n.bounds, err = specBounds(sn); err != nil {
				return nil, fmt.Errorf("grammar: spec node %d: %v", i, err)
			}
		}
		if n.extra, err = ref(sn.Extra, i, "extra", true); err != nil {
			return nil, err
		}
		if n.items, err = ref(sn.Items, i, "items", sn.Kind != kArray); err != nil {
			return nil, err
		}
		for _, p := range sn.Props {
			prop := property{name: p.Name, required: p.Required}
			if prop.key, err = ref(p.Key, i, "property key", false); err != nil {
				return nil, err
			}
			if prop.value, err = ref(p.Value, i, "property value", false); err != nil {
				return nil, err
			}
			n.props = append(n.props, prop)
		}
		for _, a := range sn.Alts {
			alt, err := ref(a, i, "part", false)
			if err != nil {
				return nil, err
			}
			n.alts = append(n.alts, alt)
		}
		if (sn.Kind == kOneOf || sn.Kind == kSeq) && len(n.alts) == 0 {
			return nil, fmt.Errorf("grammar: spec node %d: a %s of no parts", i, map[kind]string{kOneOf: "choice", kSeq: "sequence"}[sn.Kind])
		}
	}
	return New(nodes[0])
}

// specBounds reads a number node's bounds.
func specBounds(sn specNode) (*bounds, error) {
	if sn.Kind != kNumber && sn.Kind != kInteger {
		return nil, fmt.Errorf("bounds on a node not a number")
	}
	b := &bounds{loExcl: sn.LoExcl, hiExcl: sn.HiExcl}
	for _, e := range []struct {
		text string
		to   **big.Rat
	}{{sn.Lo, &b.lo}, {sn.Hi, &b.hi}} {
		if e.text == "" {
			continue
		}
		r, ok := new(big.Rat).SetString(e.text)
		if !ok {
			return nil, fmt.Errorf("a bound %q is not a number", e.text)
		}
		*e.to = r
	}
	if sn.Multiple != "" {
		m, ok := new(big.Int).SetString(sn.Multiple, 10)
		if !ok || m.Sign() <= 0 || sn.Kind != kInteger {
			return nil, fmt.Errorf("multipleOf %q: not a positive integer of an integer", sn.Multiple)
		}
		b.multiple = m
	}
	return b, nil
}
