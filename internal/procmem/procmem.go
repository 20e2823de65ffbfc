// Package procmem reports the process's resident memory, peak and
// current, for the per-role memory figures of run summaries and
// benchmarks and for tests that bound memory, and its CPU time, for the
// CPUs a benchmark kept busy.
package procmem
