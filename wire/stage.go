//lint:file-ignore U1000 the _msgpack fields carry msgpack's as_array struct tag
package wire

import "time"

// The messages between a staged node's first stage and the stages that
// hold its later layers (package stage): a stage runs its layers of a
// pass on the rows it is handed and hands back the rows after them.
// They travel in order on the control stream, whatever their size, so
// that a stage sees a sequence's KV rows, runs and end in the order its
// first stage made them.

// StageRun asks a stage to run layers First..End-1 of one pass over the
// rows of its spans (sequence Seqs[i]'s positions Starts[i] to
// Starts[i]+Counts[i]-1, its rows from Starts[i] on forgotten first),
// whose hidden state after layer First-1 is Hidden ([rows, hidden] F32).
// The stage answers with a StageRoutes per layer as it is routed (when
// Routes is set) and then StageRows, or an Error with ID.
//
// Batch and Pass are the first stage's step (its batch's sequence id and
// the pass's number), under which a main stage runs the pass's experts
// on its workers, as the first stage would; Prefill says the pass feeds
// prompt chunks. KV asks for the KV rows the run wrote, each span's, in
// the answer (a main node whose shadow is KV-aligned).
type StageRun struct {
	_msgpack   struct{} `msgpack:",as_array"`
	ID         uint64
	First, End int
	Seqs       []uint64
	Starts     []int32
	Counts     []int32
	Hidden     Tensor
	Routes     bool
	Batch      uint64
	Pass       int64
	Prefill    bool
	KV         bool
}

// StageRoutes is one layer's routing of a StageRun's rows: row r's k
// routes are Experts[r*k:(r+1)*k] with Weights alike.
type StageRoutes struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       uint64
	Layer    int
	Experts  []int32
	Weights  []float32
}

// StageRows is a stage's answer to a StageRun: its rows' hidden state
// after its last layer ([rows, hidden] F32), and, from a main stage, what
// its layers' experts have cost since the connection began and (when
// the run asked) the KV
// rows the run wrote in its layers, a StageKV a span (fp16).
type StageRows struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       uint64
	Hidden   Tensor
	Figures  *StageFigures
	KV       []StageKV
	// CPU is the CPU time the stage's process has used since the
	// connection began, when it sent the rows (0: not measured): its
	// first stage counts what its stages cost a decode.
	CPU time.Duration
}

// StageFigures are what a main stage has measured of its layers since
// the connection began, decode and prefill passes apart, as its main
// node measures its own:
// Decode[i] and Prefill[i] are layer First+i's; Workers[w] what worker w
// of the layout did for the stage's requests.
type StageFigures struct {
	_msgpack        struct{} `msgpack:",as_array"`
	First           int
	Decode, Prefill []LayerFigures
	Workers         []WorkerFigures
}

// WorkerFigures sum what one worker did for a node's requests (the main
// node's per-worker metrics; durations in nanoseconds).
type WorkerFigures struct {
	_msgpack                   struct{} `msgpack:",as_array"`
	Results, Loads, Misses     int64
	Late, Wrong                int64
	LoadNs, ComputeNs, StallNs int64
}

// LayerFigures sum what one layer has cost over the passes that ran it
// (the main node's per-layer figures; durations in nanoseconds).
type LayerFigures struct {
	_msgpack                                        struct{} `msgpack:",as_array"`
	Calls                                           int64
	Main, Experts, Worker, Network, Stall, Load     int64
	Loads, Misses, MissesLate, MissesWrong, Results int64
}

// StageKV overwrites sequence Seq's key and value rows from position
// FromPos in layers First.. (one tensor a layer, as Alignment carries
// them; Values empty for a latent cache): what a KV alignment writes in
// the first stage, the stage writes in its layers.
type StageKV struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	FromPos  int
	First    int
	Keys     []Tensor
	Values   []Tensor
}

// StageEnd says sequence Seq is over (with All, every sequence: the
// first stage starts over): the stage lets its rows go.
type StageEnd struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	All      bool
}

func (*StageRun) Type() Type    { return typeStageRun }
func (*StageRoutes) Type() Type { return typeStageRoutes }
func (*StageRows) Type() Type   { return typeStageRows }
func (*StageKV) Type() Type     { return typeStageKV }
func (*StageEnd) Type() Type    { return typeStageEnd }

func (m *StageRun) validate() error {
	switch {
	case m.First < 0 || m.End <= m.First:
		return malformed("stage run %d of layers %d to %d", m.ID, m.First, m.End-1)
	case len(m.Seqs) == 0 || len(m.Starts) != len(m.Seqs) || len(m.Counts) != len(m.Seqs):
		return malformed("stage run %d: %d sequences, %d starts, %d counts", m.ID, len(m.Seqs), len(m.Starts), len(m.Counts))
	}
	for i := range m.Seqs {
		if m.Starts[i] < 0 || m.Counts[i] < 1 {
			return malformed("stage run %d: sequence %d's rows %d to %d", m.ID, m.Seqs[i], m.Starts[i], m.Starts[i]+m.Counts[i]-1)
		}
	}
	return m.Hidden.Validate()
}

func (m *StageRoutes) validate() error {
	if m.Layer < 0 || len(m.Experts) != len(m.Weights) {
		return malformed("stage routes of layer %d: %d experts, %d weights", m.Layer, len(m.Experts), len(m.Weights))
	}
	return nil
}

func (m *StageRows) validate() error {
	if m.CPU < 0 {
		return malformed("stage rows %d: CPU time %v", m.ID, m.CPU)
	}
	if f := m.Figures; f != nil && (f.First < 0 || len(f.Prefill) != len(f.Decode)) {
		return malformed("stage rows %d: figures from layer %d of %d decode and %d prefill layers", m.ID, f.First, len(f.Decode), len(f.Prefill))
	}
	for i := range m.KV {
		if err := m.KV[i].validate(); err != nil {
			return err
		}
	}
	return m.Hidden.Validate()
}

func (m *StageKV) validate() error {
	if m.FromPos < 0 || m.First < 0 || len(m.Values) != 0 && len(m.Values) != len(m.Keys) {
		return malformed("stage KV rows of sequence %d from %d, layer %d on: %d key and %d value tensors", m.Seq, m.FromPos, m.First, len(m.Keys), len(m.Values))
	}
	return validTensors(m.Keys, m.Values)
}

func (m *StageEnd) validate() error { return nil }
