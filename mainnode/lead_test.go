package mainnode_test

import (
	"testing"
	"time"

	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// TestPredictionLeadsAreRecordedForHintedLoads: with oracle-next every
// decode load is made on a hint sent before its activation, so each has a
// positive lead; reactive loads nothing on a hint, so none is recorded.
func TestPredictionLeadsAreRecordedForHintedLoads(t *testing.T) {
	f := newSwarmFixture(t, 2)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(8, 31, 2, local.Config.VocabSize)
	want := generate(t, local, model.NewResidentExperts(local), prompt, 6)
	for _, policy := range []mainnode.Prefetch{mainnode.OracleNext, mainnode.Reactive} {
		sw := dialSwarm(t, f, 2, mainnode.Options{Prefetch: policy}, nil)
		if d := diffGenerations(generate(t, mainModel, sw, prompt, 6), want); d != "" {
			t.Fatalf("%s: %s", policy, d)
		}
		st := sw.Stats()
		dec := mainnode.Total(st.Decode)
		switch policy {
		case mainnode.OracleNext:
			if int64(len(st.Leads)) != dec.Loads || dec.Loads == 0 {
				t.Fatalf("oracle-next: %d leads for %d decode loads", len(st.Leads), dec.Loads)
			}
			for _, l := range st.Leads {
				if l <= 0 || l > 10*time.Second {
					t.Fatalf("oracle-next lead %v", l)
				}
			}
			p5, p50, p95 := st.LeadPercentiles()
			if !(p5 <= p50 && p50 <= p95 && p5 > 0) {
				t.Fatalf("percentiles %v %v %v", p5, p50, p95)
			}
		case mainnode.Reactive:
			if len(st.Leads) != 0 {
				t.Fatalf("reactive: %d leads recorded, want none", len(st.Leads))
			}
		}
	}
}
