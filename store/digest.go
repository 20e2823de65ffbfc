package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
)

// ExpertDigest is the SHA-256 of one expert's weights as the checkpoint
// holds them: its gate, up and down tensors' bytes, in that order (or
// its parts of the tensors that stack a layer's experts, in the family's
// order: model.Model.ExpertTensors).
type ExpertDigest [32]byte

// digestsFile is where a store keeps its experts' digests (one line per
// expert: layer, expert, hex digest), written by Convert, read by
// Compare to name the first expert that differs from a checkpoint.
const digestsFile = "experts.sha256"

// checkpointDigests returns the digest of every expert of the checkpoint
// in dir (m's expert layers ascending, experts in order), reading the
// expert tensors from set on all cores. Reading a large checkpoint takes
// as long as reading its expert bytes once, so the digests are cached
// beside it (or, where dir is read-only, in the user cache directory),
// keyed by its safetensors files' names, sizes and modification times.
func checkpointDigests(dir string, m *model.Model, set *safetensors.Set) ([]ExpertDigest, error) {
	key, err := checkpointKey(dir)
	if err != nil {
		return nil, err
	}
	n := len(m.Config.ExpertLayers()) * m.Config.NumExperts
	paths := digestCachePaths(dir)
	for _, p := range paths {
		if d, ok := readDigestCache(p, key, n); ok {
			return d, nil
		}
	}
	d, err := hashExperts(m, set)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		if writeDigestCache(p, key, d) == nil {
			break
		}
	}
	return d, nil
}

// hashExperts hashes every expert's tensors, GOMAXPROCS at a time.
func hashExperts(m *model.Model, set *safetensors.Set) ([]ExpertDigest, error) {
	type job struct{ i, layer, expert int }
	layers := m.Config.ExpertLayers()
	out := make([]ExpertDigest, len(layers)*m.Config.NumExperts)
	jobs := make(chan job)
	errs := make([]error, len(out))
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range jobs {
				h := sha256.New()
				names, stacked := m.ExpertTensors(j.layer, j.expert)
				for _, name := range names {
					info, ok := set.Info(name)
					data, err := set.Raw(name, info.DType, info.Shape...) // any dtype: MXFP4's parts are U8
					if !ok || err != nil {
						errs[j.i] = fmt.Errorf("store: digest of layer %d expert %d: tensor %q: %v", j.layer, j.expert, name, err)
						break
					}
					h.Write(expertPart(data, stacked, j.expert, m.Config.NumExperts))
				}
				h.Sum(out[j.i][:0])
			}
		})
	}
	i := 0
	for _, l := range layers {
		for e := range m.Config.NumExperts {
			jobs <- job{i, l, e}
			i++
		}
	}
	close(jobs)
	wg.Wait()
	return out, errors.Join(errs...)
}

// expertPart is expert e's bytes of a tensor's data: all of them, or,
// where the tensor stacks a layer's n experts, the e-th of n slices.
func expertPart(data []byte, stacked bool, e, n int) []byte {
	if !stacked {
		return data
	}
	return data[len(data)/n*e : len(data)/n*(e+1)]
}

// expertsDigest folds the experts' digests into the one the identity
// hashes.
func expertsDigest(d []ExpertDigest) [32]byte {
	h := sha256.New()
	for _, x := range d {
		h.Write(x[:])
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// checkpointKey names the state of dir's weights: every safetensors
// file's name, size and modification time.
func checkpointKey(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("store: %s: no safetensors files (%v)", dir, err)
	}
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return "", fmt.Errorf("store: %w", err)
		}
		fmt.Fprintf(&b, "%s %d %d\n", filepath.Base(f), st.Size(), st.ModTime().UnixNano())
	}
	return b.String(), nil
}

// digestCachePaths are where dir's digests may be cached: beside the
// checkpoint, then in the user cache directory under a name derived from
// dir's absolute path.
func digestCachePaths(dir string) []string {
	paths := []string{filepath.Join(dir, ".odmoe-expert-digests.json")}
	abs, err := filepath.Abs(dir)
	if c, cerr := os.UserCacheDir(); err == nil && cerr == nil {
		sum := sha256.Sum256([]byte(abs))
		paths = append(paths, filepath.Join(c, "odmoe", "expert-digests", hex.EncodeToString(sum[:8])+".json"))
	}
	return paths
}

type digestCache struct {
	Key     string   `json:"key"`
	Digests []string `json:"digests"`
}

func readDigestCache(path, key string, n int) ([]ExpertDigest, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	var c digestCache
	if json.Unmarshal(b, &c) != nil || c.Key != key || len(c.Digests) != n {
		return nil, false
	}
	out := make([]ExpertDigest, n)
	for i, s := range c.Digests {
		if x, err := hex.DecodeString(s); err != nil || len(x) != len(out[i]) {
			return nil, false
		} else {
			copy(out[i][:], x)
		}
	}
	return out, true
}

func writeDigestCache(path, key string, d []ExpertDigest) error {
	c := digestCache{Key: key, Digests: make([]string, len(d))}
	for i, x := range d {
		c.Digests[i] = hex.EncodeToString(x[:])
	}
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// a file of its own to rename: two nodes starting on one checkpoint
	// may both write the cache
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}

// writeDigests records a store's experts' digests in dir.
func writeDigests(dir string, layers []int, experts int, d []ExpertDigest) error {
	var b strings.Builder
	i := 0
	for _, l := range layers {
		for e := range experts {
			fmt.Fprintf(&b, "%d %d %x\n", l, e, d[i])
			i++
		}
	}
	return os.WriteFile(filepath.Join(dir, digestsFile), []byte(b.String()), 0o644)
}

// Compare says how the store in dir differs from the checkpoint in
// modelDir: "" when its identity is the checkpoint's, else which part
// differs, naming the first expert whose weights differ where the store
// recorded its experts' digests.
func Compare(modelDir, dir string) (string, error) {
	m, err := model.Load(modelDir, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return "", err
	}
	defer m.Close()
	set, err := safetensors.Open(modelDir)
	if err != nil {
		return "", err
	}
	defer set.Close()
	want, err := checkpointDigests(modelDir, m, set)
	if err != nil {
		return "", err
	}
	id, err := identityWith(modelDir, m, set.Info, expertsDigest(want))
	if err != nil {
		return "", err
	}
	st, err := Open(dir, Options{})
	if err != nil {
		return "", err
	}
	storeID := st.Identity()
	st.Close()
	if storeID == id {
		return "", nil
	}
	b, err := os.ReadFile(filepath.Join(dir, digestsFile))
	if err != nil {
		return fmt.Sprintf("store identity %s, checkpoint %s; the store has no %s to say which experts differ (converted before odmoe recorded them)", storeID.Short(), id.Short(), digestsFile), nil
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	i := 0
	for _, l := range m.Config.ExpertLayers() {
		for e := range m.Config.NumExperts {
			if i >= len(lines) || lines[i] != fmt.Sprintf("%d %d %x", l, e, want[i]) {
				return fmt.Sprintf("store identity %s, checkpoint %s: layer %d expert %d is the first expert whose weights differ", storeID.Short(), id.Short(), l, e), nil
			}
			i++
		}
	}
	return fmt.Sprintf("store identity %s, checkpoint %s: every expert's weights are the checkpoint's; its config, tensor shapes or routers differ", storeID.Short(), id.Short()), nil
}
