package grammar

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

type kind uint8

const (
	kLiteral kind = iota // lit, exactly
	kString              // a JSON string
	kNumber              // a JSON number
	kInteger             // a JSON number without fraction or exponent
	kObject              // a JSON object: props in order, then extra
	kArray               // a JSON array of items
	kOneOf               // any one of alts
	kSeq                 // alts one after another
	kSpace               // optional whitespace
	kEnd                 // the grammar is complete
	kLits                // any one of lits, exactly (an enum): one frame however many
)

// Node is one part of a grammar.
type Node struct {
	kind  kind
	lit   string
	lits  []string // kLits: sorted, each once
	props []property
	extra *Node // object: the schema of properties beyond props; nil: none
	items *Node
	// minItems and maxItems bound an array's items, or a string's
	// characters (maxItems < 0: no bound)
	minItems, maxItems int
	alts               []*Node
	// pattern, if set, is what a string's characters must match (a
	// pattern or a format, as a DFA over its bytes: such a string has no
	// escapes)
	pattern *pattern
	// bounds, if set, bound a number's value
	bounds *bounds
}

// property is one declared property of an object.
type property struct {
	name     string
	key      *Node // the JSON-encoded name and its colon: "name":
	value    *Node
	required bool
}

// Limits on what a grammar lets a model write, so that no output runs
// on without end inside one value.
const (
	maxSpace       = 24 // whitespace bytes in one place
	maxIntDigits   = 16
	maxFracDigits  = 16
	maxExpDigits   = 3
	maxStacks      = 64  // ways to read the output at once (more are let go)
	maxExpandDepth = 200 // epsilon moves in a row (a left-recursive schema)
)

// Literal is text written exactly.
func Literal(text string) *Node { return &Node{kind: kLiteral, lit: text} }

// Literals is any one of texts, exactly: where OneOf of Literals keeps a
// way to read the output for each text that fits what is written so far,
// Literals keeps one, however many texts fit.
func Literals(texts ...string) *Node {
	lits := slices.Compact(slices.Sorted(slices.Values(texts)))
	if len(lits) == 1 {
		return Literal(lits[0])
	}
	return &Node{kind: kLits, lits: lits}
}

// Seq is its parts one after another.
func Seq(parts ...*Node) *Node { return &Node{kind: kSeq, alts: parts} }

// OneOf is any one of alts.
func OneOf(alts ...*Node) *Node {
	if len(alts) == 1 {
		return alts[0]
	}
	return &Node{kind: kOneOf, alts: alts}
}

// OneOrMore is n, then any number of further ns each after sep.
func OneOrMore(n *Node, sep string) *Node {
	more := &Node{kind: kOneOf}
	more.alts = []*Node{n, Seq(n, Literal(sep), more)}
	return more
}

func stringNode() *Node { return &Node{kind: kString, maxItems: -1} }

// counts reports whether a string node counts its characters: it has
// a length bound.
func (n *Node) counts() bool { return n.minItems > 0 || n.maxItems >= 0 }

// plainString reports whether n is a string that takes any characters.
func (n *Node) plainString() bool { return n.kind == kString && !n.counts() && n.pattern == nil }
func numberNode(integer bool) *Node {
	if integer {
		return &Node{kind: kInteger}
	}
	return &Node{kind: kNumber}
}

// anyValue is any JSON value, anyValueNodes nodes.
func anyValue() *Node {
	v := &Node{kind: kOneOf}
	v.alts = []*Node{
		{kind: kObject, extra: v},
		{kind: kArray, items: v, maxItems: -1},
		stringNode(), numberNode(false), Literal("true"), Literal("false"), Literal("null"),
	}
	return v
}

const anyValueNodes = 8

// AnyObject is any JSON object (response_format json_object).
func AnyObject() *Node { return &Node{kind: kObject, extra: anyValue()} }

// Grammar is a complete grammar, ready to run. Its nodes never change:
// one Grammar serves any number of generations at once.
type Grammar struct {
	root *Node
	// id tells its states from another grammar's in a shared MaskCache,
	// whose keys name nodes by address: a grammar let go, and another's
	// nodes made at the same addresses, must not find its masks
	id uint64
	// size is the bytes its nodes take
	size int
	// its Spec, written once
	specOnce sync.Once
	spec     []byte
	specErr  error
}

// grammars numbers the grammars made (Grammar.id).
var grammars atomic.Uint64

// New returns the grammar whose outputs are root's texts, or refuses one
// whose steps could not be bounded (see check).
func New(root *Node) (*Grammar, error) {
	_, size, err := check(root)
	if err != nil {
		return nil, fmt.Errorf("grammar: %w", err)
	}
	return &Grammar{root: root, id: grammars.Add(1), size: size}, nil
}

var endNode = &Node{kind: kEnd}

// frame is one level of a stack: a node, where in it the output is, and
// the frame to return to. Frames never change once made.
type frame struct {
	n    *Node
	st   uint8 // state within n
	i, k int32 // counters: offset, digits, next property, items so far
	// text is a bounded number's bytes so far (its value decides what
	// may follow)
	text string
	up   *frame
	// hash is the whole stack's, from this frame down (as sameStack
	// compares stacks), worked out when first asked (stackHash); 0: not
	// yet. A frame belongs to one constraint's states, used by one
	// goroutine at a time.
	hash uint64
}

func newFrame(n *Node, st uint8, i, k int32, up *frame) *frame {
	return &frame{n: n, st: st, i: i, k: k, up: up}
}

// stackHash is f's stack's hash, memoised in its frames.
func stackHash(f *frame) uint64 {
	if f == nil {
		return 14695981039346656037
	}
	if f.hash == 0 {
		h := stackHash(f.up)
		for _, x := range [...]uint64{uint64(uintptr(unsafe.Pointer(f.n))), uint64(f.st), uint64(uint32(f.i)), uint64(uint32(f.k))} {
			h = (h ^ x) * 1099511628211
		}
		for i := 0; i < len(f.text); i++ {
			h = (h ^ uint64(f.text[i])) * 1099511628211
		}
		f.hash = h | 1
	}
	return f.hash
}

// start returns the stacks before any byte.
func (g *Grammar) start() ([]*frame, error) {
	var out []*frame
	return expand(push(g.root, push(endNode, nil)), out, 0)
}

func push(n *Node, up *frame) *frame { return newFrame(n, 0, 0, 0, up) }

func with(f *frame, st uint8, i, k int32) *frame {
	return newFrame(f.n, st, i, k, f.up)
}

// space is optional whitespace over up.
func space(up *frame) *frame { return push(spaceNode, up) }

var spaceNode = &Node{kind: kSpace}

// expand appends to out the stacks f stands for whose top frames each
// consume a byte (or are the end): it takes the moves that consume
// nothing. depth counts the moves into a node's parts (check bounds
// them); moves back up a stack are bounded by the stack.
func expand(f *frame, out []*frame, depth int) ([]*frame, error) {
	if depth > maxExpandDepth {
		return out, fmt.Errorf("grammar: more than %d moves without a byte (a schema that refers to itself before any text)", maxExpandDepth)
	}
	down := depth + 1
	n := f.n
	switch n.kind {
	case kEnd:
		return append(out, f), nil
	case kLiteral:
		if int(f.i) == len(n.lit) {
			return expand(f.up, out, depth)
		}
	case kLits:
		// f.k is the first text (in order) that begins with what is
		// written, f.i bytes of it; where it is whole, it may end here,
		// and the texts it begins may go on
		if lit := n.lits[f.k]; int(f.i) == len(lit) {
			if int(f.k)+1 < len(n.lits) && strings.HasPrefix(n.lits[f.k+1], lit) {
				out = append(out, f)
			}
			return expand(f.up, out, depth)
		}
	case kSpace:
		if f.i < maxSpace {
			out = append(out, f)
		}
		return expand(f.up, out, depth)
	case kString:
		if f.st == strDone {
			return expand(f.up, out, depth)
		}
	case kNumber, kInteger:
		if numCanEnd[f.st] && n.bounds.admits(f.text, n.kind == kInteger) {
			out = append(out, f)
			return expand(f.up, out, depth)
		}
	case kOneOf:
		var err error
		for _, a := range n.alts {
			if out, err = expand(push(a, f.up), out, down); err != nil {
				return out, err
			}
		}
		return out, nil
	case kSeq:
		if int(f.i) == len(n.alts) {
			return expand(f.up, out, depth)
		}
		return expand(push(n.alts[f.i], with(f, 0, f.i+1, 0)), out, down)
	case kObject:
		if f.st == 1 {
			return expandObject(f, out, down)
		}
	case kArray:
		if f.st == 1 {
			return expandArray(f, out, down)
		}
	}
	return append(out, f), nil
}

// expandObject: after '{' or a property's value, the object may close
// (when no required property is left), go on with any declared property
// up to the next required one (one frame for them all: objKey), or with
// an extra property once no required one is left.
func expandObject(f *frame, out []*frame, depth int) ([]*frame, error) {
	n := f.n
	var err error
	// sep is the comma before a property and the whitespace after it
	sep := func(over *frame) *frame {
		if f.k == 0 {
			return over
		}
		return push(commaNode, space(over))
	}
	optionalRest := !slices.ContainsFunc(n.props[f.i:], func(p property) bool { return p.required })
	if int(f.i) < len(n.props) {
		if out, err = expand(sep(newFrame(n, objKey, 0, f.i, f)), out, depth); err != nil {
			return out, err
		}
	}
	if !optionalRest {
		return out, nil
	}
	if n.extra != nil {
		after := space(with(f, 1, int32(len(n.props)), f.k+1))
		value := push(n.extra, after)
		key := push(keyString, push(colonNode, space(value)))
		if out, err = expand(sep(key), out, depth); err != nil {
			return out, err
		}
	}
	return expand(push(closeObject, f.up), out, depth)
}

// objKey is an object's state while a declared property's key is
// written: f.i bytes of it, f.k the first property (in order, from the
// object's next one to its next required one) whose key begins with
// them; the object's own frame is f.up.
const objKey = 2

// stepKey takes byte c of a declared key: the first property of those
// left whose key goes on with c, and once its key is whole, its value.
func stepKey(f *frame, c byte, out []*frame) ([]*frame, error) {
	n, obj, at := f.n, f.up, int(f.i)
	written := n.props[f.k].key.lit[:at]
	for q := int(f.k); q < len(n.props); q++ {
		p := n.props[q]
		if key := p.key.lit; len(key) > at && key[at] == c && strings.HasPrefix(key, written) {
			if at+1 < len(key) {
				return append(out, with(f, objKey, int32(at+1), int32(q))), nil
			}
			after := space(with(obj, 1, int32(q)+1, obj.k+1))
			return expand(space(push(p.value, after)), out, 0)
		}
		if p.required {
			break
		}
	}
	return out, nil
}

// expandArray: after '[' or an item, the array may close (enough items)
// or go on (not too many).
func expandArray(f *frame, out []*frame, depth int) ([]*frame, error) {
	n := f.n
	var err error
	if n.maxItems < 0 || int(f.k) < n.maxItems {
		item := push(n.items, space(with(f, 1, 0, f.k+1)))
		if f.k > 0 {
			item = push(commaNode, space(item))
		}
		if out, err = expand(item, out, depth); err != nil {
			return out, err
		}
	}
	if int(f.k) >= n.minItems {
		return expand(push(closeArray, f.up), out, depth)
	}
	return out, nil
}

var (
	commaNode   = Literal(",")
	colonNode   = Literal(":")
	closeObject = Literal("}")
	closeArray  = Literal("]")
	keyString   = stringNode()
)

// string states
const (
	strOpen = iota
	strBody
	strEscape
	strHex1 // strHex1..strHex4: the digits of \uXXXX
	strHex2
	strHex3
	strHex4
	strDone
	// strHexLow: after \uD of a counted string, whose second digit must
	// be 0-7: a surrogate (one character written as two escapes) would
	// make the count the validator's and the grammar's differ
	strHexLow
	// strTail: inside a counted string's multi-byte character, f.k the
	// index of its UTF-8 form (utf8Forms) and the byte's place in it
	// (form*4 + place): a counted string is well-formed UTF-8, each
	// character one (a stray byte would read as U+FFFD, one more)
	strTail
)

// number states: JSON's number grammar, with where it may end
const (
	numStart     = iota
	numMinus     // after '-'
	numInt       // in the integer digits (not after a leading 0)
	numZero      // after a leading 0
	numDot       // after '.'
	numFrac      // in the fraction digits
	numExp       // after 'e'
	numExpSign   // after the exponent's sign
	numExpDigits // in the exponent digits
)

var numCanEnd = [...]bool{numInt: true, numZero: true, numFrac: true, numExpDigits: true, numExpSign: false}

// step appends to out the stacks f becomes on byte c (none: f cannot
// take c).
func step(f *frame, c byte, out []*frame) ([]*frame, error) {
	n := f.n
	switch n.kind {
	case kLiteral:
		if n.lit[f.i] == c {
			return expand(with(f, 0, f.i+1, 0), out, 0)
		}
	case kLits:
		at := int(f.i)
		written := n.lits[f.k][:at]
		for q := int(f.k); q < len(n.lits) && strings.HasPrefix(n.lits[q], written); q++ {
			if len(n.lits[q]) > at && n.lits[q][at] == c {
				return expand(with(f, 0, int32(at+1), int32(q)), out, 0)
			}
		}
	case kSpace:
		if c == ' ' || c == '\n' || c == '\t' {
			return expand(with(f, 0, f.i+1, 0), out, 0)
		}
	case kString:
		return stepString(f, c, out)
	case kNumber, kInteger:
		return stepNumber(f, c, out)
	case kObject:
		if f.st == objKey {
			return stepKey(f, c, out)
		}
		if c == '{' && f.st == 0 {
			return expand(space(with(f, 1, 0, 0)), out, 0)
		}
	case kArray:
		if c == '[' {
			return expand(space(with(f, 1, 0, 0)), out, 0)
		}
	}
	return out, nil
}

// stepString takes byte c of a string. A plain string's body is one
// state; one with a length bound counts its characters in f.i (up to
// the larger bound: past the least, every count is the same), a byte
// that is not a UTF-8 continuation beginning one; one with a pattern
// keeps its DFA's state in f.k and takes no escapes.
func stepString(f *frame, c byte, out []*frame) ([]*frame, error) {
	n := f.n
	switch f.st {
	case strOpen:
		if c == '"' {
			return append(out, with(f, strBody, 0, n.pattern.start())), nil
		}
	case strBody:
		if c == '"' {
			if int(f.i) < n.minItems || !n.pattern.accepts(f.k) {
				return out, nil
			}
			return expand(f.up, out, 0)
		}
		if c < 0x20 || c == '\\' && n.pattern != nil {
			return out, nil
		}
		count := f.i
		if n.counts() && (c < 0x80 || c >= 0xC0) { // a character begins
			if n.maxItems >= 0 && int(count) >= n.maxItems {
				return out, nil
			}
			count = min(count+1, int32(max(n.minItems, n.maxItems)))
		}
		if n.pattern == nil && n.counts() && c >= 0x80 {
			// the first byte of a multi-byte character: its form's
			// next bytes follow (the count is taken here)
			for form, ranges := range utf8Forms {
				if ranges[0][0] <= c && c <= ranges[0][1] {
					return append(out, with(f, strTail, count, int32(form*4+1))), nil
				}
			}
			return out, nil
		}
		state := f.k
		if p := n.pattern; p != nil {
			// on only where the string can still end within its lengths
			room := p.limit
			if n.maxItems >= 0 {
				room = n.maxItems - int(count)
			}
			if state = p.next(state, c); state < 0 || !p.canEnd(state, n.minItems-int(count), room) {
				return out, nil
			}
		}
		switch {
		case c == '\\':
			return append(out, with(f, strEscape, count, state)), nil
		case count == f.i && state == f.k:
			return append(out, f), nil // the same state: shared, no copy
		}
		return append(out, with(f, strBody, count, state)), nil
	case strTail:
		form, place := utf8Forms[f.k/4], int(f.k%4)
		if c < form[place][0] || c > form[place][1] {
			return out, nil
		}
		if place+1 == len(form) {
			return append(out, with(f, strBody, f.i, 0)), nil
		}
		return append(out, with(f, strTail, f.i, f.k+1)), nil
	case strEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			return append(out, with(f, strBody, f.i, f.k)), nil
		case 'u':
			return append(out, with(f, strHex1, f.i, f.k)), nil
		}
	case strHex1, strHex2, strHex3, strHex4, strHexLow:
		if !isHex(c) || f.st == strHexLow && c > '7' {
			return out, nil
		}
		next := f.st + 1
		switch {
		case f.st == strHex1 && n.counts() && (c == 'd' || c == 'D'):
			next = strHexLow
		case f.st == strHexLow:
			next = strHex3
		case next == strDone:
			next = strBody
		}
		return append(out, with(f, next, f.i, f.k)), nil
	}
	return out, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func stepNumber(f *frame, c byte, out []*frame) ([]*frame, error) {
	digit := '0' <= c && c <= '9'
	n := f.n
	real := n.kind == kNumber
	to := func(st uint8, digits int32) ([]*frame, error) {
		if n.bounds == nil {
			return expand(with(f, st, digits, 0), out, 0)
		}
		// a bounded number: no exponent, and only bytes after which a
		// number within the bounds can still be written
		text := f.text + string(c)
		if st >= numExp || !n.bounds.reachable(text, st, !real) {
			return out, nil
		}
		next := newFrame(n, st, digits, 0, f.up)
		next.text = text
		return expand(next, out, 0)
	}
	switch f.st {
	case numStart, numMinus:
		switch {
		case c == '-' && f.st == numStart:
			return to(numMinus, 0)
		case c == '0':
			return to(numZero, 1)
		case digit:
			return to(numInt, 1)
		}
	case numInt, numZero:
		switch {
		case digit && f.st == numInt && f.i < maxIntDigits:
			return to(numInt, f.i+1)
		case c == '.' && real:
			return to(numDot, 0)
		case (c == 'e' || c == 'E') && real:
			return to(numExp, 0)
		}
	case numDot, numFrac:
		switch {
		case digit && f.i < maxFracDigits:
			return to(numFrac, f.i+1)
		case (c == 'e' || c == 'E') && f.st == numFrac:
			return to(numExp, 0)
		}
	case numExp:
		switch {
		case c == '+' || c == '-':
			return to(numExpSign, 0)
		case digit:
			return to(numExpDigits, 1)
		}
	case numExpSign, numExpDigits:
		if digit && f.i < maxExpDigits {
			return to(numExpDigits, f.i+1)
		}
	}
	return out, nil
}
