package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/kernels"
)

// writeTestFile writes two tensors whose bytes count up from a seed.
func writeTestFile(t *testing.T, path string, names []string, seed byte) {
	t.Helper()
	specs := make([]Spec, len(names))
	for i, n := range names {
		specs[i] = Spec{Name: n, DType: "BF16", Shape: []int{2, 3}}
	}
	err := Write(path, specs, map[string]string{"format": "pt"}, func(i int, buf []byte) error {
		for j := range buf {
			buf[j] = seed + byte(i*len(buf)+j)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestWriteThenReadIsExact(t *testing.T) {
	path := filepath.Join(t.TempDir(), "model.safetensors")
	writeTestFile(t, path, []string{"a", "b"}, 7)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := strings.Join(s.Names(), ","); got != "a,b" {
		t.Fatalf("names %q", got)
	}
	b, err := s.TensorShape("b", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if b.DType != kernels.BF16 || len(b.Data) != 12 {
		t.Fatalf("b: %v %d bytes", b.DType, len(b.Data))
	}
	for j, v := range b.Data {
		if v != 7+byte(12+j) {
			t.Fatalf("b[%d] = %d", j, v)
		}
	}
	m, err := b.Matrix()
	if err != nil || m.Rows != 2 || m.Cols != 3 {
		t.Fatalf("matrix %+v %v", m, err)
	}
}

func TestShardedSetFollowsIndex(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), []string{"a", "b"}, 1)
	writeTestFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), []string{"c"}, 100)
	index := map[string]any{"metadata": map[string]any{"total_size": 36}, "weight_map": map[string]string{
		"a": "model-00001-of-00002.safetensors",
		"b": "model-00001-of-00002.safetensors",
		"c": "model-00002-of-00002.safetensors",
	}}
	js, _ := json.Marshal(index)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), js, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Tensor("c")
	if err != nil {
		t.Fatal(err)
	}
	if c.Data[0] != 100 {
		t.Fatalf("c[0] = %d, want 100", c.Data[0])
	}
	if got := s.Bytes("a", "b", "c"); got != 36 {
		t.Fatalf("Bytes = %d, want 36", got)
	}
}

func TestIndexNamingWrongShardIsRefused(t *testing.T) {
	dir := t.TempDir()
	writeTestFile(t, filepath.Join(dir, "s1.safetensors"), []string{"a"}, 1)
	writeTestFile(t, filepath.Join(dir, "s2.safetensors"), []string{"c"}, 1)
	js, _ := json.Marshal(map[string]any{"weight_map": map[string]string{"a": "s2.safetensors", "c": "s2.safetensors"}})
	os.WriteFile(filepath.Join(dir, IndexFile), js, 0o644)
	_, err := Open(dir)
	if err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("err = %v, want it to name tensor a", err)
	}
}

func TestBadFilesGiveClearErrors(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.safetensors")
	writeTestFile(t, good, []string{"w"}, 0)
	raw, _ := os.ReadFile(good)
	hlen := binary.LittleEndian.Uint64(raw[:8])

	withHeader := func(h string) []byte {
		b := make([]byte, 8, 8+len(h)+12)
		binary.LittleEndian.PutUint64(b, uint64(len(h)))
		return append(append(b, h...), make([]byte, 12)...)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated data", raw[:len(raw)-3], "truncated"},
		{"truncated header", raw[:8+hlen/2], "header length"},
		{"header not JSON", withHeader("{nope"), "bad header JSON"},
		{"offsets count", withHeader(`{"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0]}}`), "data_offsets has 1"},
		{"shape vs bytes", withHeader(`{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,12]}}`), "needs 8 bytes"},
		{"negative dim", withHeader(`{"w":{"dtype":"BF16","shape":[-1],"data_offsets":[0,2]}}`), "negative dimension"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x.safetensors")
			os.WriteFile(p, tc.data, 0o644)
			_, err := Open(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestMissingTensorAndShapeMismatch(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.safetensors")
	writeTestFile(t, p, []string{"w"}, 0)
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Tensor("nope"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("missing tensor: %v", err)
	}
	if _, err := s.TensorShape("w", 3, 2); err == nil || !strings.Contains(err.Error(), "[2 3]") {
		t.Fatalf("shape mismatch: %v", err)
	}
}

func TestUnsupportedDTypeIsNamed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "i.safetensors")
	if err := Write(p, []Spec{{Name: "ids", DType: "I64", Shape: []int{2}}}, nil, func(int, []byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Tensor("ids"); err == nil || !strings.Contains(err.Error(), "I64") {
		t.Fatalf("err = %v, want it to name I64", err)
	}
}

func FuzzOpenFile(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "good.safetensors")
	Write(good, []Spec{{Name: "w", DType: "F32", Shape: []int{2}}}, nil, func(int, []byte) error { return nil })
	seed, _ := os.ReadFile(good)
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(t.TempDir(), "f.safetensors")
		os.WriteFile(p, data, 0o644)
		s, err := Open(p)
		if err != nil {
			return
		}
		for _, n := range s.Names() {
			s.Tensor(n) // must not panic
		}
		s.Close()
	})
}
