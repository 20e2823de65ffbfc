// Package console is the swarm's page in a browser: a chat panel that
// calls the node's own OpenAI-compatible API, and a panel with a tile
// per node (its role, whether it is live, lost, rejoined or degraded,
// what it loaded and missed) and the shadow's recall, fed by a stream of
// snapshots of the metrics the node already keeps. Plain HTML, CSS and a
// little JavaScript, embedded: no build step, nothing fetched from
// elsewhere, so it works on a LAN without internet.
package console

import (
	"embed"
	"encoding/json"
	"fmt"
	"github.com/odmoe/odmoe/internal/metricnames"
	"github.com/odmoe/odmoe/internal/procmem"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

//go:embed page
var page embed.FS

// Config is what a console shows.
type Config struct {
	Model string
	// Gatherer holds the node's metrics (the main node's registry).
	Gatherer prometheus.Gatherer
	// Health names the nodes that are down and those that serve with a
	// fault; nil: none ever are (local mode).
	Health func() (down, degraded []string)
	// Period is how often the feed sends a snapshot (default 500 ms).
	Period time.Duration
	// Timeline, if set, gives the last decode passes' layer timelines
	// (main node's compute, experts, network, waiting for loads, per
	// layer), sent as they are.
	Timeline func() any
}

// Console serves the page and its feed.
type Console struct {
	cfg Config
	mu  sync.Mutex
	// lost remembers the workers a snapshot saw lost: back, they show
	// as rejoined (as do those whose rejoins the metrics counted)
	lost map[string]bool
}

// New returns the console of cfg.
func New(cfg Config) *Console {
	if cfg.Period <= 0 {
		cfg.Period = 500 * time.Millisecond
	}
	return &Console{cfg: cfg, lost: map[string]bool{}}
}

// Page answers GET /: the page itself, which holds no data (what it
// shows comes from the feed and the API, behind the API key if there is
// one).
func (c *Console) Page(w http.ResponseWriter, r *http.Request) {
	b, err := page.ReadFile("page/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Write(b)
}

// Node is one node's tile.
type Node struct {
	Name  string `json:"name"`
	Addr  string `json:"addr,omitempty"`
	Role  string `json:"role"`  // main, shadow, worker
	State string `json:"state"` // live, lost, rejoined, degraded
	Fault string `json:"fault,omitempty"`
	// a worker's counters for this node's requests, since it started
	Results   float64 `json:"results,omitempty"`
	Loads     float64 `json:"loads,omitempty"`
	Misses    float64 `json:"misses,omitempty"`
	Late      float64 `json:"misses_late,omitempty"`  // of the misses in layers the shadow predicted: too late
	Wrong     float64 `json:"misses_wrong,omitempty"` // and not predicted
	LoadBytes float64 `json:"load_bytes,omitempty"`
	ComputeS  float64 `json:"compute_s,omitempty"`
	LoadS     float64 `json:"load_s,omitempty"`
	StallS    float64 `json:"stall_s,omitempty"`
	// as the worker last answered: device memory held and its budget,
	// experts resident
	DeviceBytes float64 `json:"device_bytes,omitempty"`
	BudgetBytes float64 `json:"budget_bytes,omitempty"`
	Resident    float64 `json:"resident_experts,omitempty"`
	Rejoins     float64 `json:"rejoins,omitempty"` // times it came back after it was lost
}

// Snapshot is what the feed sends, a few times a second: counters since
// the node started (the page takes rates from consecutive snapshots).
type Snapshot struct {
	Time      int64   `json:"time_ms"`
	Model     string  `json:"model"`
	Nodes     []Node  `json:"nodes"`
	Generated float64 `json:"generated_tokens"`
	Running   float64 `json:"requests_running"`
	Waiting   float64 `json:"requests_waiting"`
	// misses by cause (late, wrong, unscored), decode phase
	Misses map[string]float64 `json:"misses"`
	Loads  float64            `json:"loads"`
	// the shadow: experts activated that it had predicted, of those
	// scored (OD-MoE eq. 3), and its connection's losses
	Predicted  float64 `json:"shadow_predicted"`
	Routed     float64 `json:"shadow_routed"`
	ShadowLost float64 `json:"shadow_lost"`
	// decode passes it ran ahead of its alignment, and the alignment
	// periods now (passes between token and KV alignments)
	Ahead      float64 `json:"shadow_ahead"`
	AlignToken float64 `json:"align_token_period"`
	AlignKV    float64 `json:"align_kv_period"`
	// where decode's layer time went, seconds since start: the main
	// node's compute before each layer's experts, the experts from
	// sending to the last result, and of that the network and the wait
	// for loads (the layer timeline's parts, summed)
	Layers map[string]float64 `json:"layer_seconds"`
	// Passes are the last decode passes' layer timelines (Config.Timeline)
	Passes any `json:"passes,omitempty"`
	// the serving node's own process: CPU seconds used since it started
	// and resident memory
	CPU float64 `json:"cpu_seconds"`
	RSS float64 `json:"rss_bytes"`
}

// Snapshot reads the metrics now.
func (c *Console) Snapshot() (Snapshot, error) {
	s := Snapshot{Time: time.Now().UnixMilli(), Model: c.cfg.Model, Misses: map[string]float64{}, Layers: map[string]float64{},
		CPU: procmem.CPUTime().Seconds(), RSS: float64(procmem.RSS())}
	families, err := c.cfg.Gatherer.Gather()
	if err != nil {
		return s, err
	}
	var down, degraded []string
	if c.cfg.Health != nil {
		down, degraded = c.cfg.Health()
	}
	workers := map[string]*Node{}
	worker := func(name string) *Node {
		if workers[name] == nil {
			workers[name] = &Node{Name: name, Role: "worker", State: "live"}
		}
		return workers[name]
	}
	shadow := false
	shadowUp := false
	// the swarm's figures that are one value each, by metric name
	scalars := map[string]*float64{
		metricnames.ShadowPredictedExpertsTotal: &s.Predicted, metricnames.ShadowRoutedExpertsTotal: &s.Routed,
		metricnames.ShadowLostTotal: &s.ShadowLost, metricnames.ShadowAheadPassesTotal: &s.Ahead,
		metricnames.ShadowAlignTokenPeriod: &s.AlignToken, metricnames.ShadowAlignKvPeriod: &s.AlignKV,
		metricnames.GeneratedTokensTotal: &s.Generated, metricnames.BatchSize: &s.Running, metricnames.RequestsWaiting: &s.Waiting,
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := value(m)
			if set, ok := workerMetrics[f.GetName()]; ok {
				set(worker(label(m, "worker")), m, v)
				continue
			}
			if field, ok := scalars[f.GetName()]; ok {
				*field = v
				continue
			}
			switch name := f.GetName(); name {
			case metricnames.ShadowUp:
				shadow, shadowUp = true, v == 1
			case metricnames.ExpertMissesTotal:
				if label(m, "phase") == "decode" {
					s.Misses[label(m, "cause")] += v
				}
			case metricnames.ExpertLoadsTotal:
				s.Loads += v
			case metricnames.LayerMainSecondsTotal, metricnames.LayerExpertsSecondsTotal, metricnames.LayerNetworkSecondsTotal, metricnames.LayerStallSecondsTotal:
				if label(m, "phase") == "decode" {
					s.Layers[layerParts[name]] = v
				}
			}
		}
	}
	if c.cfg.Timeline != nil {
		s.Passes = c.cfg.Timeline()
	}
	s.Nodes = append(s.Nodes, Node{Name: "main", Role: "main", State: "live"})
	if shadow {
		n := Node{Name: "shadow", Role: "shadow", State: "live"}
		if !shadowUp {
			n.State = "lost"
		}
		s.Nodes = append(s.Nodes, n)
	}
	names := make([]string, 0, len(workers))
	for name := range workers {
		names = append(names, name)
	}
	slices.SortFunc(names, byNumber)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range names {
		n := workers[name]
		if slices.Contains(down, name) {
			n.State = "lost"
		}
		switch {
		case n.State == "lost":
			c.lost[name] = true
		case c.lost[name] || n.Rejoins > 0: // seen lost, or lost while no page watched
			n.State = "rejoined"
		}
		for _, d := range degraded {
			if n.State == "lost" {
				break // /healthz lists a lost worker among the degraded too
			}
			if d == name || strings.HasPrefix(d, name+" ") || strings.HasPrefix(d, name+":") {
				n.State, n.Fault = "degraded", d
			}
		}
		s.Nodes = append(s.Nodes, *n)
	}
	return s, nil
}

// layerParts name the parts of decode's layer time in a snapshot.
var layerParts = map[string]string{
	metricnames.LayerMainSecondsTotal: "main", metricnames.LayerExpertsSecondsTotal: "experts",
	metricnames.LayerNetworkSecondsTotal: "network", metricnames.LayerStallSecondsTotal: "stall",
}

// workerMetrics are the main node's per-worker families (label worker),
// each with where its value goes on the worker's tile.
var workerMetrics = map[string]func(n *Node, m *dto.Metric, v float64){
	metricnames.WorkerUp: func(n *Node, _ *dto.Metric, v float64) {
		if v == 0 {
			n.State = "lost"
		}
	},
	metricnames.WorkerInfo:                func(n *Node, m *dto.Metric, _ float64) { n.Addr = label(m, "addr") },
	metricnames.WorkerResultsTotal:        func(n *Node, _ *dto.Metric, v float64) { n.Results = v },
	metricnames.WorkerLoadsTotal:          func(n *Node, _ *dto.Metric, v float64) { n.Loads = v },
	metricnames.WorkerMissesTotal:         func(n *Node, _ *dto.Metric, v float64) { n.Misses = v },
	metricnames.WorkerLoadBytesTotal:      func(n *Node, _ *dto.Metric, v float64) { n.LoadBytes = v },
	metricnames.WorkerComputeSecondsTotal: func(n *Node, _ *dto.Metric, v float64) { n.ComputeS = v },
	metricnames.WorkerLoadSecondsTotal:    func(n *Node, _ *dto.Metric, v float64) { n.LoadS = v },
	metricnames.WorkerStallSecondsTotal:   func(n *Node, _ *dto.Metric, v float64) { n.StallS = v },
	metricnames.WorkerDeviceBytes:         func(n *Node, _ *dto.Metric, v float64) { n.DeviceBytes = v },
	metricnames.WorkerDeviceBudgetBytes:   func(n *Node, _ *dto.Metric, v float64) { n.BudgetBytes = v },
	metricnames.WorkerResidentExperts:     func(n *Node, _ *dto.Metric, v float64) { n.Resident = v },
	metricnames.WorkerRejoinsTotal:        func(n *Node, _ *dto.Metric, v float64) { n.Rejoins = v },
	metricnames.WorkerPredictedMissesTotal: func(n *Node, m *dto.Metric, v float64) {
		if label(m, "cause") == "late" {
			n.Late = v
		} else {
			n.Wrong = v
		}
	},
}

// byNumber orders w2 before w10.
func byNumber(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Events answers GET /console/events: a snapshot as a server-sent event
// every period until the client goes.
func (c *Console) Events(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	// the feed has no body to wait for: a server's read deadline for
	// one must not end it
	rc.SetReadDeadline(time.Time{})
	tick := time.NewTicker(c.cfg.Period)
	defer tick.Stop()
	for {
		if err := c.send(w, rc); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

func (c *Console) send(w http.ResponseWriter, rc *http.ResponseController) error {
	s, err := c.Snapshot()
	if err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "event: snapshot\ndata: %s\n\n", b); err != nil {
		return err
	}
	return rc.Flush()
}
