// Package passes decides what each forward pass of the main node's pass
// loop carries (the way llama.cpp's server slots and vLLM's scheduler
// decide a batch): every running sequence's next decode step, and chunks
// of the prompts still being fed, up to a budget of prompt tokens per
// pass, so that no running sequence waits for a whole long prompt and the
// workers see one stream of passes. It is pure: no clock, no socket, no
// model; scenario tests drive it (passes_test.go).
package passes

// DefaultChunk is the prompt tokens a pass carries by default. On the
// small preset (2 threads, local mode) with 3 clients sending one-token
// requests and a 1024-token prompt joining, the slowest request that
// overlapped the join took 0.20-0.22 of the joiner's time longer than
// their median at 128, 0.07-0.11 at 64 and 0.43-0.50 at 256; each chunk
// is one more pass over the weights, which a lone long prompt pays
// (docs/BENCHMARKS.md, "Chunked prompts").
const DefaultChunk = 128

// Seq is a sequence as the scheduler sees it before a pass, in the order
// the sequences arrived.
type Seq struct {
	// PromptLeft is how many prompt tokens it has still to feed; 0: it
	// decodes (feeds its last sampled token).
	PromptLeft int
}

// Row is what one sequence feeds in a pass.
type Row struct {
	Seq    int // its index in the pass's seqs
	Tokens int // how many tokens: 1 in decode, a chunk of its prompt
	Prompt bool
	// Last marks the chunk that ends its prompt: the pass's logits of
	// its last row give its first token.
	Last bool
}

// Budget bounds a pass.
type Budget struct {
	// Chunk is the most prompt tokens one pass carries, over all its
	// prompts; 0 or less: every prompt goes in whole.
	Chunk int
}

// Next appends to rows the next pass over seqs and returns it: every
// decoding sequence feeds its token, and the prompt budget is shared
// among the prompts max-min fairly (water-filling: each gets an equal
// share, and what a prompt needs less than its share goes to the
// others; shares round up, smallest need first), so a short prompt that arrives while a long one is being fed
// goes in whole in the next pass instead of waiting behind it, and no
// prompt starves. Rows come in seqs' order. A pass is empty only when
// seqs is.
func Next(rows []Row, seqs []Seq, b Budget) []Row {
	first := len(rows)
	prompts := 0
	for i, s := range seqs {
		switch {
		case s.PromptLeft <= 0:
			rows = append(rows, Row{Seq: i, Tokens: 1})
		case b.Chunk <= 0:
			rows = append(rows, Row{Seq: i, Tokens: s.PromptLeft, Prompt: true, Last: true})
		default:
			rows = append(rows, Row{Seq: i, Prompt: true}) // its share comes below
			prompts++
		}
	}
	if b.Chunk <= 0 || prompts == 0 {
		return rows
	}
	// water-filling over the prompts, smallest need first (then oldest)
	left := b.Chunk
	for k := prompts; k > 0 && left > 0; k-- {
		pick := -1
		for j := first; j < len(rows); j++ {
			if r := rows[j]; r.Prompt && r.Tokens == 0 && (pick < 0 || seqs[r.Seq].PromptLeft < seqs[rows[pick].Seq].PromptLeft) {
				pick = j
			}
		}
		need := seqs[rows[pick].Seq].PromptLeft
		give := min(need, (left+k-1)/k) // its share, rounded up

		rows[pick].Tokens, rows[pick].Last = give, give == need
		left -= give
	}
	// prompts the budget did not reach wait for the next pass
	kept := rows[:first]
	for _, r := range rows[first:] {
		if r.Tokens > 0 {
			kept = append(kept, r)
		}
	}
	return kept
}
