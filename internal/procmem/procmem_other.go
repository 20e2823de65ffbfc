//go:build !linux

package procmem

// PeakRSS is unknown on this platform: 0.
func PeakRSS() int64 { return 0 }
