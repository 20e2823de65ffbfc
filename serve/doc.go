// Package serve is the OpenAI-compatible HTTP API of a node that runs
// whole generations: the main node of a swarm, or one process in local
// mode. It parses and checks requests, renders chat templates, tokenizes,
// admits requests up to the batch size (the rest wait in a bounded
// queue), streams text back as server-sent events in OpenAI's chunk
// format, cuts at stop strings, and counts what it served for /metrics.
//
// It does not run the model: a Generator does (the main node's swarm, or
// the resident model). It does not know what a worker or a shadow is: a
// Health function says whether the roles a generation needs are up.
package serve
