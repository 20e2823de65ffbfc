//go:build unix

package safetensors

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// TestWriteShapesIsASparseCheckpoint: a checkpoint of shapes only opens
// as any other, each tensor its dtype and shape, its data zeros, and a
// 4 GiB tensor takes no disk (a sparse file: st_blocks, not its size).
func TestWriteShapesIsASparseCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.safetensors")
	specs := []Spec{{Name: "big", DType: "BF16", Shape: []int{1 << 16, 1 << 15}}, {Name: "norm", DType: "F32", Shape: []int{64}}}
	if err := WriteShapes(path, specs, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size < 4<<30 || st.Blocks*512 > 1<<20 {
		t.Fatalf("%d bytes long, %d on disk: want over 4 GiB long and under 1 MiB on disk", st.Size, st.Blocks*512)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big, err := s.TensorShape("big", 1<<16, 1<<15)
	if err != nil || big.DType != kernels.BF16 || len(big.Data) != 4<<30 {
		t.Fatalf("big: %v, %v, %d bytes", err, big.DType, len(big.Data))
	}
	norm, err := s.TensorShape("norm", 64)
	if err != nil || len(norm.Data) != 256 || norm.Data[0] != 0 || norm.Data[255] != 0 {
		t.Fatalf("norm: %v, %d bytes", err, len(norm.Data))
	}
}
