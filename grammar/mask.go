package grammar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// Vocabulary is a tokenizer's tokens as bytes, sorted so that tokens
// sharing a prefix are neighbours. It is built once per tokenizer and
// shared by every Constraint.
type Vocabulary struct {
	size int
	all  tokenList
	// inString are the tokens with a byte a string cannot take as it is
	// (a quote, a backslash, a control byte); plain, as a bitset, the
	// rest, which leave a string's body where it was
	inString tokenList
	plain    []uint64
	at       []int32 // id -> its position in all.order, -1 if absent
	eos      []int
	// upTo[k] are the plain tokens a counted string's body takes when
	// k more characters fit: well-formed UTF-8 from a character's start
	// (the last character may be cut short), of at most k characters;
	// the last is every such token (room for the longest)
	upTo     [][]uint64
	upToOnce sync.Once
	chars    []int32 // a plain token's characters; -1: not well-formed
}

// countedPlain returns the plain tokens a counted string's body takes
// with room for room more characters (room < 0: any number).
func (v *Vocabulary) countedPlain(room int) []uint64 {
	v.upToOnce.Do(v.countChars)
	if room < 0 || room >= len(v.upTo) {
		room = len(v.upTo) - 1
	}
	return v.upTo[room]
}

// countChars works out chars and upTo.
func (v *Vocabulary) countChars() {
	v.chars = make([]int32, v.size)
	longest := 0
	for id := range v.size {
		v.chars[id] = -1
		if v.plain[id>>6]&(1<<(id&63)) == 0 {
			continue
		}
		if n := utf8Chars(v.tokenBytesAt(id)); n >= 0 {
			v.chars[id] = int32(n)
			longest = max(longest, n)
		}
	}
	// a bitset a count, each the one before and its count's tokens
	byCount := make([][]int, longest+1)
	for id, n := range v.chars {
		if n >= 0 {
			byCount[n] = append(byCount[n], id)
		}
	}
	v.upTo = make([][]uint64, longest+1)
	for k := range v.upTo {
		v.upTo[k] = make([]uint64, (v.size+63)/64)
		if k > 0 {
			copy(v.upTo[k], v.upTo[k-1])
		}
		for _, id := range byCount[k] {
			v.upTo[k][id>>6] |= 1 << (id & 63)
		}
	}
}

// tokenBytesAt is token id's bytes.
func (v *Vocabulary) tokenBytesAt(id int) []byte {
	if at := v.at[id]; at >= 0 {
		return v.all.bytes[at]
	}
	return nil
}

// utf8Chars is the characters b begins (its bytes not continuation
// bytes) when b is well-formed UTF-8 from a character's start (its last
// character may be cut short), as a counted string's body takes bytes;
// -1 otherwise.
func utf8Chars(b []byte) int {
	n := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			n, i = n+1, i+1
			continue
		}
		form := slices.IndexFunc(utf8Forms, func(f [][2]byte) bool { return f[0][0] <= c && c <= f[0][1] })
		if form < 0 {
			return -1
		}
		n++
		for k, r := range utf8Forms[form] {
			if i+k == len(b) {
				return n // cut short: the rest comes in the next token
			}
			if b[i+k] < r[0] || b[i+k] > r[1] {
				return -1
			}
		}
		i += len(utf8Forms[form])
	}
	return n
}

// tokenList is tokens sorted by their bytes.
type tokenList struct {
	order []int32  // token ids in the order of their bytes
	bytes [][]byte // the bytes of order[i]
	lcp   []int    // the length of the prefix order[i] shares with order[i-1]
	// ends[off[i]+d-1] is the first position after i whose token does not
	// begin with order[i]'s first d bytes: where a walk that found those
	// bytes a dead end goes on
	ends []int32
	off  []int32
}

// NewVocabulary indexes a vocabulary of size ids: tokenBytes(id) is what
// a token adds to a text (nil or empty: it never may come, as special
// tokens), eos the ids that end a generation.
func NewVocabulary(size int, tokenBytes func(id int) []byte, eos []int) *Vocabulary {
	v := &Vocabulary{size: size, eos: slices.Clone(eos), plain: make([]uint64, (size+63)/64), at: make([]int32, size)}
	all := map[int32][]byte{}
	var ids, quoted []int32
	for id := range size {
		v.at[id] = -1
		b := tokenBytes(id)
		if len(b) == 0 || slices.Contains(eos, id) { // an end is never text
			continue
		}
		all[int32(id)] = b
		ids = append(ids, int32(id))
		if slices.ContainsFunc(b, func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' }) {
			quoted = append(quoted, int32(id))
		} else {
			v.plain[id>>6] |= 1 << (id & 63)
		}
	}
	v.all, v.inString = newTokenList(ids, all), newTokenList(quoted, all)
	for i, id := range v.all.order {
		v.at[id] = int32(i)
	}
	return v
}

func newTokenList(ids []int32, all map[int32][]byte) tokenList {
	l := tokenList{order: slices.Clone(ids)}
	slices.SortFunc(l.order, func(a, b int32) int {
		if c := bytes.Compare(all[a], all[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	n := len(l.order)
	l.bytes, l.lcp, l.off = make([][]byte, n), make([]int, n+1), make([]int32, n)
	for i, id := range l.order {
		l.bytes[i] = all[id]
		l.off[i] = int32(len(l.ends))
		l.ends = append(l.ends, make([]int32, len(l.bytes[i]))...)
		if i > 0 {
			prev, b := l.bytes[i-1], l.bytes[i]
			k := 0
			for k < len(prev) && k < len(b) && prev[k] == b[k] {
				k++
			}
			l.lcp[i] = k
		}
	}
	for i := n - 1; i >= 0; i-- {
		for d := 1; d <= len(l.bytes[i]); d++ {
			end := int32(i + 1)
			if i+1 < n && l.lcp[i+1] >= d {
				end = l.ends[l.off[i+1]+int32(d)-1]
			}
			l.ends[l.off[i]+int32(d)-1] = end
		}
	}
	return l
}

// MaskCache keeps the allowed set of each state grammars reach, for the
// constraints of any grammars over one vocabulary (a state's key names
// its grammar's nodes), up to a number of bytes: a mask is a bit a token
// (19 KB for Qwen3's vocabulary), a key some bytes a frame of the state's
// stacks. Full, it starts again empty; a mask that would take more than
// a quarter of it is not kept.
type MaskCache struct {
	mu          sync.Mutex
	limit, used int
	byKey       map[string][]uint64
}

// NewMaskCache returns a cache of up to limit bytes.
func NewMaskCache(limit int) *MaskCache {
	return &MaskCache{limit: limit, byKey: map[string][]uint64{}}
}

func (m *MaskCache) get(key []byte) ([]uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mask, ok := m.byKey[string(key)]
	return mask, ok
}

func (m *MaskCache) put(key []byte, mask []uint64) {
	cost := entryCost + len(key) + 8*len(mask)
	if cost > m.limit/4 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.byKey[string(key)]; ok {
		return
	}
	if m.used+cost > m.limit {
		clear(m.byKey)
		m.used = 0
	}
	m.byKey[string(key)] = mask
	m.used += cost
}

// GrammarCacheBytes and MaskCacheBytes are what a node keeps of compiled
// grammars and of their states' masks (a bit a token: 19 KB each for
// Qwen3's vocabulary).
const (
	GrammarCacheBytes = 64 << 20
	MaskCacheBytes    = 32 << 20
)

// entryCost is what a map entry costs beyond its key and value's bytes.
const entryCost = 64

// Grammars keeps compiled grammars' constraint makers by a key (their
// source), up to a number of bytes (the key's, and the grammar's twice:
// its nodes and its Spec once written), letting the oldest go first.
type Grammars struct {
	mu          sync.Mutex
	limit, used int
	byKey       map[string]*Constraints
	order       []string // oldest first
}

// NewGrammars returns a cache of up to limit bytes.
func NewGrammars(limit int) *Grammars {
	return &Grammars{limit: limit, byKey: map[string]*Constraints{}}
}

// Get returns what was kept under key.
func (k *Grammars) Get(key string) (*Constraints, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	cs, ok := k.byKey[key]
	return cs, ok
}

// Put keeps cs under key, unless it alone would take more than half the
// cache.
func (k *Grammars) Put(key string, cs *Constraints) {
	cost := grammarCost(key, cs)
	if cost > k.limit/2 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.byKey[key]; ok {
		return
	}
	for k.used+cost > k.limit && len(k.order) > 0 {
		old := k.order[0]
		k.order = k.order[1:]
		k.used -= grammarCost(old, k.byKey[old])
		delete(k.byKey, old)
	}
	k.byKey[key] = cs
	k.order = append(k.order, key)
	k.used += cost
}

func grammarCost(key string, cs *Constraints) int { return entryCost + len(key) + 2*cs.g.size }

// Bytes is what the kept grammars take, by the cache's count.
func (k *Grammars) Bytes() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.used
}

// Constraint keeps one generation inside a grammar (model.Constraint).
type Constraint struct {
	g      *Grammar
	v      *Vocabulary
	cache  *MaskCache
	states []*frame
	levels [][]*frame // scratch: the states after each byte of a token
	key    []byte
	text   []byte // what it has accepted, for errors
}

// Constraints makes the constraints of one grammar over one vocabulary.
type Constraints struct {
	g     *Grammar
	v     *Vocabulary
	cache *MaskCache
}

// For returns a maker of g's constraints over v, keeping masks in cache.
func For(g *Grammar, v *Vocabulary, cache *MaskCache) *Constraints {
	return &Constraints{g: g, v: v, cache: cache}
}

// New returns a constraint at the start of the grammar.
func (cs *Constraints) New() (*Constraint, error) {
	states, err := cs.g.start()
	if err != nil {
		return nil, err
	}
	return &Constraint{g: cs.g, v: cs.v, cache: cs.cache, states: states}, nil
}

// Complete reports whether the output so far is a whole text of the
// grammar.
func (c *Constraint) Complete() bool {
	return slices.ContainsFunc(c.states, func(f *frame) bool { return f.n.kind == kEnd })
}

// Allowed returns the tokens that may come next, as a bitset: those
// whose bytes the grammar can take, and the end-of-sequence tokens once
// it is complete.
func (c *Constraint) Allowed() ([]uint64, error) {
	key := c.stateKey()
	mask, ok := c.cache.get(key)
	if !ok {
		var err error
		if mask, err = c.walk(); err != nil {
			return nil, err
		}
		c.cache.put(key, mask)
	}
	if !c.Complete() {
		return mask, nil
	}
	withEOS := slices.Clone(mask)
	for _, id := range c.v.eos {
		withEOS[id>>6] |= 1 << (id & 63)
	}
	return withEOS, nil
}

// errNoWay: a token the grammar cannot take.
var errNoWay = errors.New("grammar: the output cannot go on this way")

// Spec is the grammar c keeps to (Grammar.Spec): what a model.Sampling
// carries to another node.
func (c *Constraint) Spec() ([]byte, error) { return c.g.Spec() }

// Accept moves past token id.
func (c *Constraint) Accept(id int) error {
	if slices.Contains(c.v.eos, id) {
		if !c.Complete() {
			return fmt.Errorf("grammar: end of sequence before the output is complete (after %q)", c.text)
		}
		c.states = []*frame{push(endNode, nil)}
		return nil
	}
	var tokenBytes []byte
	if id >= 0 && id < len(c.v.at) && c.v.at[id] >= 0 {
		tokenBytes = c.v.all.bytes[c.v.at[id]]
	}
	if len(tokenBytes) == 0 {
		return fmt.Errorf("grammar: token %d writes no text the grammar can take", id)
	}
	states := c.states
	for _, b := range tokenBytes {
		next, err := stepAll(states, b, nil)
		if err != nil {
			return err
		}
		if len(next) == 0 {
			return fmt.Errorf("%w: %q then %q", errNoWay, c.text, tokenBytes)
		}
		states = next
	}
	c.states = states
	c.text = append(c.text, tokenBytes...)
	return nil
}

// stepAll appends to out the stacks states become on byte c. Past
// maxStacks ways to read the output at once (an ambiguous schema), the
// later ones are let go: what the output may still become is then a
// part of what the grammar allows, never more, and a step costs at most
// maxStacks stacks' expansions.
func stepAll(states []*frame, c byte, out []*frame) ([]*frame, error) {
	var err error
	for _, f := range states {
		if out, err = step(f, c, out); err != nil {
			return out, err
		}
	}
	out = dedupe(out)
	if len(out) > maxStacks {
		clear(out[maxStacks:])
		out = out[:maxStacks]
	}
	return out, nil
}

// dedupe drops repeated stacks (the same frames), keeping the first.
func dedupe(fs []*frame) []*frame {
	if len(fs) < 2 {
		return fs
	}
	out := fs[:1]
	if len(fs) <= 16 {
		for _, f := range fs[1:] {
			if !slices.ContainsFunc(out, func(g *frame) bool { return sameStack(f, g) }) {
				out = append(out, f)
			}
		}
		return out
	}
	byHash := make(map[uint64][]*frame, len(fs))
	byHash[stackHash(fs[0])] = fs[:1:1]
	for _, f := range fs[1:] {
		h := stackHash(f)
		if slices.ContainsFunc(byHash[h], func(g *frame) bool { return sameStack(f, g) }) {
			continue
		}
		byHash[h] = append(byHash[h], f)
		out = append(out, f)
	}
	return out
}

func sameStack(a, b *frame) bool {
	for a != nil && b != nil {
		if a == b {
			return true
		}
		if a.n != b.n || a.st != b.st || a.i != b.i || a.k != b.k || a.text != b.text {
			return false
		}
		a, b = a.up, b.up
	}
	return a == b
}

// walk finds the tokens whose bytes the grammar can take from c's
// states. Inside a string's body, the tokens a string takes as they are
// need no walk.
func (c *Constraint) walk() ([]uint64, error) {
	v := c.v
	mask := make([]uint64, (v.size+63)/64)
	list := &v.all
	inBody := func(f *frame) bool {
		return f.n.kind == kString && f.st == strBody && f.n.pattern == nil
	}
	if !slices.ContainsFunc(c.states, func(f *frame) bool { return !inBody(f) }) {
		// every way is inside a string's body: the plain tokens it takes
		// are known without a walk (all of them, or, counted, those whose
		// characters fit), the rest are walked
		for _, f := range c.states {
			plain := v.plain
			if f.n.counts() {
				room := -1
				if f.n.maxItems >= 0 {
					room = f.n.maxItems - int(f.i)
				}
				plain = v.countedPlain(room)
			}
			for w := range mask {
				mask[w] |= plain[w]
			}
		}
		list = &v.inString
	}
	return mask, c.walkList(list, mask)
}

// walkList sets in mask the tokens of l the grammar can take: l in byte
// order, each token starting from the states its shared prefix with the
// one before reached, and skipping every token that begins with a prefix
// found a dead end.
func (c *Constraint) walkList(l *tokenList, mask []uint64) error {
	if len(c.levels) == 0 {
		c.levels = make([][]*frame, 1, 64)
	}
	c.levels[0] = c.states
	computed := 0 // levels[0..computed] hold the previous token's prefix
	for i := 0; i < len(l.order); i++ {
		b := l.bytes[i]
		d := min(l.lcp[i], computed)
		for ; d < len(b) && len(c.levels[d]) > 0; d++ {
			for len(c.levels) <= d+1 {
				c.levels = append(c.levels, nil)
			}
			next, err := stepAll(c.levels[d], b[d], c.levels[d+1][:0])
			if err != nil {
				return err
			}
			c.levels[d+1] = next
		}
		computed = d
		if len(c.levels[d]) == 0 {
			if d > 0 {
				i = int(l.ends[l.off[i]+int32(d)-1]) - 1 // every token with this prefix
			}
			continue
		}
		id := l.order[i]
		mask[id>>6] |= 1 << (id & 63)
	}
	return nil
}

// stateKey identifies c's states for the mask cache: every frame of
// every stack, by node and position (and a bounded number's digits). A container's count of members
// goes in only as far as it changes what may come (the comma, minItems,
// maxItems), so that an array's every item does not make a state of
// its own.
func (c *Constraint) stateKey() []byte {
	k := binary.LittleEndian.AppendUint64(c.key[:0], c.g.id)
	for _, f := range c.states {
		for ; f != nil; f = f.up {
			count := f.k
			switch n := f.n; {
			case n.kind == kObject && f.st != objKey:
				count = min(count, 1)
			case n.kind == kArray && n.maxItems < 0:
				count = min(count, int32(max(n.minItems, 1)))
			}
			k = binary.LittleEndian.AppendUint64(k, uint64(uintptr(unsafe.Pointer(f.n))))
			k = append(k, f.st)
			k = binary.LittleEndian.AppendUint32(k, uint32(f.i))
			k = binary.LittleEndian.AppendUint32(k, uint32(count))
			if f.text != "" { // a bounded number's digits so far
				k = binary.LittleEndian.AppendUint32(k, uint32(len(f.text)))
				k = append(k, f.text...)
			}
		}
		k = append(k, 0xff)
	}
	c.key = k
	return k
}
