//go:build cuda

package mainnode_test

import (
	"fmt"
	"testing"

	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
)

// TestSwarmWithACUDAWorkerIsBitIdenticalToLocal: a swarm of four workers,
// the first on the GPU (cuda:0) and three on the CPU, generates local
// mode's tokens and logits bit for bit, loading on demand, predicted by a
// shadow, and resident. Needs a GPU.
func TestSwarmWithACUDAWorkerIsBitIdenticalToLocal(t *testing.T) {
	f := newSwarmFixture(t, 4)
	local, mainModel := loadModels(t, f)
	prompt := testPrompt(40, 37, 5, local.Config.VocabSize)
	const steps = 8
	want := generate(t, local, model.NewResidentExperts(local), prompt, steps)
	for _, policy := range []mainnode.Prefetch{mainnode.Reactive, mainnode.Random, mainnode.Resident} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			sw := dialSwarmOn(t, f, 4, 64<<20, []string{"cuda:0"}, mainnode.Options{Prefetch: policy}, nil)
			got := generate(t, mainModel, sw, prompt, steps)
			if d := diffGenerations(got, want); d != "" {
				t.Fatalf("swarm with a CUDA worker differs from local: %s", d)
			}
			checkSwarmStats(t, sw, policy, steps, len(mainModel.Config.ExpertLayers()))
		})
	}
}
