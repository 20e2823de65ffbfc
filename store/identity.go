package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/safetensors"
)

// Identity names the model a store was built from: a SHA-256 over the
// bytes of config.json, the sorted names, dtypes and shapes of every
// expert tensor, the router weights of every layer with experts, and a
// digest of every expert's weights (ExpertDigest, in layer and expert
// order). The routers and the experts make two checkpoints of one
// architecture (a base model and its fine-tune, even one that changed
// only the experts) different models. A main
// node computes the identity from its checkpoint and a worker passes it to
// Open, which then refuses a store built from another model.
type Identity [32]byte

// IsZero reports whether id is unset.
func (id Identity) IsZero() bool { return id == Identity{} }

// String is the hex digest.
func (id Identity) String() string { return hex.EncodeToString(id[:]) }

// Short is the first 12 hex digits, for logs.
func (id Identity) Short() string { return id.String()[:12] }

// ModelIdentity computes the Identity of the Hugging Face checkpoint in
// dir. It reads config.json, the safetensors headers and the router
// weights, and the expert weights' digests, cached beside the checkpoint
// (checkpointDigests): the first time, it reads every expert byte once.
func ModelIdentity(dir string) (Identity, error) {
	if id, ok, err := fetchedIdentity(dir); ok || err != nil {
		return id, err
	}
	m, err := model.Load(dir, model.LoadOptions{SkipExperts: true})
	if err != nil {
		return Identity{}, err
	}
	defer m.Close()
	return IdentityOf(dir, m)
}

// IdentityOf is ModelIdentity for a node that has loaded the checkpoint
// in dir as m already (experts or not): it reads only the safetensors
// headers again.
func IdentityOf(dir string, m *model.Model) (Identity, error) {
	if id, ok, err := fetchedIdentity(dir); ok || err != nil {
		return id, err
	}
	set, err := safetensors.Open(dir)
	if err != nil {
		return Identity{}, err
	}
	defer set.Close()
	return identityOf(dir, m, set)
}

// FetchedIdentityFile is where a checkpoint directory a node fetched
// part of (package fetch: a stage's layers, a shadow's) keeps the
// model's identity, as the node it fetched from gave it with the
// manifest every fetched byte was checked against: a part of a
// checkpoint cannot hash the routers and experts it lacks.
const FetchedIdentityFile = "odmoe-identity"

// fetchedIdentity is the identity dir's FetchedIdentityFile holds, if it
// has one.
func fetchedIdentity(dir string) (Identity, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, FetchedIdentityFile))
	if errors.Is(err, os.ErrNotExist) {
		return Identity{}, false, nil
	}
	var id Identity
	if err == nil {
		id, err = ParseIdentity(string(bytes.TrimSpace(b)))
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("store: %s: %w", filepath.Join(dir, FetchedIdentityFile), err)
	}
	return id, true, nil
}

// ParseIdentity parses an identity's hex digits.
func ParseIdentity(s string) (Identity, error) {
	var id Identity
	n, err := hex.Decode(id[:], []byte(s))
	if err == nil && n != len(id) {
		err = fmt.Errorf("%d bytes, want %d", n, len(id))
	}
	if err != nil {
		return Identity{}, fmt.Errorf("store: identity %q: %w", s, err)
	}
	return id, nil
}

// identityOf hashes config.json, the expert tensors set holds (their
// shapes and their weights' digests) and the routers.
func identityOf(dir string, m *model.Model, set *safetensors.Set) (Identity, error) {
	digests, err := checkpointDigests(dir, m, set)
	if err != nil {
		return Identity{}, err
	}
	return identityWith(dir, m, set.Info, expertsDigest(digests))
}

// identityWith is the identity of the checkpoint in dir whose experts'
// digests fold into experts.
func identityWith(dir string, m *model.Model, info func(string) (safetensors.Info, bool), experts [32]byte) (Identity, error) {
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Identity{}, fmt.Errorf("store: %w", err)
	}
	var lines []string
	for _, l := range m.Config.ExpertLayers() {
		for e := range m.Config.NumExperts {
			names, _ := m.ExpertTensors(l, e)
			for _, name := range names {
				in, ok := info(name)
				if !ok {
					return Identity{}, fmt.Errorf("store: %s: expert tensor %q: %w", dir, name, safetensors.ErrNotFound)
				}
				dims := make([]string, len(in.Shape))
				for i, d := range in.Shape {
					dims[i] = strconv.Itoa(d)
				}
				lines = append(lines, name+" "+in.DType+" "+strings.Join(dims, "x")+"\n")
			}
		}
	}
	sort.Strings(lines)
	h := sha256.New()
	fmt.Fprintf(h, "odmoe store identity v2\nconfig.json %d\n", len(cfg))
	h.Write(cfg)
	fmt.Fprintf(h, "\nexpert tensors %d\n", len(lines))
	for _, l := range lines {
		h.Write([]byte(l))
	}
	for _, l := range m.Config.ExpertLayers() {
		r := m.Layers[l].MoE.Router
		fmt.Fprintf(h, "router %d %v %dx%d\n", l, r.DType, r.Rows, r.Cols)
		h.Write(r.Data)
	}
	fmt.Fprintf(h, "experts %x\n", experts)
	var id Identity
	h.Sum(id[:0])
	return id, nil
}

// Current reports whether dir holds a valid store of the checkpoint in
// modelDir (its identity), so that converting it again is not needed.
func Current(modelDir, dir string) (bool, error) {
	id, err := ModelIdentity(modelDir)
	if err != nil {
		return false, err
	}
	st, err := Open(dir, Options{Identity: id})
	if err != nil {
		return false, nil
	}
	return true, st.Close()
}
