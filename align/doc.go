// Package align holds the shadow node's alignment policy and the scoring
// of its predictions, as plain code: when the main node re-aligns the
// shadow's token (every TokenPeriod passes) and KV cache (every
// KVPeriod passes), how KV rows are packed for the wire (the rows of
// the new positions only, in fp16: they only feed predictions), and the
// recall rate of OD-MoE's equations (2) and (3).
//
// It owns no sockets and no model: the main node and the shadow feed it
// passes and routes and act on what it returns.
package align
