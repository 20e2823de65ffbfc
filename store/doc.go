// Package store owns the lossless compressed expert store: the on-disk
// format (FORMAT.md), offline conversion of a Hugging Face checkpoint
// (Convert), and the reader workers use to decompress one expert into a
// buffer of their own, exactly the original bytes, on a bounded pool of
// goroutines (Open, Store.ReadExpert).
//
// Every expert tensor (w1, w2, w3) is split bit-wise: the low-entropy
// exponent bytes are Huffman-coded (huff0) in K independent shards, the
// near-random sign and mantissa bits are stored raw. Every chunk carries a
// CRC-32C, checked before a byte of it is used.
//
// Where chunks come from is a ChunkSource: the local chunk file (pread)
// today, a peer that holds the store later. The store does not own the
// transport, the model's math, or the worker's memory budget.
package store
