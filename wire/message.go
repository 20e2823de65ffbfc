//lint:file-ignore U1000 the _msgpack fields carry msgpack's as_array struct tag

package wire

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
)

// Type identifies a message on the wire. Values are part of the protocol.
type Type uint8

// The message types of protocol version 2.
const (
	typeHello        Type = 1
	typePrediction   Type = 2
	typeActivation   Type = 3
	typeExpertResult Type = 4
	typeAlignment    Type = 5
	typeHeartbeat    Type = 8
	typeError        Type = 9
	typeTrace        Type = 10
	typeSequenceEnd  Type = 11
	typeStatsRequest Type = 12
	typeWorkerStats  Type = 13
	typeShadowDone   Type = 14
	typePlacement    Type = 15
	typeWithdraw     Type = 16
	typeStageRun     Type = 17
	typeStageRoutes  Type = 18
	typeStageRows    Type = 19
	typeStageKV      Type = 20
	typeStageEnd     Type = 21
	typeDrafts       Type = 22
	typeFetchRequest Type = 23
	typeFetchData    Type = 24
	typePlace        Type = 25
	typeShareIn      Type = 26
)

func (t Type) String() string {
	if m := newMessage(t); m != nil {
		return fmt.Sprintf("%T", m)[len("*wire."):]
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Message is one of the protocol's messages: *Hello, *Prediction,
// *Activation, *ExpertResult, *Alignment,
// *Heartbeat, *Error, *Trace, *SequenceEnd, *StatsRequest, *WorkerStats,
// *ShadowDone, *Placement, *Withdraw, *Drafts, a fetch's (*FetchRequest,
// *FetchData, *Place, *ShareIn) or a stage's (*StageRun, *StageRoutes,
// *StageRows, *StageKV, *StageEnd). Peer.Recv returns them; a type switch tells them
// apart.
type Message interface {
	Type() Type
	validate() error // checks a decoded message; seals the interface
}

// newMessage returns a zero message of type t, nil for an unknown type.
func newMessage(t Type) Message {
	switch t {
	case typeHello:
		return new(Hello)
	case typePrediction:
		return new(Prediction)
	case typeActivation:
		return new(Activation)
	case typeExpertResult:
		return new(ExpertResult)
	case typeAlignment:
		return new(Alignment)
	case typeHeartbeat:
		return new(Heartbeat)
	case typeError:
		return new(Error)
	case typeTrace:
		return new(Trace)
	case typeSequenceEnd:
		return new(SequenceEnd)
	case typeStatsRequest:
		return new(StatsRequest)
	case typeWorkerStats:
		return new(WorkerStats)
	case typeShadowDone:
		return new(ShadowDone)
	case typePlacement:
		return new(Placement)
	case typeWithdraw:
		return new(Withdraw)
	case typeStageRun:
		return new(StageRun)
	case typeStageRoutes:
		return new(StageRoutes)
	case typeStageRows:
		return new(StageRows)
	case typeStageKV:
		return new(StageKV)
	case typeStageEnd:
		return new(StageEnd)
	case typeDrafts:
		return new(Drafts)
	case typeFetchRequest:
		return new(FetchRequest)
	case typeFetchData:
		return new(FetchData)
	case typeShareIn:
		return new(ShareIn)
	case typePlace:
		return new(Place)
	}
	return nil
}

// Hello is the first message on every connection, in both directions: who
// the sender is and what it can do. With certificates, Name and Role must
// match the sender's certificate.
type Hello struct {
	_msgpack       struct{} `msgpack:",as_array"`
	Name           string
	Role           Role
	Version        string // the sender's build, for logs
	Arch           string // GOARCH of the sender
	DeviceMemBytes int64  // a worker's device memory budget; 0 if none
	Features       []string
	// Model is the identity (store.Identity, hex) of the model the sender
	// serves: a worker's store's, the main node's and the shadow's
	// checkpoint's. Nodes of different models refuse each other.
	Model string
	// Layout, from a shadow, is its workers' names in the order it hints
	// them, in groups of Group: the main node refuses a shadow whose
	// layout is not its own.
	Layout []string
	Group  int
	// LoadBytesSec is a worker's expert load bandwidth (its -load-bw),
	// 0 if unpaced: the main node's placement weighs workers by it.
	LoadBytesSec float64
	// Device is what a worker computes on ("cpu", "cuda:0 NVIDIA ..."),
	// for logs and the main node's view of its swarm.
	Device string
	// Layers, from a stage (package stage), are the layers it holds,
	// first and end ([first, end)); Quant the weights' type it holds
	// them in ("" full precision).
	Layers []int
	Quant  string
	// Context, from a stage or a shadow, is the longest sequence it
	// serves (its -context, or its model's): the main node refuses one
	// shorter than its own, whose long requests would fail midway.
	Context int
}

// Prediction tells a worker group which experts the shadow node expects
// layer Layer of pass Pass of sequence Seq to use, so that they
// load them now.
type Prediction struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64   // the sequence (the main node's id for it)
	Pass     int64
	Layer    int
	Experts  []int32
	// Token is the token the shadow fed that pass (for a batch's
	// pass, align.PassToken of its rows' tokens): its own when it ran
	// ahead of the main node's alignment, so the main node can tell a
	// prediction on a path it did not take; -1 when not said (the main
	// node's own hints).
	Token int32
	// Workers, in a prediction to the main node, gives the worker each of
	// Experts was hinted to (-1: none, its worker was down), so the main
	// node runs it there; empty: the i-th expert's is DecodeWorker(Layer,
	// i), sched.Layout.PredictionHints' rule. A prediction the shadow
	// revises after a rewind of some of a pass's members keeps the
	// experts still wanted where they were hinted, which that rule would
	// move.
	Workers []int32
	// Partial marks a revised pass's kept rows' union, sent before the
	// rows still to run are routed: the main node may place on it, but
	// scores the whole union that follows.
	Partial bool
}

// Withdraw tells a worker group and the main node that the shadow takes
// back its predictions for passes From and later of sequence Seq: it
// ran ahead on a token the main node did not sample, and runs them again.
// A worker drops the loads they started unless something else holds
// them; predictions sent after it stand. With Experts set it takes back
// only those experts of layer Layer of pass From, sent to the worker
// they were hinted to: a pass run ahead whose other members the main
// node's pass kept no longer needs them (a member left, or was fed
// another token).
type Withdraw struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	From     int64
	Layer    int
	Experts  []int32
}

// Activation is the main node's request to run experts: the normalized
// hidden state of Tokens tokens of sequence Seq at layer Layer and the
// experts the router really chose. Routing weights stay on the main node,
// which mixes the outputs in its fixed order.
type Activation struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	Pass     int64
	Layer    int
	Tokens   int
	Experts  []int32
	Hidden   Tensor // [Tokens, hidden] F32
	ID       uint64 // echoed in the ExpertResults (and an Error) it causes
	// Keep leaves the experts resident after computing (a prefill
	// mini-batch with more to come); otherwise they are evicted at once.
	Keep bool
	// EndLayer marks the last activation the worker gets for Layer in this
	// pass of Seq: it also evicts what it loaded for the layer on a
	// wrong prediction of that sequence, before answering.
	EndLayer bool
	// RowCounts, when set (one per expert), gives each expert its own rows
	// of Hidden: expert j runs on rows Rows[c_0+...+c_(j-1) :][:c_j], in
	// that order, and its result has c_j rows (a batched decode pass: one
	// message per worker carries the rows of every sequence routed to its
	// experts). Unset: every expert runs on every row.
	Rows      []int32
	RowCounts []int32
	// Cache leaves the experts resident once computed (and Keep no longer
	// holds them), for later requests (-residency on): the worker evicts
	// them, coldest first, only when it needs their memory.
	Cache bool
}

// ExpertResult is a worker's answer to an Activation: one expert's output.
type ExpertResult struct {
	_msgpack    struct{} `msgpack:",as_array"`
	Seq         uint64
	Pass        int64
	Layer       int
	Expert      int
	Output      Tensor // [Tokens, hidden] F32
	Loaded      bool   // the expert was loaded for this request (not already resident)
	Miss        bool   // the expert had not been predicted (DESIGN.md: counted, never silent)
	LoadTime    time.Duration
	ComputeTime time.Duration
	ID          uint64        // the Activation's
	StallTime   time.Duration // how long the request waited for the expert to load
	// Lead is how long before the Activation the prediction that loaded
	// the expert arrived (0: not loaded on a prediction for it).
	Lead time.Duration
}

// Alignment re-aligns the shadow node's copy of sequence Seq with the main
// node's (DESIGN.md step 4): the token sampled at Pass and, when it is
// a KV alignment, the key and value rows of every layer written since
// position FromPos.
type Alignment struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	Pass     int64
	Token    int32
	FromPos  int
	Keys     []Tensor // one per layer, or none for a token-only alignment
	Values   []Tensor // as Keys; none for a latent cache (its rows are keys and values at once)
	// History, when set, starts sequence Seq with the tokens it holds
	// before this pass (a prefix the main node reused, or, to a shadow
	// that attaches mid-sequence, every token so far), which the shadow
	// runs first; a pass at Pass 1 starts the sequence without them.
	History []int32
	// Batch, BatchPass and BatchSize say that this pass of Seq
	// runs in pass BatchPass of the main node's batch Batch, with
	// BatchSize sequences in all (this one included): the shadow runs the
	// pass when it has all of their alignments, as one batched forward
	// pass, and predicts each layer for step (Batch, BatchPass).
	// Every sequence runs in a batch's passes (text mode: a batch of one).
	Batch     uint64
	BatchPass int64
	BatchSize int
	// Chunk are prompt tokens this pass feeds (instead of Token),
	// PromptLeft the prompt tokens that later passes feed.
	Chunk      []int32
	PromptLeft int
	// Final says this is the sequence's last pass: it has reached
	// its token limit (or the context's end) and leaves the batch after
	// it, so the shadow runs no pass ahead with it.
	Final bool
	// Sampling, on an alignment that starts the sequence (History set, or
	// pass 1), says how the main node chooses its tokens when not
	// greedily: the shadow guesses them the same way. nil: greedy.
	Sampling *Sampling
	// Pos is the position of the sequence's first row in this pass (its
	// decode token's, or its chunk's first; 0 at its start, or not
	// said): rows the shadow holds from it on are ones the main node did
	// not keep (guesses it turned down), which the shadow takes back.
	Pos int
	// Guesses are the tokens a decode pass feeds after Token (drafting:
	// the shadow's guesses, which the pass checks), at most MaxGuesses.
	Guesses []int32
	// Draft is how many tokens the shadow is to guess after the
	// sequence's first row in the passes it runs ahead from now on (0:
	// none), at most MaxGuesses.
	Draft int
}

// FetchRequest asks a node that holds the expert store for a piece of
// it (package fetch): its index file (Index), or the Size bytes of its
// chunk file at Offset. With Model it asks for a piece of the model's
// checkpoint instead: its manifest (Index), the file named File (a
// config or tokenizer file the manifest lists), or the Size bytes at
// Offset of the tensor named Tensor. The answer is a FetchData with the
// same ID.
type FetchRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       uint64
	Index    bool
	Offset   int64
	Size     int
	Model    bool
	File     string
	Tensor   string
}

// FetchData answers FetchRequest ID: the bytes asked for, or why not
// (Err set, Data empty).
type FetchData struct {
	_msgpack struct{} `msgpack:",as_array"`
	ID       uint64
	Data     []byte
	Err      string
}

// Place tells a worker its place in the main node's layout: worker
// Worker of Workers, in groups of Group. Without residency its share of
// the store is sched.Layout.Holds's, which a worker filling its store
// as it runs (-fetch-from) then fills in the background, asking the
// other workers (Peers: every worker's address in layout order, as the
// main node dials them; or none) for what they hold too, and the nodes
// that relay the store as they fill it (Holders: the shadow's address)
// before the main node.
type Place struct {
	_msgpack struct{} `msgpack:",as_array"`
	Worker   int
	Workers  int
	Group    int
	Peers    []string
	Holders  []string
}

// ShareIn answers a Place once the worker holds its share of the store
// (at once where it holds the whole store; a worker filling its share,
// once the fill has ended): a main node keeps a worker that rejoins out
// of the layout until then, so that the running sequences never wait on
// the experts it would fetch.
type ShareIn struct {
	_msgpack struct{} `msgpack:",as_array"`
	// Fetched is the bytes of the store the worker has fetched (as it
	// ran, then to fill its share; 0: it held them), which the main node
	// logs as it takes the worker back.
	Fetched int64
}

// maxPlaceHolders bounds a Place's Holders (a shadow, or its stages).
const maxPlaceHolders = 64

// MaxFetchBytes bounds a FetchRequest's Size: a chunk (a shard of an
// expert's tensor, ~7 MB at Mixtral's largest) fits with room to spare.
const MaxFetchBytes = 32 << 20

// maxFetchName bounds a FetchRequest's File and Tensor names (the
// longest tensor names of the families we run are under 100 bytes).
const maxFetchName = 512

// MaxGuesses bounds an alignment's Guesses and Draft and a Drafts
// member's guesses: passloop.MaxDraft (its tests hold them equal).
const MaxGuesses = 8

// Drafts are the shadow's guesses for pass Pass of batch Batch, which it
// ran ahead, sent as soon as it has made them: member Seqs[i]'s rows
// begin at position Pos[i] with token Tokens[i][0], and the rest of
// Tokens[i] (at most MaxGuesses) are the tokens it guessed come next,
// each drawn as the main node draws (model.Sampler.Guess). The main node
// checks them in its pass where it starts there with that token.
type Drafts struct {
	_msgpack struct{} `msgpack:",as_array"`
	Batch    uint64
	Pass     int64
	Seqs     []uint64
	Pos      []int
	Tokens   [][]int32
}

// Sampling is how the main node chooses a sequence's tokens (model.Sampling
// on the wire): temperature, the top-p and top-k cuts, the seed of its
// counter-based draw, OpenAI's presence and frequency penalties and
// logit biases (BiasIDs[i] gets Biases[i]); PromptLen is the request's
// prompt length, so that the token at position PromptLen+k is its k-th
// choice; Constrained says a grammar limits the choices too.
type Sampling struct {
	_msgpack            struct{} `msgpack:",as_array"`
	Temperature, TopP   float64
	TopK                int
	Seed                uint64
	Presence, Frequency float64
	BiasIDs             []int32
	Biases              []float64
	PromptLen           int
	Constrained         bool
	// Grammar is the constraint's grammar (grammar.Grammar.Spec), when
	// it is one: the shadow keeps its guesses inside it.
	Grammar []byte
	// MinP is the min-p cut; Repeat, RepeatN and RepeatTail the repeat
	// penalty, over the last RepeatN tokens (RepeatTail: the prompt's)
	MinP       float64
	Repeat     float64
	RepeatN    int
	RepeatTail []int32
}

// MaxRepeatN bounds a repeat penalty's window (and so the prompt tail a
// Sampling carries): model.MaxRepeatN (main's tests hold them equal).
const MaxRepeatN = 4096

// maxBiases bounds Sampling's logit biases: a vocabulary's worth (OpenAI
// takes 300 a request; a vocabulary of a few hundred thousand tokens at
// most is what any could name).
const maxBiases = 1 << 20

// SequenceEnd tells a worker or the shadow that the main node is done with
// sequence Seq: what it keeps for that sequence (hints, pass marks,
// the shadow's copy of it) can go.
type SequenceEnd struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	// Last, when not 0, is the last pass (a batch's pass) of Seq the
	// main node sent the shadow an alignment for: alignments travel on
	// other streams and may come after this message, so the shadow keeps
	// the sequence until it has run that pass.
	Last int64
}

// Heartbeat is a liveness probe: a worker answers one with one carrying
// the same Seq and its own clock.
type Heartbeat struct {
	_msgpack struct{} `msgpack:",as_array"`
	Seq      uint64
	UnixNano int64
}

// StatsRequest asks a worker for its counters; it answers with WorkerStats.
type StatsRequest struct {
	_msgpack struct{} `msgpack:",as_array"`
}

// WorkerStats are a worker's counters since it started.
type WorkerStats struct {
	_msgpack        struct{}      `msgpack:",as_array"`
	Loads           int64         `json:"loads"`            // experts loaded (hinted or not)
	Hits            int64         `json:"hits"`             // requests whose expert was hinted
	Misses          int64         `json:"misses"`           // requests whose expert was loaded on demand
	WastedLoads     int64         `json:"wasted_loads"`     // hinted loads evicted unused
	Refused         int64         `json:"refused"`          // loads or requests refused for lack of device memory
	LatePredictions int64         `json:"late_predictions"` // predictions that arrived after their layer ran
	LoadTime        time.Duration `json:"load_ns"`
	ComputeTime     time.Duration `json:"compute_ns"`
	StallTime       time.Duration `json:"stall_ns"`
	DeviceBudget    int64         `json:"device_budget_bytes"`
	DevicePeak      int64         `json:"device_peak_bytes"`
	DeviceInUse     int64         `json:"device_in_use_bytes"`
	RSSPeak         int64         `json:"rss_peak_bytes"`
	HostCacheHits   int64         `json:"host_cache_hits"`
	HostCacheMisses int64         `json:"host_cache_misses"`
	HostCacheBytes  int64         `json:"host_cache_bytes"`
	// Resident are requests served by an expert an earlier request left
	// resident (Activation.Cache), ResidentEvicted the resident experts
	// dropped for room; ResidentExperts and ResidentBytes are what is
	// resident now.
	ResidentHits    int64 `json:"resident_hits"`
	ResidentEvicted int64 `json:"resident_evicted"`
	ResidentExperts int64 `json:"resident_experts"`
	ResidentBytes   int64 `json:"resident_bytes"`
	// HostCompressed* are the compressed tier's: chunk reads served from
	// host memory, chunk reads that went to the store, bytes held.
	HostCompressedHits   int64 `json:"host_compressed_hits"`
	HostCompressedMisses int64 `json:"host_compressed_misses"`
	HostCompressedBytes  int64 `json:"host_compressed_bytes"`
	// Withdrawn are predicted loads the shadow withdrew before any request
	// used them, WithdrawnBytes their size.
	WithdrawnLoads int64 `json:"withdrawn_loads"`
	WithdrawnBytes int64 `json:"withdrawn_bytes"`
	// CPU is the CPU time the worker process has used so far (0 where
	// the platform does not say).
	CPU time.Duration `json:"cpu_ns"`
	// StoreFetched is the bytes of its store the worker fetched from
	// other nodes (-fetch-from) and StoreServed those it served to nodes
	// fetching their share (package fetch), since it started.
	StoreFetched, StoreServed int64
}

// Placement tells the shadow which worker owns each expert when experts
// stay resident (-residency on; sched.Placement): it hints a predicted
// expert to its owner, where the main node will run it. The main node
// sends it when the shadow connects and whenever it migrates experts;
// Version orders them.
type Placement struct {
	_msgpack struct{} `msgpack:",as_array"`
	Version  uint64
	Workers  int
	Experts  int     // per layer
	Layers   []int32 // the layers that have experts, ascending
	Owners   []int32 // len(Layers)*Experts, layer-major
}

// ShadowDone tells the main node that the shadow has finished pass
// Pass of sequence Seq (every prediction of it sent), and what that
// cost it.
type ShadowDone struct {
	_msgpack      struct{} `msgpack:",as_array"`
	Seq           uint64
	Pass          int64
	LateDeparture time.Duration // applying the alignment before departing
	Forward       time.Duration // the forward pass
	RSSPeak       int64         // the shadow process's peak resident memory
	// Ahead is how many passes past the main node's latest alignment
	// the pass ran, on tokens the shadow sampled itself (0: it departed
	// on the main node's alignment).
	Ahead int64
	// Agreed and Rewound count, since the main node connected, the
	// members' rows of passes run ahead whose alignment met them: on the
	// same token, or on another (the shadow rewound that member's row and
	// ran it again).
	Agreed, Rewound int64
	// RewoundSeqs are the members whose rows this pass rewound (their
	// token guessed wrong): each member's alignment period answers for
	// its own guesses.
	RewoundSeqs []uint64
	// AgreedSeqs are the members whose rows this pass met (their token
	// guessed right), one entry a row: with RewoundSeqs, the main node
	// counts the guesses by the kind of request each member is.
	AgreedSeqs []uint64
	// Unhinted counts, since the main node connected, the layers the
	// shadow predicted after the main node had started a later pass
	// (it had fallen behind): it told the main node but hinted no loads.
	Unhinted int64
	// Reused counts, since the main node connected, the tokens whose KV
	// rows the shadow copied from a finished sequence that started with
	// them (its prefix cache) instead of running them.
	Reused int64
	// CPU is the CPU time the shadow process has used so far, a staged
	// shadow's first stage's with its stages' (as their rows said): the
	// main node's decode figures take the shadow's CPU over a run's
	// decode from it.
	CPU time.Duration
}

// Trace drives the swarm's timeline recording (internal/trace). The main
// node sends a window (From..To) to start recording those passes
// afresh, Clock to read the receiver's clock (the answer carries only
// UnixNano), then Collect to ask for what was recorded; the answer is a
// Trace with Events, Dropped and the sender's clock.
type Trace struct {
	_msgpack struct{} `msgpack:",as_array"`
	From, To int64    // the passes to record
	Collect  bool     // send back the events recorded
	Events   []trace.Event
	Dropped  int   // events the node did not keep
	UnixNano int64 // the sender's clock when it sent this message
	Clock    bool  // send back only the clock
}

// Request error codes (Error.Code). Values are part of the protocol.
const (
	ReqBadRequest uint32 = 1 // the request does not fit the receiver (unknown expert, wrong sizes)
	ReqOverBudget uint32 = 2 // a worker's device memory budget would be exceeded
	ReqLoadFailed uint32 = 3 // the expert could not be read from the store (corrupt, missing)
	ReqInternal   uint32 = 4 // anything else
)

// Error reports a failure to handle a request (an unknown expert, a
// device budget exceeded) without closing the connection. It is also a
// Go error.
type Error struct {
	_msgpack struct{} `msgpack:",as_array"`
	Code     uint32
	Msg      string
	Pass     int64
	Layer    int
	Expert   int
	ID       uint64 // the request's (Activation.ID), 0 if none
	Seq      uint64 // the request's sequence
}

func (e *Error) Error() string {
	return fmt.Sprintf("remote error %d at pass %d layer %d expert %d: %s", e.Code, e.Pass, e.Layer, e.Expert, e.Msg)
}

func (*Hello) Type() Type        { return typeHello }
func (*Prediction) Type() Type   { return typePrediction }
func (*Activation) Type() Type   { return typeActivation }
func (*ExpertResult) Type() Type { return typeExpertResult }
func (*Alignment) Type() Type    { return typeAlignment }
func (*Heartbeat) Type() Type    { return typeHeartbeat }
func (*Error) Type() Type        { return typeError }
func (*Trace) Type() Type        { return typeTrace }
func (*SequenceEnd) Type() Type  { return typeSequenceEnd }
func (*StatsRequest) Type() Type { return typeStatsRequest }
func (*WorkerStats) Type() Type  { return typeWorkerStats }
func (*ShadowDone) Type() Type   { return typeShadowDone }
func (*Placement) Type() Type    { return typePlacement }
func (*Withdraw) Type() Type     { return typeWithdraw }
func (*Drafts) Type() Type       { return typeDrafts }
func (*FetchRequest) Type() Type { return typeFetchRequest }
func (*FetchData) Type() Type    { return typeFetchData }
func (*Place) Type() Type        { return typePlace }
func (*ShareIn) Type() Type      { return typeShareIn }

func malformed(format string, a ...any) error { return connErrorf(CodeMalformed, nil, format, a...) }

func nonNegative(what string, v ...int64) error {
	for _, x := range v {
		if x < 0 {
			return malformed("%s %d is negative", what, x)
		}
	}
	return nil
}

func (m *Hello) validate() error {
	if m.Name == "" || !m.Role.Valid() {
		return malformed("hello from %q with role %q", m.Name, m.Role)
	}
	if !(m.LoadBytesSec >= 0) || math.IsInf(m.LoadBytesSec, 1) || m.DeviceMemBytes < 0 {
		return malformed("hello from %q: load bandwidth %v B/s, device memory %d B", m.Name, m.LoadBytesSec, m.DeviceMemBytes)
	}
	return nil
}

func (m *Prediction) validate() error {
	if m.Token < -1 {
		return malformed("prediction fed token %d", m.Token)
	}
	if len(m.Workers) > 0 && len(m.Workers) != len(m.Experts) {
		return malformed("prediction names workers for %d of %d experts", len(m.Workers), len(m.Experts))
	}
	return nonNegative("pass/layer", m.Pass, int64(m.Layer))
}

func (m *Withdraw) validate() error {
	return nonNegative("withdrawn pass/layer", m.From, int64(m.Layer))
}

func (m *Activation) validate() error {
	if err := nonNegative("pass/layer/tokens", m.Pass, int64(m.Layer), int64(m.Tokens)); err != nil {
		return err
	}
	if len(m.RowCounts) > 0 || len(m.Rows) > 0 {
		if len(m.RowCounts) != len(m.Experts) {
			return malformed("activation has row counts for %d experts, and %d experts", len(m.RowCounts), len(m.Experts))
		}
		sum := 0
		for _, c := range m.RowCounts {
			if c < 1 {
				return malformed("activation gives an expert %d rows", c)
			}
			sum += int(c)
		}
		if sum != len(m.Rows) {
			return malformed("activation row counts add up to %d, and it has %d rows", sum, len(m.Rows))
		}
		for _, r := range m.Rows {
			if r < 0 || int(r) >= m.Tokens {
				return malformed("activation row %d outside its %d tokens", r, m.Tokens)
			}
		}
	}
	return m.Hidden.Validate()
}

// ExpertRows returns the rows of Hidden expert j runs on: Rows' share of
// it, or nil when every expert runs on every row.
func (m *Activation) ExpertRows(j int) []int32 {
	if len(m.RowCounts) == 0 {
		return nil
	}
	off := 0
	for _, c := range m.RowCounts[:j] {
		off += int(c)
	}
	return m.Rows[off : off+int(m.RowCounts[j])]
}

func (m *ExpertResult) validate() error {
	if err := nonNegative("pass/layer/expert", m.Pass, int64(m.Layer), int64(m.Expert)); err != nil {
		return err
	}
	return m.Output.Validate()
}

func (m *Alignment) validate() error {
	if err := nonNegative("pass/from", m.Pass, int64(m.FromPos)); err != nil {
		return err
	}
	switch {
	case m.Batch == 0:
		return malformed("alignment of sequence %d pass %d outside a pass (batch 0)", m.Seq, m.Pass)
	case m.BatchPass < 1 || m.BatchSize < 1:
		return malformed("alignment in batch %d: pass %d of %d sequences", m.Batch, m.BatchPass, m.BatchSize)
	case m.PromptLeft < 0 || m.PromptLeft > 0 && len(m.Chunk) == 0:
		return malformed("alignment in batch %d: %d prompt tokens left after a chunk of %d", m.Batch, m.PromptLeft, len(m.Chunk))
	}
	if len(m.Values) != 0 && len(m.Keys) != len(m.Values) {
		return malformed("alignment has %d key and %d value tensors", len(m.Keys), len(m.Values))
	}
	switch {
	case m.Pos < 0 || m.Draft < 0 || m.Draft > MaxGuesses || len(m.Guesses) > MaxGuesses:
		return malformed("alignment of sequence %d at position %d: %d guesses, %d to draft (at most %d)", m.Seq, m.Pos, len(m.Guesses), m.Draft, MaxGuesses)
	case len(m.Guesses) > 0 && (m.Token < 0 || len(m.Chunk) > 0):
		return malformed("alignment of sequence %d: guesses after token %d and a chunk of %d", m.Seq, m.Token, len(m.Chunk))
	}
	if s := m.Sampling; s != nil {
		switch {
		case len(s.BiasIDs) != len(s.Biases) || len(s.BiasIDs) > maxBiases:
			return malformed("sampling of sequence %d: %d bias ids for %d biases (at most %d)", m.Seq, len(s.BiasIDs), len(s.Biases), maxBiases)
		case s.PromptLen < 0 || s.TopK < 0 || !(s.Temperature >= 0) || !(s.TopP >= 0):
			return malformed("sampling of sequence %d: prompt of %d, top_k %d, temperature %v, top_p %v", m.Seq, s.PromptLen, s.TopK, s.Temperature, s.TopP)
		case !(s.MinP >= 0 && s.MinP <= 1) || !(s.Repeat >= 0) || s.RepeatN < 0 || s.RepeatN > MaxRepeatN || len(s.RepeatTail) > s.RepeatN:
			return malformed("sampling of sequence %d: min_p %v, repeat penalty %v over %d tokens (a prompt tail of %d)", m.Seq, s.MinP, s.Repeat, s.RepeatN, len(s.RepeatTail))
		}
	}
	return validTensors(m.Keys, m.Values)
}

// validTensors checks every tensor of each list (Tensor.Validate).
func validTensors(lists ...[]Tensor) error {
	for _, ts := range lists {
		for i := range ts {
			if err := ts[i].Validate(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *Heartbeat) validate() error    { return nil }
func (m *SequenceEnd) validate() error  { return nil }
func (m *StatsRequest) validate() error { return nil }

func (m *WorkerStats) validate() error {
	return nonNegative("worker counter", m.Loads, m.Hits, m.Misses, m.WastedLoads, m.Refused, m.LatePredictions,
		int64(m.LoadTime), int64(m.ComputeTime), int64(m.StallTime), m.DeviceBudget, m.DevicePeak, m.DeviceInUse, m.RSSPeak,
		m.HostCacheHits, m.HostCacheMisses, m.HostCacheBytes, m.ResidentHits, m.ResidentEvicted, m.ResidentExperts, m.ResidentBytes,
		m.HostCompressedHits, m.HostCompressedMisses, m.HostCompressedBytes, m.WithdrawnLoads, m.WithdrawnBytes, int64(m.CPU), m.StoreFetched, m.StoreServed)
}

func (m *Placement) validate() error {
	if m.Workers < 1 || m.Experts < 1 || len(m.Owners) != len(m.Layers)*m.Experts {
		return malformed("placement of %d experts x %d layers over %d workers with %d owners", m.Experts, len(m.Layers), m.Workers, len(m.Owners))
	}
	for _, w := range m.Owners {
		if w < 0 || int(w) >= m.Workers {
			return malformed("placement names worker %d of %d", w, m.Workers)
		}
	}
	return nil
}

func (m *Drafts) validate() error {
	if len(m.Pos) != len(m.Seqs) || len(m.Tokens) != len(m.Seqs) {
		return malformed("drafts of pass %d: %d members, %d positions, %d rows", m.Pass, len(m.Seqs), len(m.Pos), len(m.Tokens))
	}
	for i, rows := range m.Tokens {
		if len(rows) < 1 || len(rows) > 1+MaxGuesses || m.Pos[i] < 0 {
			return malformed("drafts of pass %d: member %d at position %d with %d rows (1 to %d)", m.Pass, m.Seqs[i], m.Pos[i], len(rows), 1+MaxGuesses)
		}
	}
	return nonNegative("drafts pass", m.Pass)
}

func (m *FetchRequest) validate() error {
	if m.Offset < 0 || m.Size < 0 || m.Size > MaxFetchBytes {
		return malformed("fetch of %d bytes at %d (at most %d)", m.Size, m.Offset, MaxFetchBytes)
	}
	if len(m.File) > maxFetchName || len(m.Tensor) > maxFetchName {
		return malformed("fetch of a name of %d bytes (at most %d)", max(len(m.File), len(m.Tensor)), maxFetchName)
	}
	if !m.Model && (m.File != "" || m.Tensor != "") {
		return malformed("fetch of file %q or tensor %q from the expert store: only the model has them", m.File, m.Tensor)
	}
	return nil
}

func (m *FetchData) validate() error { return nil }

func (m *ShareIn) validate() error { return nonNegative("share fetched", m.Fetched) }

func (m *Place) validate() error {
	if m.Worker < 0 || m.Worker >= m.Workers || m.Group < 1 || m.Workers%m.Group != 0 {
		return malformed("place: worker %d of %d in groups of %d", m.Worker, m.Workers, m.Group)
	}
	if len(m.Peers) != 0 && len(m.Peers) != m.Workers {
		return malformed("place: %d peers' addresses for %d workers", len(m.Peers), m.Workers)
	}
	if len(m.Holders) > maxPlaceHolders {
		return malformed("place: %d holders' addresses (at most %d)", len(m.Holders), maxPlaceHolders)
	}
	for _, a := range slices.Concat(m.Peers, m.Holders) {
		if len(a) > maxFetchName {
			return malformed("place: a peer's address of %d bytes", len(a))
		}
	}
	return nil
}

func (m *ShadowDone) validate() error {
	return nonNegative("shadow pass/durations", m.Pass, int64(m.LateDeparture), int64(m.Forward), m.RSSPeak, m.Ahead, m.Agreed, m.Rewound, m.Unhinted, int64(m.CPU))
}
func (m *Error) validate() error { return nil }

func (m *Trace) validate() error {
	if m.From < 0 || m.To < m.From && m.To != 0 {
		return malformed("trace window %d..%d", m.From, m.To)
	}
	if len(m.Events) > trace.MaxEvents {
		return malformed("trace of %d events, more than %d", len(m.Events), trace.MaxEvents)
	}
	for i := range m.Events {
		if err := m.Events[i].Valid(); err != nil {
			return malformed("trace event %d: %v", i, err)
		}
	}
	return nil
}
