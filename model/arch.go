package model

import "fmt"

// architecture binds one Hugging Face model family to odmoe's blocks
// (block.go): its config defaults, its tensor names, and how its layers
// are made of blocks. A new MoE family is a new file that registers one
// of these.
type architecture struct {
	defaults Config
	// Embed, FinalNorm and LMHead name the model's outer tensors.
	embed, finalNorm, lmHead string
	// layer binds layer l's blocks, all but the experts.
	layer func(b *binder, c Config, l int) Layer
	// expertNames names the gate, up and down matrices of expert e of
	// layer l (w1, w3, w2 in Mixtral's naming).
	expertNames func(l, e int) (gate, up, down string)
}

var architectures = map[string]*architecture{}

func register(name string, a *architecture) {
	if _, dup := architectures[name]; dup {
		panic("model: architecture registered twice: " + name)
	}
	architectures[name] = a
}

// per fills a per-layer or per-expert name pattern.
func per(pattern string, a ...any) string { return fmt.Sprintf(pattern, a...) }
