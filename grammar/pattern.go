package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// A pattern is what a string with a JSON Schema "pattern" or "format"
// must match, compiled to a DFA over the string's bytes (as written
// between its quotes: such a string takes no escapes, so its bytes are
// its characters' UTF-8).
//
// The regular expressions read are a subset of ECMA-262's, as JSON
// Schema's patterns are written: literal characters, '.', classes
// ([a-z0-9_], [^...], of ASCII characters), \d \D \w \W \s \S and
// escaped punctuation, groups ((...) and (?:...)) with '|', the
// quantifiers * + ? {n} {n,} {n,m} (m at most maxRepeat), and ^ and $
// at the ends. A pattern without ^ may begin anywhere in the string, one
// without $ end anywhere (JSON Schema's patterns are not anchored).
// Anything else (backreferences, lookaround, lazy quantifiers, \b) is
// refused by name. What a JSON string can only hold escaped ('"', '\',
// control characters) is left out of classes and '.', and refused as a
// literal.
type pattern struct {
	*dfa
	// lens[s] has bit r set when a string in state s can end after r
	// more characters, r up to limit (lengthen sets it): so that no
	// byte leads where the string cannot end within its lengths
	lens  [][]uint64
	limit int
}

// lengthen works out lens for a string of minLen to maxLen characters
// (maxLen < 0: no bound). Past the longest bound, a path to an end that
// is longer than the automaton has states holds a loop, so lengths up to
// the least bound and the states' number more tell every case. It
// reports whether any string of those lengths matches.
func (p *pattern) lengthen(minLen, maxLen int) bool {
	p.limit = maxLen
	if maxLen < 0 {
		p.limit = minLen + len(p.trans) + 4
	}
	words := p.limit/64 + 1
	p.lens = make([][]uint64, len(p.trans))
	for s := range p.lens {
		p.lens[s] = make([]uint64, words)
	}
	// each state's distinct next states by a character's first byte (it
	// counts one) and by a continuation byte (it counts none)
	lead, cont := make([][]int32, len(p.trans)), make([][]int32, len(p.trans))
	for s, row := range p.trans {
		for c, t := range row {
			switch {
			case t < 0:
			case c >= 0x80 && c < 0xC0:
				if !slices.Contains(cont[s], t) {
					cont[s] = append(cont[s], t)
				}
			default:
				if !slices.Contains(lead[s], t) {
					lead[s] = append(lead[s], t)
				}
			}
		}
	}
	set := func(s, r int) bool {
		if p.lens[s][r/64]&(1<<(r%64)) != 0 {
			return false
		}
		p.lens[s][r/64] |= 1 << (r % 64)
		return true
	}
	has := func(s int32, r int) bool { return p.lens[s][r/64]&(1<<(r%64)) != 0 }
	for r := 0; r <= p.limit; r++ {
		for s := range p.trans {
			if r == 0 && p.accept[s] || r > 0 && slices.ContainsFunc(lead[s], func(t int32) bool { return has(t, r-1) }) {
				set(s, r)
			}
		}
		// a character's continuation bytes count nothing: to their fixed
		// point (a character has at most three)
		for changed := true; changed; {
			changed = false
			for s := range p.trans {
				if slices.ContainsFunc(cont[s], func(t int32) bool { return has(t, r) }) {
					changed = set(s, r) || changed
				}
			}
		}
	}
	return p.canEnd(0, max(minLen, 0), p.limit)
}

// canEnd reports whether a string in state s can end after from to to
// more characters.
func (p *pattern) canEnd(s int32, from, to int) bool {
	to = min(to, p.limit)
	for r := max(from, 0); r <= to; r++ {
		if p.lens[s][r/64]&(1<<(r%64)) != 0 {
			return true
		}
	}
	return false
}

// dfa is a pattern's automaton, shared by the strings that have the
// pattern (a format's by every schema that names it).
type dfa struct {
	source string
	trans  [][256]int32 // -1: no way on
	accept []bool
	nfa    int // the states of the NFA it was made from
}

// cost is what building d took, in grammar nodes (Limits.Nodes): its
// NFA's states and its own (each a 1 KiB row, some nodes' worth).
func (d *dfa) cost() int { return d.nfa + 8*len(d.trans) }

// formatDFAs are the formats' automata, each built once.
var formatDFAs sync.Map // source -> *dfa

// Limits on a pattern's automaton: a pattern past them is refused.
const (
	maxRepeat       = 64   // a counted quantifier's bound
	maxPatternNFA   = 4096 // NFA states
	maxPatternDFA   = 512  // DFA states
	maxPatternBytes = 1024 // a pattern's text
)

// start is the DFA's first state (0 without a pattern).
func (p *pattern) start() int32 { return 0 }

// accepts reports whether the string may end in state s.
func (p *pattern) accepts(s int32) bool { return p == nil || p.accept[s] }

// next is state s after byte c, or -1.
func (p *pattern) next(s int32, c byte) int32 { return p.trans[s][c] }

// compilePattern compiles an ECMA-262 pattern of the subset above.
func compilePattern(src string) (*pattern, error) {
	d, err := compileDFA(src)
	if err != nil {
		return nil, err
	}
	return &pattern{dfa: d}, nil
}

// formatDFA is a format's automaton, built on first use.
func formatDFA(src string) (*dfa, error) {
	if d, ok := formatDFAs.Load(src); ok {
		return d.(*dfa), nil
	}
	d, err := compileDFA(src)
	if err != nil {
		return nil, err
	}
	formatDFAs.Store(src, d)
	return d, nil
}

// compileDFA builds the automaton of an ECMA-262 pattern of the subset.
func compileDFA(src string) (*dfa, error) {
	if len(src) > maxPatternBytes {
		return nil, fmt.Errorf("a pattern of %d bytes, more than %d", len(src), maxPatternBytes)
	}
	b := &nfaBuilder{}
	p := &patternParser{src: src, b: b, top: true}
	frag, err := p.alternation()
	if err != nil {
		return nil, err
	}
	if p.pos < len(p.src) {
		return nil, p.errorf("unexpected %q", p.src[p.pos:p.pos+1])
	}
	if len(b.states) > maxPatternNFA {
		return nil, fmt.Errorf("the pattern %q needs more than %d automaton states (a limit of the server's)", src, maxPatternNFA)
	}
	return b.dfa(frag, src)
}

// nfa states: byte ranges to one state, or epsilon moves.
type nfaState struct {
	lo, hi byte // the range taken to `to` (when to >= 0)
	to     int
	eps    []int
}

type nfaBuilder struct{ states []nfaState }

// frag is a piece of NFA: its start state and its loose end (a state
// with no moves yet, to be joined on).
type frag struct{ start, end int }

func (b *nfaBuilder) state() int {
	b.states = append(b.states, nfaState{to: -1})
	return len(b.states) - 1
}

// ranges is one step over any of the byte ranges rs.
func (b *nfaBuilder) ranges(rs [][2]byte) frag {
	start, end := b.state(), b.state()
	for _, r := range rs {
		s := b.state()
		b.states[s].lo, b.states[s].hi, b.states[s].to = r[0], r[1], end
		b.states[start].eps = append(b.states[start].eps, s)
	}
	return frag{start, end}
}

// bytesOf is the literal bytes of one character.
func (b *nfaBuilder) bytesOf(text string) frag {
	f := b.empty()
	for i := 0; i < len(text); i++ {
		f = b.concat(f, b.ranges([][2]byte{{text[i], text[i]}}))
	}
	return f
}

func (b *nfaBuilder) empty() frag {
	s := b.state()
	return frag{s, s}
}

func (b *nfaBuilder) concat(x, y frag) frag {
	b.states[x.end].eps = append(b.states[x.end].eps, y.start)
	return frag{x.start, y.end}
}

func (b *nfaBuilder) alt(fs ...frag) frag {
	start, end := b.state(), b.state()
	for _, f := range fs {
		b.states[start].eps = append(b.states[start].eps, f.start)
		b.states[f.end].eps = append(b.states[f.end].eps, end)
	}
	return frag{start, end}
}

func (b *nfaBuilder) star(f frag) frag {
	start, end := b.state(), b.state()
	b.states[start].eps = append(b.states[start].eps, f.start, end)
	b.states[f.end].eps = append(b.states[f.end].eps, f.start, end)
	return frag{start, end}
}

// anyChar is any one character a JSON string holds unescaped: printable
// ASCII but '"' and '\', or the UTF-8 of any other character.
func (b *nfaBuilder) anyChar() frag { return b.charClass(asciiSet{}, true) }

// asciiSet is a set of ASCII characters.
type asciiSet [2]uint64

func (s *asciiSet) add(lo, hi byte) {
	for c := int(lo); c <= int(hi) && c < 128; c++ {
		s[c>>6] |= 1 << (c & 63)
	}
}

func (s asciiSet) has(c byte) bool { return c < 128 && s[c>>6]&(1<<(c&63)) != 0 }

// charClass is one character of set (ASCII), or, negated, one of every
// other character, non-ASCII ones included; never one a JSON string
// holds only escaped.
func (b *nfaBuilder) charClass(set asciiSet, negated bool) frag {
	var rs [][2]byte
	for i := 0x20; i <= 0x7f; i++ { // DEL too: JSON writes it as it is
		c := byte(i)
		if c == '"' || c == '\\' || set.has(c) == negated {
			continue
		}
		if len(rs) > 0 && rs[len(rs)-1][1] == c-1 {
			rs[len(rs)-1][1] = c
		} else {
			rs = append(rs, [2]byte{c, c})
		}
	}
	f := b.ranges(rs)
	if !negated {
		return f
	}
	// any other character: UTF-8's well-formed two, three and four byte
	// sequences (RFC 3629: no overlong forms, no surrogates, none past
	// U+10FFFF)
	forms := []frag{f}
	for _, form := range utf8Forms {
		seq := b.empty()
		for _, r := range form {
			seq = b.concat(seq, b.ranges([][2]byte{r}))
		}
		forms = append(forms, seq)
	}
	return b.alt(forms...)
}

// utf8Forms are RFC 3629's well-formed multi-byte sequences, byte range
// by byte range.
var utf8Forms = [][][2]byte{
	{{0xC2, 0xDF}, {0x80, 0xBF}},
	{{0xE0, 0xE0}, {0xA0, 0xBF}, {0x80, 0xBF}},
	{{0xE1, 0xEC}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xED, 0xED}, {0x80, 0x9F}, {0x80, 0xBF}},
	{{0xEE, 0xEF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF0, 0xF0}, {0x90, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF1, 0xF3}, {0x80, 0xBF}, {0x80, 0xBF}, {0x80, 0xBF}},
	{{0xF4, 0xF4}, {0x80, 0x8F}, {0x80, 0xBF}, {0x80, 0xBF}},
}

// copyFrag copies f, whose states are from..to-1 (a quantifier repeats
// a piece).
func (b *nfaBuilder) copyFrag(f frag, from, to int) frag {
	shift := len(b.states) - from
	for i := from; i < to; i++ {
		s := b.states[i]
		c := nfaState{lo: s.lo, hi: s.hi, to: s.to}
		if s.to >= 0 {
			c.to = s.to + shift
		}
		for _, e := range s.eps {
			c.eps = append(c.eps, e+shift)
		}
		b.states = append(b.states, c)
	}
	return frag{f.start + shift, f.end + shift}
}

// dfa builds the DFA of f by subsets.
func (b *nfaBuilder) dfa(f frag, src string) (*dfa, error) {
	seen := make([]int, len(b.states)) // closure's marks: the pass that saw each state
	pass := 0
	closure := func(set []int) []int {
		pass++
		stack := slices.Clone(set)
		var out []int
		for len(stack) > 0 {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[s] == pass {
				continue
			}
			seen[s] = pass
			// only the states that take a byte, and the end, tell one
			// set from another: the rest only lead to them
			if b.states[s].to >= 0 || s == f.end {
				out = append(out, s)
			}
			stack = append(stack, b.states[s].eps...)
		}
		slices.Sort(out)
		return out
	}
	var buf []byte
	key := func(set []int) string {
		buf = buf[:0]
		for _, s := range set {
			buf = append(buf, byte(s), byte(s>>8), byte(s>>16))
		}
		return string(buf)
	}
	p := &dfa{source: src, nfa: len(b.states)}
	index := map[string]int32{}
	var sets [][]int
	add := func(set []int) int32 {
		k := key(set)
		if i, ok := index[k]; ok {
			return i
		}
		i := int32(len(sets))
		index[k] = i
		sets = append(sets, set)
		p.trans = append(p.trans, [256]int32{})
		p.accept = append(p.accept, slices.Contains(set, f.end))
		return i
	}
	add(closure([]int{f.start}))
	var to [256][]int
	for i := 0; i < len(sets); i++ {
		if len(sets) > maxPatternDFA {
			return nil, fmt.Errorf("the pattern %q needs more than %d automaton states (a limit of the server's)", src, maxPatternDFA)
		}
		// the states each byte moves to; bytes moving to the same ones
		// (a class's) share one closure
		for c := range to {
			to[c] = to[c][:0]
		}
		for _, s := range sets[i] {
			if st := b.states[s]; st.to >= 0 {
				for c := int(st.lo); c <= int(st.hi); c++ {
					to[c] = append(to[c], st.to)
				}
			}
		}
		byTargets := map[string]int32{}
		for c := range 256 {
			if len(to[c]) == 0 {
				p.trans[i][c] = -1
				continue
			}
			k := key(to[c])
			next, ok := byTargets[k]
			if !ok {
				next = add(closure(slices.Clone(to[c])))
				byTargets[k] = next
			}
			p.trans[i][c] = next
		}
	}
	return p, nil
}

// patternParser reads the subset by recursive descent.
type patternParser struct {
	src string
	pos int
	b   *nfaBuilder
	// top: the next sequence is one of the pattern's own alternatives,
	// which may begin with ^ and end with $ (each alternative anchored
	// or not on its own, as ECMA-262 reads ^a|b); inside a group they are
	// refused
	top bool
}

func (p *patternParser) errorf(format string, args ...any) error {
	return fmt.Errorf("the pattern %q at byte %d: %s", p.src, p.pos, fmt.Sprintf(format, args...))
}

func (p *patternParser) peek() byte {
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

func (p *patternParser) alternation() (frag, error) {
	var alts []frag
	top := p.top
	for {
		p.top = top
		f, err := p.sequence()
		if err != nil {
			return frag{}, err
		}
		alts = append(alts, f)
		if p.peek() != '|' {
			break
		}
		p.pos++
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return p.b.alt(alts...), nil
}

func (p *patternParser) sequence() (frag, error) {
	top := p.top
	p.top = false // what it holds is nested
	defer func() { p.top = top }()
	anchoredStart := top && p.peek() == '^'
	if anchoredStart {
		p.pos++
	}
	anchoredEnd := false
	f := p.b.empty()
	for p.pos < len(p.src) && p.peek() != '|' && p.peek() != ')' {
		if top && p.peek() == '$' && (p.pos+1 == len(p.src) || p.src[p.pos+1] == '|') {
			anchoredEnd = true
			p.pos++
			break
		}
		from := len(p.b.states)
		atom, err := p.atom()
		if err != nil {
			return frag{}, err
		}
		if atom, err = p.quantified(atom, from); err != nil {
			return frag{}, err
		}
		f = p.b.concat(f, atom)
		if len(p.b.states) > maxPatternNFA {
			return frag{}, p.errorf("more than %d automaton states (a limit of the server's)", maxPatternNFA)
		}
	}
	if top && !anchoredStart { // JSON Schema's patterns are not anchored
		f = p.b.concat(p.b.star(p.b.anyChar()), f)
	}
	if top && !anchoredEnd {
		f = p.b.concat(f, p.b.star(p.b.anyChar()))
	}
	return f, nil
}

// quantified applies the quantifier after atom, if any; atom's states
// are those from index from on.
func (p *patternParser) quantified(atom frag, from int) (frag, error) {
	least, most := 1, 1
	switch p.peek() {
	case '*':
		least, most = 0, -1
	case '+':
		least, most = 1, -1
	case '?':
		least, most = 0, 1
	case '{':
		end := strings.IndexByte(p.src[p.pos:], '}')
		if end < 0 {
			return frag{}, p.errorf("a '{' without '}' (write \\{ for the character)")
		}
		body := p.src[p.pos+1 : p.pos+end]
		lo, hi, comma := strings.Cut(body, ",")
		digits := func(t string) bool { return t != "" && strings.Trim(t, "0123456789") == "" }
		if !digits(lo) || comma && hi != "" && !digits(hi) {
			return frag{}, p.errorf("a quantifier {%s}: want {n}, {n,} or {n,m} of digits (write \\{ for the character)", body)
		}
		var err error
		if least, err = strconv.Atoi(lo); err != nil || least < 0 {
			return frag{}, p.errorf("a quantifier {%s}: want {n}, {n,} or {n,m}", body)
		}
		switch {
		case !comma:
			most = least
		case hi == "":
			most = -1
		default:
			if most, err = strconv.Atoi(hi); err != nil || most < least {
				return frag{}, p.errorf("a quantifier {%s}: want {n}, {n,} or {n,m} with m >= n", body)
			}
		}
		if least > maxRepeat || most > maxRepeat {
			return frag{}, p.errorf("a quantifier {%s} past %d (a limit of the server's)", body, maxRepeat)
		}
		p.pos += end
	default:
		return atom, nil
	}
	p.pos++
	if p.peek() == '?' || p.peek() == '+' {
		return frag{}, p.errorf("lazy and possessive quantifiers are not supported")
	}
	// the copies first: joining a piece on changes its end state
	b, to := p.b, len(p.b.states)
	need := max(least, most)
	if most < 0 {
		need = least + 1 // then one under a star
	}
	if need == 0 {
		return b.empty(), nil
	}
	if len(b.states)+(need-1)*(to-from) > maxPatternNFA {
		return frag{}, p.errorf("more than %d automaton states (a limit of the server's)", maxPatternNFA)
	}
	pieces := []frag{atom}
	for len(pieces) < need {
		pieces = append(pieces, b.copyFrag(atom, from, to))
	}
	f := b.empty()
	for i, piece := range pieces {
		switch {
		case i < least:
			f = b.concat(f, piece)
		case most < 0:
			f = b.concat(f, b.star(piece))
		default:
			f = b.concat(f, b.alt(piece, b.empty()))
		}
	}
	return f, nil
}

func (p *patternParser) atom() (frag, error) {
	c := p.peek()
	switch c {
	case '(':
		p.pos++
		if strings.HasPrefix(p.src[p.pos:], "?:") {
			p.pos += 2
		} else if p.peek() == '?' {
			return frag{}, p.errorf("lookaround and named groups are not supported")
		}
		p.top = false
		f, err := p.alternation()
		if err != nil {
			return frag{}, err
		}
		if p.peek() != ')' {
			return frag{}, p.errorf("a '(' without ')'")
		}
		p.pos++
		return f, nil
	case '[':
		return p.class()
	case '.':
		p.pos++
		return p.b.anyChar(), nil
	case '\\':
		return p.escape(false, nil)
	case '*', '+', '?', '{':
		return frag{}, p.errorf("a quantifier %q with nothing before it", c)
	case '^', '$':
		return frag{}, p.errorf("%q only at the pattern's ends is supported", c)
	case ')':
		return frag{}, p.errorf("a ')' without '('")
	}
	r, size := utf8.DecodeRuneInString(p.src[p.pos:])
	if r == utf8.RuneError && size <= 1 {
		return frag{}, p.errorf("not UTF-8")
	}
	if r == '"' || r < 0x20 {
		return frag{}, p.errorf("%q is written escaped in a JSON string: a pattern that needs it is not supported", r)
	}
	p.pos += size
	return p.b.bytesOf(string(r)), nil
}

// classEscapes are \d, \w, \s as ASCII sets (\s: the space alone, the
// other white space being escaped in JSON).
var classEscapes = map[byte]asciiSet{}

func init() {
	var d, w, s asciiSet
	d.add('0', '9')
	w.add('0', '9')
	w.add('a', 'z')
	w.add('A', 'Z')
	w.add('_', '_')
	s.add(' ', ' ')
	classEscapes['d'], classEscapes['w'], classEscapes['s'] = d, w, s
}

// escape reads a backslash escape: in a class (set non-nil) it adds to
// set; outside, it is an atom.
func (p *patternParser) escape(inClass bool, set *asciiSet) (frag, error) {
	p.pos++ // the backslash
	if p.pos >= len(p.src) {
		return frag{}, p.errorf("a pattern that ends in a backslash")
	}
	c := p.src[p.pos]
	p.pos++
	lower := c | 0x20
	if cls, ok := classEscapes[lower]; ok && (c == lower || c == 'D' || c == 'W' || c == 'S') {
		negated := c != lower
		if inClass {
			if negated {
				return frag{}, p.errorf(`\%c inside a class is not supported`, c)
			}
			set[0] |= cls[0]
			set[1] |= cls[1]
			return frag{}, nil
		}
		return p.b.charClass(cls, negated), nil
	}
	var lit byte
	switch {
	case strings.IndexByte(`.^$|?*+()[]{}/-,:=!<>#&~%@;'`+"`", c) >= 0:
		lit = c
	case c == '\\':
		return frag{}, p.errorf(`'\' is written escaped in a JSON string: a pattern that needs it is not supported`)
	default:
		return frag{}, p.errorf(`the escape \%c is not supported`, c)
	}
	if inClass {
		set.add(lit, lit)
		return frag{}, nil
	}
	return p.b.bytesOf(string(lit)), nil
}

func (p *patternParser) class() (frag, error) {
	p.pos++ // '['
	negated := p.peek() == '^'
	if negated {
		p.pos++
	}
	var set asciiSet
	first := true
	for {
		if p.pos >= len(p.src) {
			return frag{}, p.errorf("a '[' without ']'")
		}
		c := p.src[p.pos]
		if c == ']' && !first {
			p.pos++
			break
		}
		first = false
		var lo byte
		switch {
		case c == '\\':
			at := p.pos
			if _, err := p.escape(true, &set); err != nil {
				return frag{}, err
			}
			if p.peek() != '-' || p.pos+1 >= len(p.src) || p.src[p.pos+1] == ']' {
				continue
			}
			if e := p.src[at+1]; classEscapes[e|0x20] != (asciiSet{}) {
				continue // \d-... : the '-' is a character
			}
			lo = p.src[at+1]
		case c >= 0x80:
			return frag{}, p.errorf("a class of non-ASCII characters is not supported")
		default:
			lo = c
			p.pos++
		}
		if p.peek() == '-' && p.pos+1 < len(p.src) && p.src[p.pos+1] != ']' {
			p.pos++
			hi := p.src[p.pos]
			if hi == '\\' && p.pos+1 < len(p.src) {
				hi = p.src[p.pos+1]
				if classEscapes[hi|0x20] != (asciiSet{}) {
					return frag{}, p.errorf(`a class escape \%c cannot end a range`, hi)
				}
				p.pos++
			}
			if hi >= 0x80 || hi < lo {
				return frag{}, p.errorf("a class range %q-%q", lo, hi)
			}
			p.pos++
			set.add(lo, hi)
			continue
		}
		set.add(lo, lo)
	}
	return p.b.charClass(set, negated), nil
}

// formats are the string formats a schema may name, as patterns of the
// subset: RFC 3339's date, time and date-time (days as each month has
// them, February's 29th in leap years), RFC 4122's uuid, email addresses
// of the common form (a dot-separated local part of letters, digits and
// _%+-, a domain of dot-separated labels), dotted IPv4 addresses, host
// names of RFC 1123 labels, and URIs of RFC 3986's common forms (a scheme,
// an authority of a host name and a port, or a path alone; a query and a
// fragment), each within what Go's validators (net/url, net/mail) take.
var formats = map[string]string{
	"date":      "^" + datePattern + "$",
	"time":      "^" + timePattern + "$",
	"date-time": "^" + datePattern + "T" + timePattern + "$",
	"uuid":      "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
	// a local part of at most 64 characters (30, then up to two dotted
	// parts of 16)
	"email":    "^[A-Za-z0-9_%+-]{1,30}(\\.[A-Za-z0-9_%+-]{1,16}){0,2}@" + label + "(\\." + label + ")*\\.[A-Za-z]{2,24}$",
	"ipv4":     "^" + octet + "(\\." + octet + "){3}$",
	"hostname": "^" + label + "(\\." + label + ")*$",
	// a scheme, then an authority (a host name and a port of digits)
	// and a path, or a path alone; a query and a fragment
	"uri": "^[A-Za-z][A-Za-z0-9+.-]*:(//" + label + "(\\." + label + ")*(:[0-9]{1,5})?(/" + pchar + "*)*|" + pchar + "+(/" + pchar + "*)*)(\\?(" + pchar + "|[/?])*)?(#(" + pchar + "|[/?])*)?$",
}

// formatLengths are the longest strings formats allow beside their
// patterns: an address's 254 characters (RFC 5321's path), a host name's
// 253 (RFC 1035)
var formatLengths = map[string]int{"email": 254, "hostname": 253}

const (
	label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
	octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
	// pchar is a URI path's character: RFC 3986's unreserved and
	// sub-delims, ':' and '@', or a percent-encoded byte
	pchar = "([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})"
	// a year, and a month and a day that it has
	datePattern = "(\\d{4}-(0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])" +
		"|\\d{4}-(0[469]|11)-(0[1-9]|[12]\\d|30)" +
		"|\\d{4}-02-(0[1-9]|1\\d|2[0-8])" +
		"|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
	timePattern = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
)
