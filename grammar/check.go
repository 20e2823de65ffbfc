package grammar

import (
	"errors"
	"fmt"
	"unsafe"
)

// start is what a node's beginning costs the automaton: the stacks an
// expansion of it gives (the ways it can begin), the longest chain of
// moves without a byte to reach one, and whether it can be passed
// without a byte at all.
type start struct {
	ways, moves int
	nullable    bool
}

// check refuses a grammar whose every step could not be bounded before
// it runs: one that comes back to a node without taking a byte (a schema
// that refers to itself before any text), one with a node that can begin
// in more than maxStacks ways (choices of choices: 26 definitions of two
// references each to the next begin in 2^26), more than maxMoves
// moves without a byte, an array that can go on in more than maxStacks
// ways after '[', or more than maxGrammarNodes nodes. With every node
// within these, each byte's step is bounded by the stacks it starts
// from, which stepAll bounds. It returns the node a refusal is about,
// or the bytes the grammar's nodes take.
func check(root *Node) (bad *Node, size int, err error) {
	c := &checker{done: map[*Node]start{}, open: map[*Node]bool{}}
	seen := map[*Node]bool{root: true}
	todo := []*Node{root}
	for len(todo) > 0 {
		n := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if len(seen) > maxGrammarNodes {
			return n, 0, fmt.Errorf("more than %d nodes", maxGrammarNodes)
		}
		size += nodeBytes(n)
		if _, err := c.start(n); err != nil {
			return c.bad, 0, err
		}
		if ways, err := afterOpen(n, c); err != nil {
			return c.bad, 0, err
		} else if ways > maxStacks {
			return n, 0, fmt.Errorf("%d ways to go on after its opening bracket, more than the %d the grammar follows at once", ways, maxStacks)
		}
		for _, next := range children(n) {
			if next != nil && !seen[next] {
				seen[next] = true
				todo = append(todo, next)
			}
		}
	}
	// the checker's maps, as large again, are let go here
	return nil, size, nil
}

// nodeBytes is what n takes in memory.
func nodeBytes(n *Node) int {
	size := int(unsafe.Sizeof(*n)) + len(n.lit) + 8*len(n.alts)
	if p := n.pattern; p != nil {
		size += len(p.trans)*int(unsafe.Sizeof(p.trans[0])) + len(p.accept) // shared by the strings of one pattern
		for _, l := range p.lens {
			size += 8 * len(l)
		}
	}
	for _, p := range n.props {
		size += int(unsafe.Sizeof(p)) + len(p.name)
	}
	return size
}

// maxMoves bounds the moves without a byte into a node's parts: half of
// what expand takes, which may also move on from a part just ended into
// the next.
const maxMoves = maxExpandDepth / 2

// maxGrammarNodes bounds a grammar's nodes, whatever made it.
const maxGrammarNodes = 1 << 20

type checker struct {
	done map[*Node]start
	open map[*Node]bool // on the current chain of moves without a byte
	bad  *Node
}

var errLeftRecursion = errors.New("refers to itself before any text (a left-recursive schema)")

// start works out n's start, from its parts' (memoised).
func (c *checker) start(n *Node) (start, error) {
	if s, ok := c.done[n]; ok {
		return s, nil
	}
	if c.open[n] {
		c.bad = n
		return start{}, errLeftRecursion
	}
	var s start
	switch n.kind {
	case kLits:
		s = start{ways: 1, nullable: n.lits[0] == ""}
	case kLiteral:
		s = start{ways: 1, nullable: n.lit == ""}
		if s.nullable {
			s.ways = 0
		}
	case kSpace:
		s = start{ways: 1, nullable: true}
	case kOneOf, kSeq:
		c.open[n] = true
		s.nullable = n.kind == kSeq
		for _, a := range n.alts {
			sa, err := c.start(a)
			if err != nil {
				return s, err
			}
			s.ways = min(s.ways+sa.ways, maxStacks+1)
			s.moves = max(s.moves, sa.moves+1)
			if n.kind == kOneOf {
				s.nullable = s.nullable || sa.nullable
				continue
			}
			if !sa.nullable {
				s.nullable = false
				break
			}
		}
		delete(c.open, n)
	default: // a string, number, object, array or the end: each takes a byte
		s = start{ways: 1}
	}
	switch {
	case s.ways > maxStacks:
		c.bad = n
		return s, fmt.Errorf("more than %d ways to begin here (choices of choices), more than the grammar follows at once", maxStacks)
	case s.moves > maxMoves:
		c.bad = n
		return s, fmt.Errorf("more than %d moves without a byte (references to references)", maxMoves)
	}
	c.done[n] = s
	return s, nil
}

// afterOpen is the ways an array can go on after '[' (an object's
// declared keys are one way, its extra keys another, its close a third).
func afterOpen(n *Node, c *checker) (int, error) {
	if n.kind != kArray {
		return 0, nil
	}
	s, err := c.start(n.items)
	return s.ways + 1, err
}

// children are the nodes n refers to.
func children(n *Node) []*Node {
	out := append([]*Node{n.extra, n.items}, n.alts...) // a kLits has none
	for _, p := range n.props {
		out = append(out, p.key, p.value)
	}
	return out
}
