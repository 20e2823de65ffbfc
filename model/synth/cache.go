package synth

import (
	"fmt"
	"os"
	"path/filepath"
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
// first if it is not complete. Generation goes to a private temporary
// directory renamed into place, so a crash or a concurrent generator
// never leaves a half-written model behind (whoever renames first wins).
func Cached(cache, preset string, seed uint64, progress func(done, total int64)) (string, error) {
	dir := filepath.Join(cache, "models", fmt.Sprintf("%s-seed%d", preset, seed))
	if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err == nil {
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
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "model.safetensors")); serr == nil {
			return dir, nil // another generator finished first
		}
		return "", fmt.Errorf("synth: %w", err)
	}
	return dir, nil
}
