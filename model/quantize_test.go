package model

import (
	"context"
	"math"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// TestQuantizedCopyOutlivesTheCheckpoint: the quantized copy owns all its
// memory, so the full-precision checkpoint can be unmapped once it is
// made (a shadow node then holds only its copy) and the copy computes the
// same logits as before.
func TestQuantizedCopyOutlivesTheCheckpoint(t *testing.T) {
	m, err := Load(tinyModel(t), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	qm, err := m.Quantized(kernels.Q8, nil)
	if err != nil {
		t.Fatal(err)
	}
	logits := func() []float32 {
		s := NewSession(qm, NewResidentExperts(qm), 0)
		out, err := s.Forward(context.Background(), testTokens)
		if err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out...)
	}
	before := logits()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	after := logits()
	for i := range before {
		if math.Float32bits(before[i]) != math.Float32bits(after[i]) {
			t.Fatalf("logit %d: %v before closing the checkpoint, %v after", i, before[i], after[i])
		}
	}
	if err := qm.Close(); err != nil {
		t.Fatal(err)
	}
}
