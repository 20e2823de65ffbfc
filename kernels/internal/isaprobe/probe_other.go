//go:build !amd64

package isaprobe
