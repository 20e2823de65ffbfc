package align

import "github.com/odmoe/odmoe/internal/splitmix"

// PassToken names the tokens a forward pass fed, for a prediction's
// Token: the token itself when the pass has one row, otherwise a hash of
// every row's (sequence, token) that does not depend on the rows' order
// (alignments travel on streams of their own and may arrive in any
// order). The main node compares it with the tokens it fed to tell a
// prediction the shadow made running ahead on other tokens. Never
// negative: -1 means "not said".
func PassToken(seqs []uint64, tokens []int) int32 {
	if len(tokens) == 1 {
		return int32(tokens[0])
	}
	var sum uint64
	for i, s := range seqs {
		sum += splitmix.Mix(s ^ splitmix.Mix(uint64(tokens[i])+0x9e3779b97f4a7c15))
	}
	return int32(sum & 0x7fffffff)
}
