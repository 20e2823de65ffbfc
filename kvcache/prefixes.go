package kvcache

import (
	"slices"
	"sync"
)

// DefaultPrefixBytes is the budget a node's Prefixes have unless set
// (-prefix-cache): a few long conversations of a small model, one of a
// Mixtral-sized one (256 KiB of KV a token).
const DefaultPrefixBytes = 512 << 20

// Prefixes keeps the KV caches of finished sequences, so that a sequence
// whose tokens start with those of an earlier one (the same system
// prompt, the next turn of a chat, which repeats the history) starts from
// a copy of those rows instead of computing them again. A
// row depends only on the tokens up to it, and every kernel computes a
// row the same whether it ran in a prompt or alone, so a reused row is
// the row a prefill would compute, bit for bit. Entries are dropped
// least recently used first to stay within a budget of bytes. Safe for
// concurrent use.
type Prefixes struct {
	budget int64

	mu      sync.Mutex
	used    int64
	entries []*prefixEntry // least recently used first
}

// prefixEntry is one finished sequence: its tokens and their KV rows.
type prefixEntry struct {
	tokens []int
	cache  *Cache
}

// NewPrefixes returns a cache of at most budget bytes; nil (no cache) if
// budget <= 0. A nil *Prefixes keeps nothing and finds nothing.
func NewPrefixes(budget int64) *Prefixes {
	if budget <= 0 {
		return nil
	}
	return &Prefixes{budget: budget}
}

// Take returns a copy of the longest run of rows an entry shares with
// tokens (all of them, at most), in a cache with room for capacity
// positions, and how many rows it holds; nil and 0 when no entry shares a
// token.
func (p *Prefixes) Take(tokens []int, capacity int) (*Cache, int) {
	if p == nil || len(tokens) == 0 {
		return nil, 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	best, n := -1, 0
	for i, e := range p.entries {
		if k := CommonPrefix(e.tokens, tokens); k > n {
			best, n = i, k
		}
	}
	if best < 0 {
		return nil, 0
	}
	e := p.entries[best]
	c, err := e.cache.Prefix(n, capacity)
	if err != nil {
		return nil, 0 // the entry's rows are fewer than its tokens: cannot be, and costs only a prefill
	}
	p.entries = append(slices.Delete(p.entries, best, best+1), e) // most recently used
	return c, n
}

// Put keeps cache, whose rows are tokens', taking both over (the caller
// drops them). An entry whose tokens start the new ones goes (the new one
// holds all it did); tokens that start an entry's are not kept (it holds
// them already). The least recently used entries go until the budget
// holds; a cache larger than the whole budget is not kept.
func (p *Prefixes) Put(tokens []int, cache *Cache) {
	if p == nil || len(tokens) == 0 || cache.Len() < len(tokens) {
		return
	}
	size := cache.Bytes()
	if size > p.budget {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < len(p.entries); i++ {
		e := p.entries[i]
		switch k := CommonPrefix(e.tokens, tokens); {
		case k == len(tokens):
			p.entries = append(slices.Delete(p.entries, i, i+1), e) // nothing new: it is used again
			return
		case k == len(e.tokens):
			p.used -= e.cache.Bytes()
			p.entries = slices.Delete(p.entries, i, i+1)
			i--
		}
	}
	for len(p.entries) > 0 && p.used+size > p.budget {
		p.used -= p.entries[0].cache.Bytes()
		p.entries = slices.Delete(p.entries, 0, 1)
	}
	p.entries = append(p.entries, &prefixEntry{tokens: tokens, cache: cache})
	p.used += size
}

// CommonPrefix is how many leading tokens a and b share.
func CommonPrefix(a, b []int) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
