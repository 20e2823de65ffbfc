// Package worker is the worker role: it owns a device-memory budget
// (Arena), loads the compressed experts it is told to load just in time
// (from a store, decompressed into its own memory, paced to emulate a
// host-to-device link), computes them on the hidden states the main node
// sends with exactly the code local mode runs (model.Expert.Forward), and
// evicts them at once. A request for an expert that was not predicted is
// a miss: loaded then, computed, and reported, never silent.
//
// It does not own routing (the main node), predictions (the shadow), the
// store format (store) or the transport (wire).
package worker
