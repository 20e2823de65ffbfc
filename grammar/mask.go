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
// its grammar's nodes), up to a number of masks: a mask is a bit a token
// (19 KB for Qwen3's vocabulary). Full, it starts again empty.
type MaskCache struct {
	mu    sync.Mutex
	limit int
	byKey map[string][]uint64
}

// NewMaskCache returns a cache of up to limit masks.
func NewMaskCache(limit int) *MaskCache {
	return &MaskCache{limit: max(limit, 1), byKey: map[string][]uint64{}}
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
	c.cache.mu.Lock()
	mask, ok := c.cache.byKey[string(key)]
	c.cache.mu.Unlock()
	if !ok {
		var err error
		if mask, err = c.walk(); err != nil {
			return nil, err
		}
		c.cache.mu.Lock()
		if len(c.cache.byKey) >= c.cache.limit {
			clear(c.cache.byKey)
		}
		c.cache.byKey[string(key)] = mask
		c.cache.mu.Unlock()
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
		c.states = []*frame{{n: endNode}}
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

// stepAll appends to out the stacks states become on byte c.
func stepAll(states []*frame, c byte, out []*frame) ([]*frame, error) {
	var err error
	for _, f := range states {
		if out, err = step(f, c, out); err != nil {
			return out, err
		}
	}
	out = dedupe(out)
	if len(out) > maxStacks {
		return out, fmt.Errorf("grammar: more than %d ways to read the output at once (an ambiguous schema)", maxStacks)
	}
	return out, nil
}

// dedupe drops repeated stacks (the same frames), keeping the first.
func dedupe(fs []*frame) []*frame {
	if len(fs) < 2 {
		return fs
	}
	out := fs[:1]
	for _, f := range fs[1:] {
		if !slices.ContainsFunc(out, func(g *frame) bool { return sameStack(f, g) }) {
			out = append(out, f)
		}
	}
	return out
}

func sameStack(a, b *frame) bool {
	for a != nil && b != nil {
		if a == b {
			return true
		}
		if a.n != b.n || a.st != b.st || a.i != b.i || a.k != b.k {
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
	if !slices.ContainsFunc(c.states, func(f *frame) bool { return f.n.kind != kString || f.st != strBody }) {
		copy(mask, v.plain)
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
// every stack, by node and position. A container's count of members
// goes in only as far as it changes what may come (the comma, minItems,
// maxItems), so that an array's every item does not make a state of
// its own.
func (c *Constraint) stateKey() []byte {
	k := binary.LittleEndian.AppendUint64(c.key[:0], c.g.id)
	for _, f := range c.states {
		for ; f != nil; f = f.up {
			count := f.k
			switch n := f.n; {
			case n.kind == kObject:
				count = min(count, 1)
			case n.kind == kArray && n.maxItems < 0:
				count = min(count, int32(max(n.minItems, 1)))
			}
			k = binary.LittleEndian.AppendUint64(k, uint64(uintptr(unsafe.Pointer(f.n))))
			k = append(k, f.st)
			k = binary.LittleEndian.AppendUint32(k, uint32(f.i))
			k = binary.LittleEndian.AppendUint32(k, uint32(count))
		}
		k = append(k, 0xff)
	}
	c.key = k
	return k
}
