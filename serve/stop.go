package serve

// stopFilter cuts generated text at the first stop string. Text arrives
// in pieces (one per token, as the stream decoder gives it) and a stop
// string may span pieces, so the filter holds back the tail that could
// still begin one; the stop string itself is never emitted. The stop
// strings are one Aho-Corasick automaton fed each byte once, so a token
// costs the same however many and however long they are: the first stop
// string to be completed in the text wins (of those completed by one
// byte, the longest), wherever the pieces were cut.
type stopFilter struct {
	a       *stopAutomaton
	state   int32  // the automaton's node: the longest tail of the text that is a prefix of a stop string
	held    []byte // that tail, not yet emitted
	stopped bool
}

// stopAutomaton is the trie of the stop strings with failure links.
type stopAutomaton struct {
	nodes []stopNode
}

type stopNode struct {
	edges []stopEdge // in the order the stop strings made them
	fail  int32
	depth int32 // the length of the prefix the node stands for
	match int32 // the length of the longest stop string ending here (via the failure links); 0: none
}

type stopEdge struct {
	b    byte
	next int32
}

func (n *stopNode) child(b byte) int32 {
	for _, e := range n.edges {
		if e.b == b {
			return e.next
		}
	}
	return -1
}

// newStopAutomaton builds the automaton of stops (empty ones left out).
func newStopAutomaton(stops []string) *stopAutomaton {
	a := &stopAutomaton{nodes: []stopNode{{}}}
	for _, s := range stops {
		if s == "" {
			continue
		}
		cur := int32(0)
		for i := 0; i < len(s); i++ {
			next := a.nodes[cur].child(s[i])
			if next < 0 {
				next = int32(len(a.nodes))
				a.nodes = append(a.nodes, stopNode{depth: a.nodes[cur].depth + 1})
				a.nodes[cur].edges = append(a.nodes[cur].edges, stopEdge{s[i], next})
			}
			cur = next
		}
		a.nodes[cur].match = int32(len(s))
	}
	// failure links, breadth first: a node's is its longest proper suffix
	// in the trie
	queue := []int32{}
	for _, e := range a.nodes[0].edges {
		queue = append(queue, e.next)
	}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for _, e := range a.nodes[u].edges {
			f := a.nodes[u].fail
			for f > 0 && a.nodes[f].child(e.b) < 0 {
				f = a.nodes[f].fail
			}
			if c := a.nodes[f].child(e.b); c >= 0 && c != e.next {
				a.nodes[e.next].fail = c
			}
			a.nodes[e.next].match = max(a.nodes[e.next].match, a.nodes[a.nodes[e.next].fail].match)
			queue = append(queue, e.next)
		}
	}
	return a
}

// step is the node after b from node cur.
func (a *stopAutomaton) step(cur int32, b byte) int32 {
	for {
		if c := a.nodes[cur].child(b); c >= 0 {
			return c
		}
		if cur == 0 {
			return 0
		}
		cur = a.nodes[cur].fail
	}
}

func newStopFilter(stops []string) *stopFilter {
	return &stopFilter{a: newStopAutomaton(stops)}
}

// Push feeds a piece and returns the text that is now safe to emit, and
// whether a stop string was found (then nothing more is emitted).
func (f *stopFilter) Push(piece string) (out string, stopped bool) {
	if f.stopped {
		return "", true
	}
	text := append(f.held, piece...)
	for i := len(f.held); i < len(text); i++ {
		f.state = f.a.step(f.state, text[i])
		if m := f.a.nodes[f.state].match; m > 0 {
			f.stopped, f.held = true, nil
			return string(text[:i+1-int(m)]), true
		}
	}
	keep := int(f.a.nodes[f.state].depth)
	out = string(text[:len(text)-keep])
	f.held = append(f.held[:0], text[len(text)-keep:]...)
	return out, false
}

// Flush returns the text held back at the end of generation.
func (f *stopFilter) Flush() string {
	out := string(f.held)
	f.held = nil
	if f.stopped {
		return ""
	}
	return out
}
