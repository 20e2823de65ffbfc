//go:build race

package wire

// raceDetector: the race detector's shadow memory (several times the
// heap's, never given back) swamps what a test can read of RSS.
const raceDetector = true
