// Package splitmix is SplitMix64's finaliser, the one mixing function the
// project hashes with where a value must not depend on the platform or
// the run: a pass's token (align.PassToken) and a sampled draw's noise
// (model's counter-based Gumbel-max).
package splitmix

// Mix is SplitMix64's finaliser: every input bit moves every output bit.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
