package console

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// swarmMetrics registers the worker and shadow families the main node
// exports, by the same names and labels.
type swarmMetrics struct {
	reg    *prometheus.Registry
	up     *prometheus.GaugeVec
	loads  *prometheus.CounterVec
	budget *prometheus.GaugeVec
	causes *prometheus.CounterVec
	shadow prometheus.Gauge
	tokens prometheus.Counter
}

func newSwarmMetrics() *swarmMetrics {
	m := &swarmMetrics{reg: prometheus.NewRegistry(),
		up:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "odmoe_worker_up"}, []string{"worker"}),
		loads:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "odmoe_worker_loads_total"}, []string{"worker"}),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "odmoe_worker_device_budget_bytes"}, []string{"worker"}),
		causes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "odmoe_worker_predicted_misses_total"}, []string{"worker", "cause"}),
		shadow: prometheus.NewGauge(prometheus.GaugeOpts{Name: "odmoe_shadow_up"}),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "odmoe_generated_tokens_total"}),
	}
	m.reg.MustRegister(m.up, m.loads, m.budget, m.causes, m.shadow, m.tokens)
	return m
}

func states(t *testing.T, c *Console) map[string]string {
	t.Helper()
	s, err := c.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range s.Nodes {
		out[n.Name] = n.Role + " " + n.State
	}
	return out
}

// TestTilesFollowTheWorkersConnections: a worker whose connection is
// down is lost, back it is rejoined (for good: that it came back is
// worth showing), one a health check names with a fault is degraded;
// the main node and the shadow have tiles of their own.
func TestTilesFollowTheWorkersConnections(t *testing.T) {
	m := newSwarmMetrics()
	var degraded []string
	c := New(Config{Model: "tiny", Gatherer: m.reg, Health: func() ([]string, []string) { return nil, degraded }})
	for _, w := range []string{"w1", "w2", "w10"} {
		m.up.WithLabelValues(w).Set(1)
	}
	m.shadow.Set(1)
	m.loads.WithLabelValues("w2").Add(7)
	m.budget.WithLabelValues("w2").Set(64 << 20)
	m.causes.WithLabelValues("w2", "late").Add(3)
	m.causes.WithLabelValues("w2", "wrong").Add(2)
	steps := []struct {
		do   func()
		want map[string]string
	}{
		{func() {}, map[string]string{"main": "main live", "shadow": "shadow live", "w1": "worker live", "w2": "worker live", "w10": "worker live"}},
		{func() { m.up.WithLabelValues("w2").Set(0); m.shadow.Set(0); degraded = []string{"w2: lost: silent"} }, map[string]string{"w2": "worker lost", "shadow": "shadow lost"}},
		{func() { m.up.WithLabelValues("w2").Set(1); degraded = nil }, map[string]string{"w2": "worker rejoined", "w1": "worker live"}},
		{func() { degraded = []string{"w1: store failed a load"} }, map[string]string{"w1": "worker degraded", "w2": "worker rejoined"}},
	}
	for i, st := range steps {
		st.do()
		got := states(t, c)
		for name, want := range st.want {
			if got[name] != want {
				t.Fatalf("step %d: %s is %q, want %q (all: %v)", i, name, got[name], want, got)
			}
		}
	}
	// a worker lost and back while no snapshot looked: its rejoins say so
	rejoins := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "odmoe_worker_rejoins_total"}, []string{"worker"})
	m.reg.MustRegister(rejoins)
	rejoins.WithLabelValues("w10").Inc()
	if got := states(t, c)["w10"]; got != "worker rejoined" {
		t.Fatalf("w10 with a rejoin counted: %q", got)
	}
	s, _ := c.Snapshot()
	var order []string
	for _, n := range s.Nodes {
		order = append(order, n.Name)
		if n.Name == "w2" && (n.Loads != 7 || n.BudgetBytes != 64<<20 || n.Late != 3 || n.Wrong != 2) {
			t.Fatalf("w2's loads %v, budget %v, late %v, wrong %v; want 7, 64 MiB, 3, 2", n.Loads, n.BudgetBytes, n.Late, n.Wrong)
		}
	}
	if strings.Join(order, ",") != "main,shadow,w1,w2,w10" {
		t.Fatalf("tiles in the order %v", order)
	}
}

// TestFeedSendsSnapshotsAsServerSentEvents reads two events off the feed
// and sees the counter move between them.
func TestFeedSendsSnapshotsAsServerSentEvents(t *testing.T) {
	m := newSwarmMetrics()
	c := New(Config{Model: "tiny", Gatherer: m.reg, Period: 20 * time.Millisecond})
	hs := httptest.NewServer(http.HandlerFunc(c.Events))
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var got []Snapshot
	for sc.Scan() && len(got) < 2 {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var s Snapshot
		if err := json.Unmarshal([]byte(data), &s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
		m.tokens.Add(5)
	}
	if len(got) != 2 || got[1].Generated-got[0].Generated != 5 || got[0].Model != "tiny" || got[1].Time <= got[0].Time-1 {
		t.Fatalf("snapshots %+v", got)
	}
}

func TestSnapshotCarriesTheTimeline(t *testing.T) {
	want := []int{3, 1}
	s, err := New(Config{Gatherer: newSwarmMetrics().reg, Timeline: func() any { return want }}).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s)
	if !strings.Contains(string(b), `"passes":[3,1]`) {
		t.Fatalf("snapshot %s", b)
	}
}

func TestPageIsServedWhole(t *testing.T) {
	rec := httptest.NewRecorder()
	New(Config{}).Page(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	if rec.Code != 200 || !strings.HasPrefix(body, "<!doctype html>") || !strings.Contains(body, "/console/events") || strings.Contains(body, "http://") || strings.Contains(body, "https://") {
		t.Fatalf("%d %.200s", rec.Code, body)
	}
}

// BenchmarkSnapshot times one snapshot of the feed (gathering the
// registry and writing JSON) for 16 workers: the node's whole cost of a
// page that is open, twice a second.
func BenchmarkSnapshot(b *testing.B) {
	m := newSwarmMetrics()
	for i := range 16 {
		w := "w" + strconv.Itoa(i+1)
		m.up.WithLabelValues(w).Set(1)
		m.loads.WithLabelValues(w).Add(float64(i))
	}
	c := New(Config{Model: "tiny", Gatherer: m.reg})
	for range b.N {
		s, err := c.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(s); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSnapshotReadsTheSwarmsFigures: each of the swarm's one-value
// figures comes from its own metric, none from another's.
func TestSnapshotReadsTheSwarmsFigures(t *testing.T) {
	reg := prometheus.NewRegistry()
	names := []string{"odmoe_shadow_predicted_experts_total", "odmoe_shadow_routed_experts_total", "odmoe_shadow_lost_total",
		"odmoe_shadow_ahead_passes_total", "odmoe_shadow_align_token_period", "odmoe_shadow_align_kv_period",
		"odmoe_generated_tokens_total", "odmoe_batch_size", "odmoe_requests_waiting"}
	for i, name := range names {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
		g.Set(float64(i + 1))
		reg.MustRegister(g)
	}
	s, err := New(Config{Gatherer: reg}).Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	got := []float64{s.Predicted, s.Routed, s.ShadowLost, s.Ahead, s.AlignToken, s.AlignKV, s.Generated, s.Running, s.Waiting}
	for i, v := range got {
		if v != float64(i+1) {
			t.Errorf("%s: snapshot has %v, want %d", names[i], v, i+1)
		}
	}
}
