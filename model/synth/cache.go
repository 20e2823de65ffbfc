package synth

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CacheDir is where odmoe keeps generated models, stores and benchmark
// fixtures: $ODMOE_CACHE, or odmoe/ under the user cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv("ODMOE_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("synth: %w", err)
	}
	return filepath.Join(d, "odmoe"), nil
}

// Cached returns cache/models/PRESET-seedSEED, generating the model there
// first if it is not complete or was generated from another shape of the
// preset (an older odmoe's). Generation goes to a private temporary
// directory renamed into place, so a crash or a concurrent generator
// never leaves a half-written model behind (whoever renames first wins).
func Cached(cache, preset string, seed uint64, progress func(done, total int64)) (string, error) {
	dir := filepath.Join(cache, "models", fmt.Sprintf("%s-seed%d", preset, seed))
	p, ok := Presets[preset]
	if !ok {
		return "", fmt.Errorf("synth: unknown preset %q (have %s)", preset, strings.Join(PresetNames(), ", "))
	}
	want := stampOf(p, Options{Seed: seed})
	if current(dir, want) {
		return dir, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("synth: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".gen-")
	if err != nil {
		return "", fmt.Errorf("synth: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after a successful rename
	if err := Generate(tmp, Options{Preset: preset, Seed: seed, Progress: progress}); err != nil {
		return "", err
	}
	if _, err := os.Stat(dir); err == nil && !current(dir, want) {
		// a stale model: move it aside, then remove it
		aside := tmp + ".stale"
		if err := os.Rename(dir, aside); err == nil {
			defer os.RemoveAll(aside)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if current(dir, want) {
			return dir, nil // another generator finished first
		}
		return "", fmt.Errorf("synth: %w", err)
	}
	return dir, nil
}

// current says whether dir holds a complete model generated as want says.
func current(dir string, want stamp) bool {
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	if err != nil {
		return false
	}
	var got stamp
	return json.Unmarshal(b, &got) == nil && got == want
}
