package align

import "fmt"

// Policy says when the main node re-aligns the shadow. A period of 1
// aligns every pass, n every n-th, 0 never.
type Policy struct {
	TokenPeriod int // T: send the sampled token
	KVPeriod    int // K: send the KV rows written since the last KV alignment
	// Adaptive: the periods are chosen online (Controller), the two above
	// being the longest allowed.
	Adaptive bool
}

// Validate refuses negative periods, and adaptive bounds under 1.
func (p Policy) Validate() error {
	if p.TokenPeriod < 0 || p.KVPeriod < 0 {
		return fmt.Errorf("align: periods must be >= 0 (0 = never), got token %d, KV %d", p.TokenPeriod, p.KVPeriod)
	}
	if p.Adaptive && (p.TokenPeriod < 1 || p.KVPeriod < 1) {
		return fmt.Errorf("align: adaptive periods are bounded by the token and KV periods, which must be >= 1, got token %d, KV %d", p.TokenPeriod, p.KVPeriod)
	}
	return nil
}

// TokenDue reports whether pass it (1-based: the first generated
// token ends pass 1) sends its token.
func (p Policy) TokenDue(it int64) bool { return due(p.TokenPeriod, it) }

// KVDue reports whether pass it sends KV rows.
func (p Policy) KVDue(it int64) bool { return due(p.KVPeriod, it) }

func due(period int, it int64) bool { return period > 0 && it > 0 && it%int64(period) == 0 }

// String is the paper's name for the setting, e.g. "T1_KV4" ("T0" =
// never); an adaptive one's bounds, e.g. "adaptive<=T1_KV16".
func (p Policy) String() string {
	s := fmt.Sprintf("T%d_KV%d", p.TokenPeriod, p.KVPeriod)
	if p.Adaptive {
		return "adaptive<=" + s
	}
	return s
}
