package align

import "fmt"

// Policy says when the main node re-aligns the shadow. A period of 1
// aligns every iteration, n every n-th, 0 never.
type Policy struct {
	TokenPeriod int // T: send the sampled token
	KVPeriod    int // K: send the KV rows written since the last KV alignment
}

// Validate refuses negative periods.
func (p Policy) Validate() error {
	if p.TokenPeriod < 0 || p.KVPeriod < 0 {
		return fmt.Errorf("align: periods must be >= 0 (0 = never), got token %d, KV %d", p.TokenPeriod, p.KVPeriod)
	}
	return nil
}

// TokenDue reports whether iteration it (1-based: the first generated
// token ends iteration 1) sends its token.
func (p Policy) TokenDue(it int64) bool { return due(p.TokenPeriod, it) }

// KVDue reports whether iteration it sends KV rows.
func (p Policy) KVDue(it int64) bool { return due(p.KVPeriod, it) }

func due(period int, it int64) bool { return period > 0 && it > 0 && it%int64(period) == 0 }

// String is the paper's name for the setting, e.g. "T1_KV4" ("T0" = never).
func (p Policy) String() string { return fmt.Sprintf("T%d_KV%d", p.TokenPeriod, p.KVPeriod) }
