package shadow

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/wire"
	"github.com/rs/zerolog"
)

// TestAShadowBeyondItsMemRefusesToStart: a shadow (or a stage) whose
// quantized weights and one full-context sequence's KV cache pass its
// -mem refuses to start, before it quantizes or dials anything, with one
// line naming its layers, the shortfall and how many stages would fit;
// within its -mem it goes on (to dial its workers, here absent).
func TestAShadowBeyondItsMemRefusesToStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Generate(dir, synth.Options{Preset: "tiny", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	run := func(layers string, mem int64) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return Run(ctx, Config{Model: dir, Quant: kernels.Q8, Workers: []string{"127.0.0.1:1"}, Layers: layers, Stages: stagesFor(layers), Mem: mem,
			DialTimeout: time.Second, Wire: &wire.Config{Insecure: true, Name: "shadow", Role: wire.RoleShadow, Log: zerolog.Nop()}, Log: zerolog.Nop()})
	}
	err := run("", 4<<20)
	if err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a whole shadow in 4 MiB: %v", err)
	}
	for _, want := range []string{"layers 0-3 need", "-mem allows 4.0 MiB", "short", "as 4 stages of 1 layer each (-layers), the largest would need"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := run("2-3", 1<<20); err == nil || !strings.Contains(err.Error(), "layers 2-3 need") {
		t.Errorf("a stage in 1 MiB: %v", err)
	}
	if err := run("", 1<<30); err == nil || strings.Contains(err.Error(), "-mem") {
		t.Errorf("a whole shadow in 1 GiB should pass its -mem and fail only at its absent workers: %v", err)
	}
}

// stagesFor gives a first stage a stage to dial.
func stagesFor(layers string) []string {
	if strings.HasPrefix(layers, "0-") {
		return []string{"127.0.0.1:1"}
	}
	return nil
}
