package model

import "fmt"

// architecture binds one Hugging Face model family to odmoe's blocks: its
// config defaults, the names of its tensors and the switches in its math.
// A new MoE family is a new file that registers one of these.
type architecture struct {
	defaults Config
	names    tensorNames
	// normTopK renormalises the top-k routing weights to sum to one.
	normTopK bool
}

// tensorNames are fmt patterns: per-layer names take the layer index,
// expert names the layer and the expert index.
type tensorNames struct {
	Embed, FinalNorm, LMHead         string
	AttnNorm, FFNNorm                string
	Q, K, V, O                       string
	Router                           string
	ExpertGate, ExpertUp, ExpertDown string // w1, w3, w2 in Mixtral's naming
}

var architectures = map[string]*architecture{}

func register(name string, a *architecture) {
	if _, dup := architectures[name]; dup {
		panic("model: architecture registered twice: " + name)
	}
	architectures[name] = a
}

func (n tensorNames) layer(pattern string, l int) string { return fmt.Sprintf(pattern, l) }

func (n tensorNames) expert(pattern string, l, e int) string { return fmt.Sprintf(pattern, l, e) }
