// Package procmem reports the process's peak resident memory, for the
// per-role memory figures of run summaries and benchmarks.
package procmem
