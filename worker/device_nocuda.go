//go:build !cuda

package worker

import "fmt"

// openCUDA is refused in a build without the cuda tag.
func openCUDA(ordinal int, _ int64, _ *Link) (Device, error) {
	return nil, fmt.Errorf("worker: device cuda:%d: this odmoe was built without CUDA (build it with -tags cuda)", ordinal)
}
