package tokenizer

import (
	"sync"
	"unicode/utf8"
)

// bpe is the BPE model of tokenizers (models/bpe): a word is split into
// characters (or their byte-fallback tokens) and merged pair by pair,
// lowest merge rank first.
type bpe struct {
	vocab        map[string]int
	merges       map[uint64]mergeRule // key: pairKey(left, right)
	byteIDs      [256]int             // "<0xXX>" ids, -1 if absent
	unkID        int                  // -1: unknown characters are dropped
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	// maxCover is the most bytes of a word one token covers (its
	// longest vocabulary string: a prefix or suffix only adds to it); 0:
	// no bound (fused unknown characters)
	maxCover int

	mu    sync.Mutex
	cache map[string][]int
}

// mergeRule is the result of merging a pair and its priority.
type mergeRule struct {
	rank int32
	id   int32
}

const (
	// Words shorter than cacheMaxWordBytes are cached, up to
	// cacheMaxWords of them (tokenizers uses the same limits).
	cacheMaxWordBytes = 256
	cacheMaxWords     = 10000
)

func pairKey(a, b int) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// atLeast is a lower bound on the ids of word, found without merging it:
// every token covers at most maxCover of its bytes.
func (m *bpe) atLeast(word string) int {
	if m.maxCover == 0 {
		return 0
	}
	return (len(word) + m.maxCover - 1) / m.maxCover
}

// tokenize appends the ids of word to ids.
func (m *bpe) tokenize(word string, ids []int) []int {
	if word == "" {
		return ids
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(ids, id)
		}
	}
	if len(word) >= cacheMaxWordBytes {
		return m.mergeWord(word, ids)
	}
	m.mu.Lock()
	hit, ok := m.cache[word]
	m.mu.Unlock()
	if ok {
		return append(ids, hit...)
	}
	n := len(ids)
	ids = m.mergeWord(word, ids)
	m.mu.Lock()
	if m.cache == nil {
		m.cache = make(map[string][]int)
	}
	if len(m.cache) < cacheMaxWords {
		m.cache[word] = append([]int(nil), ids[n:]...)
	}
	m.mu.Unlock()
	return ids
}

// symbol is one element of a word being merged: a doubly linked list
// over a slice, as tokenizers' Word.
type symbol struct {
	id         int32
	prev, next int32
	size       int32 // bytes of the word it covers; 0 once merged away
}

// mergeWord appends the BPE encoding of word to ids.
func (m *bpe) mergeWord(word string, ids []int) []int {
	syms := make([]symbol, 0, len(word))
	add := func(id, size int) {
		n := int32(len(syms))
		if n > 0 {
			syms[n-1].next = n
		}
		syms = append(syms, symbol{id: int32(id), prev: n - 1, next: -1, size: int32(size)})
	}
	unk, unkSize := -1, 0
	for i := 0; i < len(word); {
		_, size := utf8.DecodeRuneInString(word[i:])
		s := word[i : i+size]
		if (m.prefix != "" && i > 0) || (m.suffix != "" && i+size == len(word)) {
			if i > 0 {
				s = m.prefix + s
			}
			if i+size == len(word) {
				s += m.suffix
			}
		}
		i += size
		if id, ok := m.vocab[s]; ok {
			if unk >= 0 {
				add(unk, unkSize)
				unk = -1
			}
			add(id, size)
			continue
		}
		if m.byteFallback && m.hasBytes(s) {
			// tokenizers adds the byte tokens without flushing a
			// pending unknown first; keep that order.
			for k := 0; k < len(s); k++ {
				add(m.byteIDs[s[k]], 1)
			}
			continue
		}
		if m.unkID < 0 {
			continue
		}
		switch {
		case unk >= 0 && m.fuseUnk:
			unkSize += size
		case unk >= 0:
			add(unk, unkSize)
			unk, unkSize = m.unkID, size
		default:
			unk, unkSize = m.unkID, size
		}
	}
	if unk >= 0 {
		add(unk, unkSize)
	}
	m.mergeAll(syms)
	for _, s := range syms {
		if s.size != 0 {
			ids = append(ids, int(s.id))
		}
	}
	return ids
}

func (m *bpe) hasBytes(s string) bool {
	for k := 0; k < len(s); k++ {
		if m.byteIDs[s[k]] < 0 {
			return false
		}
	}
	return true
}

// mergeAll applies merges to syms in rank order (ties: leftmost first),
// exactly as tokenizers' Word::merge_all without dropout.
func (m *bpe) mergeAll(syms []symbol) {
	if len(syms) < 2 || len(m.merges) == 0 {
		return
	}
	h := make(minHeap[mergeItem], 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if r, ok := m.merges[pairKey(int(syms[i].id), int(syms[i+1].id))]; ok {
			h.push(mergeItem{rank: r.rank, pos: int32(i), id: r.id})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next == -1 {
			continue
		}
		next := cur.next
		right := syms[next]
		// Skip queue entries made stale by earlier merges: tokenizers
		// compares only the merged id, so do we.
		if r, ok := m.merges[pairKey(int(cur.id), int(right.id))]; !ok || r.id != top.id {
			continue
		}
		cur.id = top.id
		cur.size += right.size
		cur.next = right.next
		syms[next].size = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if r, ok := m.merges[pairKey(int(syms[cur.prev].id), int(cur.id))]; ok {
				h.push(mergeItem{rank: r.rank, pos: cur.prev, id: r.id})
			}
		}
		if cur.next >= 0 {
			if r, ok := m.merges[pairKey(int(cur.id), int(syms[cur.next].id))]; ok {
				h.push(mergeItem{rank: r.rank, pos: top.pos, id: r.id})
			}
		}
	}
}

// mergeItem is a candidate merge of the symbol at pos with its next.
type mergeItem struct {
	rank, pos, id int32
}

//lint:ignore U1000 used through minHeap's type constraint
func (a mergeItem) less(b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}
