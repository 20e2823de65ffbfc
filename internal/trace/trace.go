//lint:file-ignore U1000 the _msgpack field carries msgpack's as_array struct tag

// Package trace records what each node of a swarm did and when, for a
// window of passes: main compute (M_l), shadow compute (S_l), expert
// loads (EL_l) and expert computes (EC_l) as spans, and every message
// sent or received as an instant. Joined across nodes (Join) the instants
// become network hops, so the timeline of OD-MoE's figure 2 can be drawn
// from measured timestamps.
//
// It does not own the transport (the wire carries Events between nodes)
// or the drawing (testbed).
package trace

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Kind says what an Event is. Values are part of the wire protocol.
type Kind string

// The kinds of events.
const (
	Main    Kind = "M"     // main-node compute before a layer's experts: attention, router (and, at layer 0, sampling and embedding)
	Shadow  Kind = "S"     // shadow compute up to a layer's router (Layer = the model's layer count: after the last router)
	Load    Kind = "EL"    // an expert load on a worker (store read, decompression, host-to-device link)
	Compute Kind = "EC"    // an expert compute on a worker
	Stall   Kind = "stall" // a worker's request waiting for its expert's load
	Align   Kind = "align" // the shadow applying an alignment before departing
	Send    Kind = "send"  // a message leaves (instant; Peer is the receiver)
	Recv    Kind = "recv"  // a message arrives (instant; Peer is the sender)
)

// Message names in Send and Recv events.
const (
	MsgActivation = "activation"
	MsgResult     = "result"
	MsgPrediction = "prediction"
	MsgAlignment  = "alignment"
)

// Event is one span or instant on one node.
type Event struct {
	_msgpack struct{} `msgpack:",as_array"`
	Node     string   `json:"node"`
	Kind     Kind     `json:"kind"`
	Pass     int64    `json:"it"`
	Layer    int      `json:"layer"`
	Expert   int      `json:"expert"` // -1: not about one expert
	Peer     string   `json:"peer,omitempty"`
	Msg      string   `json:"msg,omitempty"`
	ID       uint64   `json:"id,omitempty"` // an Activation's ID: joins it with its results
	Start    int64    `json:"start_ns"`     // Unix nanoseconds on the node's clock
	End      int64    `json:"end_ns"`       // = Start for an instant
}

// Valid reports whether e could have been recorded: a known kind, a
// non-negative duration, and a peer and message for instants.
func (e *Event) Valid() error {
	switch e.Kind {
	case Main, Shadow, Load, Compute, Stall, Align:
	case Send, Recv:
		if e.Peer == "" || e.Msg == "" {
			return fmt.Errorf("trace: %s event without peer or message", e.Kind)
		}
	default:
		return fmt.Errorf("trace: unknown event kind %q", e.Kind)
	}
	if e.End < e.Start || e.Node == "" {
		return fmt.Errorf("trace: %s event of node %q ends before it starts", e.Kind, e.Node)
	}
	return nil
}

// MaxEvents bounds what one Recorder keeps (a wide window on a big model
// must not grow without limit); later events are counted as dropped.
const MaxEvents = 1 << 18

// Recorder keeps the events of passes From..To (inclusive) of one
// node. A nil *Recorder records nothing; all methods are safe for
// concurrent use.
type Recorder struct {
	node   string
	window atomic.Pointer[[2]int64] // from, to: read without the lock on every message

	mu      sync.Mutex
	events  []Event
	dropped int
}

// NewRecorder returns a recorder for node that records nothing until
// Window is called.
func NewRecorder(node string) *Recorder {
	r := &Recorder{node: node}
	r.window.Store(&[2]int64{1, 0})
	return r
}

// Window starts recording passes from..to afresh: what was recorded
// before is dropped (a new sequence restarts the pass numbers).
func (r *Recorder) Window(from, to int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.window.Store(&[2]int64{from, to})
	r.events, r.dropped = nil, 0
}

// Active reports whether pass it is in the window. It takes no lock:
// callers on hot paths (every message, every layer) ask it first.
func (r *Recorder) Active(it int64) bool {
	if r == nil {
		return false
	}
	w := r.window.Load()
	return it >= w[0] && it <= w[1]
}

// Node is the name events are recorded under.
func (r *Recorder) Node() string {
	if r == nil {
		return ""
	}
	return r.node
}

func (r *Recorder) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.Active(e.Pass) { // the window moved since the caller asked
		return
	}
	if len(r.events) >= MaxEvents {
		r.dropped++
		return
	}
	e.Node = r.node
	r.events = append(r.events, e)
}

// Span records a span of kind on (it, layer, expert; -1 for none).
func (r *Recorder) Span(kind Kind, it int64, layer, expert int, start, end time.Time) {
	if !r.Active(it) {
		return
	}
	r.add(Event{Kind: kind, Pass: it, Layer: layer, Expert: expert, Start: start.UnixNano(), End: end.UnixNano()})
}

// Message records a message of pass it sent to (Send) or received
// from (Recv) peer at time at.
func (r *Recorder) Message(kind Kind, msg, peer string, it int64, layer, expert int, id uint64, at time.Time) {
	if !r.Active(it) {
		return
	}
	ns := at.UnixNano()
	r.add(Event{Kind: kind, Msg: msg, Peer: peer, Pass: it, Layer: layer, Expert: expert, ID: id, Start: ns, End: ns})
}

// Events returns a copy of what was recorded, and how many events the
// MaxEvents bound dropped.
func (r *Recorder) Events() ([]Event, int) {
	if r == nil {
		return nil, 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events), r.dropped
}

// Shift moves events of node by -offset nanoseconds: offset is how far
// that node's clock runs ahead of the reference clock.
func Shift(events []Event, offset int64) {
	for i := range events {
		events[i].Start -= offset
		events[i].End -= offset
	}
}

// File is a whole swarm's trace as the main node writes it.
type File struct {
	// From and To are the passes traced.
	From int64 `json:"from"`
	To   int64 `json:"to"`
	// Layers is the model's layer count.
	Layers int `json:"layers"`
	// Nodes lists the node names in display order: main, shadow, workers.
	Nodes []string `json:"nodes"`
	// ClockOffsetNs is, per node, how far its clock was measured ahead
	// of the main node's (events are already shifted by it).
	ClockOffsetNs map[string]int64 `json:"clock_offset_ns"`
	// ClockRTTNs is, per node, the round trip the offset was measured on:
	// the offset is right to within half of it.
	ClockRTTNs map[string]int64 `json:"clock_rtt_ns,omitempty"`
	// Dropped counts events a node did not keep (MaxEvents) or that did
	// not arrive.
	Dropped map[string]int `json:"dropped,omitempty"`
	Events  []Event        `json:"events"`
}

// Write writes f as JSON.
func (f *File) Write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetIndent("", " ")
	if err := enc.Encode(f); err != nil {
		return err
	}
	return bw.Flush()
}

// WriteFile writes f to path.
func (f *File) WriteFile(path string) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := f.Write(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ReadFile reads a trace written by WriteFile, checking every event.
func ReadFile(path string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	for i := range f.Events {
		if err := f.Events[i].Valid(); err != nil {
			return nil, fmt.Errorf("trace %s: event %d: %w", path, i, err)
		}
	}
	return &f, nil
}

// Hop is one message between two nodes: when it left and when it arrived.
type Hop struct {
	From, To string
	Msg      string
	Pass     int64
	Layer    int
	Expert   int   // a result's expert; -1 for other messages
	Sent     int64 // Unix nanoseconds
	Received int64
}

// Join pairs each Send with the Recv of the same message on its peer:
// activations by ID, results by ID and expert, predictions and
// alignments by pass and layer (and order, when a sender sends the
// same key twice). Unpaired instants are left out.
func Join(events []Event) []Hop {
	type key struct {
		from, to, msg string
		it            int64
		layer, expert int
		id            uint64
	}
	keyOf := func(e *Event, from, to string) key {
		k := key{from: from, to: to, msg: e.Msg, it: e.Pass, layer: e.Layer, expert: -1}
		switch e.Msg {
		case MsgActivation:
			k.id = e.ID
		case MsgResult:
			k.id, k.expert = e.ID, e.Expert
		}
		return k
	}
	sends, recvs := map[key][]int64{}, map[key][]int64{}
	for i := range events {
		switch e := &events[i]; e.Kind {
		case Send:
			k := keyOf(e, e.Node, e.Peer)
			sends[k] = append(sends[k], e.Start)
		case Recv:
			k := keyOf(e, e.Peer, e.Node)
			recvs[k] = append(recvs[k], e.Start)
		}
	}
	for _, s := range sends {
		slices.Sort(s)
	}
	var hops []Hop
	for k, rs := range recvs {
		ss := sends[k]
		slices.Sort(rs)
		for i := range min(len(ss), len(rs)) {
			hops = append(hops, Hop{From: k.from, To: k.to, Msg: k.msg, Pass: k.it, Layer: k.layer, Expert: k.expert, Sent: ss[i], Received: rs[i]})
		}
	}
	slices.SortFunc(hops, func(a, b Hop) int {
		return cmp.Or(cmp.Compare(a.Sent, b.Sent), cmp.Compare(a.Received, b.Received), cmp.Compare(a.From, b.From),
			cmp.Compare(a.To, b.To), cmp.Compare(a.Msg, b.Msg), cmp.Compare(a.Pass, b.Pass), cmp.Compare(a.Layer, b.Layer),
			cmp.Compare(a.Expert, b.Expert))
	})
	return hops
}
