package model

import (
	"math/rand/v2"
	"sync/atomic"
)

// Step names one forward pass: pass Pass of sequence Seq. Passes
// are numbered as OD-MoE numbers them: 1 is the prompt (prefill), i+1 the
// pass that feeds the i-th generated token. The Session that runs a pass
// is the one place that counts them; everything below it (routing hooks,
// the expert runner, the wire) is handed the step.
type Step struct {
	Seq  uint64
	Pass int64
}

// lastSeq hands every Session of this process its own sequence id. It
// starts at a random point so that a restarted main node does not reuse
// the ids its predecessor used with the same workers.
var lastSeq atomic.Uint64

func init() { lastSeq.Store(rand.Uint64() >> 1) }

func nextSeq() uint64 { return lastSeq.Add(1) }
