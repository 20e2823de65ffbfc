package splitmix

import "testing"

// The finaliser's published outputs: SplitMix64 seeded with 0 gives
// 0xe220a8397b1dcdaf first (the state advanced by the golden gamma, then
// mixed), and 1234567's first is 0x599ed017fb08fc85.
func TestMixIsSplitMix64sFinaliser(t *testing.T) {
	const gamma = 0x9e3779b97f4a7c15
	for seed, want := range map[uint64]uint64{0: 0xe220a8397b1dcdaf, 1234567: 0x599ed017fb08fc85} {
		if got := Mix(seed + gamma); got != want {
			t.Errorf("SplitMix64(%d)'s first output %#x, want %#x", seed, got, want)
		}
	}
}
