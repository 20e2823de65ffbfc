package mainnode_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/internal/inproc"
	"github.com/odmoe/odmoe/kernels"
	mainnode "github.com/odmoe/odmoe/main"
	"github.com/odmoe/odmoe/model"
)

// TestEveryFamilyOnTheSwarmIsBitIdenticalToLocal: each model family's
// tiny preset, on a swarm of workers (reactive, oracle-next) and driven by
// an int8 shadow, gives local mode's tokens and logits bit for bit, with
// top-k above the group size (a worker runs several experts of a layer).
func TestEveryFamilyOnTheSwarmIsBitIdenticalToLocal(t *testing.T) {
	for _, preset := range []string{"qwen3-moe-tiny", "olmoe-tiny", "qwen2-moe-tiny"} {
		t.Run(preset, func(t *testing.T) {
			f, err := inproc.Generate(context.Background(), t.TempDir(), preset, 21, 4)
			if err != nil {
				t.Fatal(err)
			}
			local, mainModel := loadModels(t, f)
			prompt := testPrompt(20, 29, 3, local.Config.VocabSize)
			const steps = 8
			want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
			for _, c := range []struct {
				policy mainnode.Prefetch
				shadow *shadowSpec
			}{
				{mainnode.Reactive, nil},
				{mainnode.OracleNext, nil},
				{mainnode.Shadow, &shadowSpec{quant: kernels.Q8}},
			} {
				t.Run(fmt.Sprint(c.policy), func(t *testing.T) {
					sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: c.policy, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, c.shadow)
					got := generate(t, mainModel, sw, prompt, steps)
					if d := diffGenerations(got, want); d != "" {
						t.Fatalf("%s on the swarm (%s) differs from local: %s", preset, c.policy, d)
					}
					if c.shadow != nil {
						st, ok := sw.ShadowStats(10e9)
						if !ok || st.Recall <= 0 {
							t.Fatalf("shadow recall %v (ok %v)", st.Recall, ok)
						}
						t.Logf("%s int8 shadow: recall %.4f", preset, st.Recall)
					}
				})
			}
		})
	}
}
