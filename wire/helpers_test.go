package wire

import (
	"context"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/internal/trace"
	"github.com/rs/zerolog"
)

var (
	clustersMu sync.Mutex
	clusters   = map[string]string{}
)

// testCluster returns a certificate directory for main, shadow, w1 and
// w2 of the cluster named key, made once per test binary.
func testCluster(t testing.TB, key string) string {
	t.Helper()
	clustersMu.Lock()
	defer clustersMu.Unlock()
	if dir, ok := clusters[key]; ok {
		return dir
	}
	dir := filepath.Join(testTempDir, key)
	nodes, err := ParseNodes("main,shadow,w1,w2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteCerts(dir, nodes, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	clusters[key] = dir
	return dir
}

// testConfig returns a Config for node name of cluster key with short
// timeouts and the test's log.
func testConfig(t testing.TB, key, name string, peerRoles ...Role) *Config {
	t.Helper()
	certs, err := LoadCerts(testCluster(t, key), name)
	if err != nil {
		t.Fatal(err)
	}
	return &Config{
		Certs:            certs,
		PeerRoles:        peerRoles,
		HandshakeTimeout: 2 * time.Second,
		IdleTimeout:      5 * time.Second,
		DialAttempts:     1,
		Log:              testLogger(t),
	}
}

func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: zerolog.TestWriter{T: t, Frame: 6}, NoColor: true, TimeFormat: "15:04:05.000"}).
		Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

// listen starts a listener on loopback that the test closes at its end.
func listen(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	l, err := Listen(context.Background(), "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// connect dials l and returns both ends; the test closes them at its end.
func connect(t testing.TB, l *Listener, dcfg *Config) (client, server *Peer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := Dial(ctx, l.Addr().String(), dcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

func recv(t testing.TB, p *Peer) Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := p.Recv(ctx)
	if err != nil {
		t.Fatalf("recv from %v: %v", p.Identity(), err)
	}
	return m
}

func send(t testing.TB, p *Peer, m Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Send(ctx, m); err != nil {
		t.Fatalf("send %v to %v: %v", m.Type(), p.Identity(), err)
	}
}

// ramp returns n float32 values that exercise every byte: signs,
// subnormals, NaN payloads, infinities.
func ramp(n int) []float32 {
	v := make([]float32, n)
	special := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0x7fc00001)}
	for i := range v {
		if i < len(special) {
			v[i] = special[i]
			continue
		}
		v[i] = float32(i)*0.001 - 3
	}
	return v
}

// sampleMessages returns one filled message of every type but Hello
// (with a tensor of hidden float32 values where the type has one).
func sampleMessages(hidden int) []Message {
	h := Float32Tensor(ramp(hidden), 1, hidden)
	kv := func(seed byte) Tensor {
		b := make([]byte, 3*8*2)
		for i := range b {
			b[i] = seed + byte(i)
		}
		return Tensor{DType: BF16, Shape: []int{3, 8}, Data: b}
	}
	return []Message{
		&Prediction{Seq: 3, Pass: 7, Layer: 3, Experts: []int32{1, 5}, Token: 812},
		&Withdraw{Seq: 3, From: 9},
		&Prediction{Seq: 3, Pass: 7, Layer: 3, Experts: []int32{1, 5}, Token: 812, Workers: []int32{2, -1}, Partial: true},
		&Withdraw{Seq: 3, From: 9, Layer: 2, Experts: []int32{4, 6}},
		&Activation{Seq: 3, Pass: 7, Layer: 3, Tokens: 1, Experts: []int32{1, 5}, Hidden: h},
		&ExpertResult{Seq: 3, Pass: 7, Layer: 3, Expert: 5, Output: h, Loaded: true, Miss: true, LoadTime: 1500 * time.Microsecond, ComputeTime: 300 * time.Microsecond},
		&Alignment{Seq: 3, Pass: 8, Token: 31999, FromPos: 40, Keys: []Tensor{kv(1), kv(2)}, Values: []Tensor{kv(3), kv(4)}, Batch: 2, BatchPass: 8, BatchSize: 1},
		&Alignment{Seq: 4, Pass: 1, Token: -1, History: []int32{1, 2}, Batch: 2, BatchPass: 9, BatchSize: 2, Chunk: []int32{5, 6, 7}, PromptLeft: 40,
			Sampling: &Sampling{Temperature: 0.7, TopP: 0.9, TopK: 40, Seed: 1 << 63, Presence: 0.5, Frequency: -1, BiasIDs: []int32{3, 9}, Biases: []float64{-100, 2.5}, PromptLen: 43, Constrained: true}},
		&Alignment{Seq: 5, Pass: 12, Token: 17, Batch: 2, BatchPass: 10, BatchSize: 2, Pos: 90, Guesses: []int32{4, 8, 15}, Draft: 3},
		&Drafts{Batch: 2, Pass: 11, Seqs: []uint64{5, 6}, Pos: []int{94, 30}, Tokens: [][]int32{{16, 23, 42}, {7}}},
		&FetchRequest{ID: 9, Offset: 1 << 33, Size: 4096},
		&FetchRequest{ID: 10, Index: true},
		&FetchRequest{ID: 11, Model: true, Tensor: "model.layers.3.self_attn.q_proj.weight", Offset: 16 << 20, Size: 1 << 20},
		&FetchRequest{ID: 12, Model: true, File: "tokenizer.json"},
		&FetchData{ID: 9, Data: []byte{1, 2, 3}},
		&FetchData{ID: 10, Err: "no store here"},
		&Place{Worker: 3, Workers: 8, Group: 2},
		&Place{Worker: 1, Workers: 2, Group: 2, Peers: []string{"10.0.0.3:7400", "10.0.0.4:7400"}},
		&Place{Worker: 0, Workers: 2, Group: 2, Peers: []string{"10.0.0.3:7400", "10.0.0.4:7400"}, Holders: []string{"10.0.0.2:7400"}},
		&ShareIn{Fetched: 5 << 20},
		&SequenceEnd{Seq: 1 << 40, Last: 7},
		&StageRun{ID: 5, First: 2, End: 4, Seqs: []uint64{3, 1 << 40}, Starts: []int32{0, 17}, Counts: []int32{1, 1}, Hidden: Float32Tensor(ramp(2*hidden), 2, hidden), Routes: true, Batch: 9, Pass: 1 << 33, Prefill: true},
		&StageRoutes{ID: 5, Layer: 3, Experts: []int32{1, 5, 0, 7}, Weights: []float32{0.75, 0.25, 0.5, 0.5}},
		&StageRows{ID: 5, Hidden: Float32Tensor(ramp(2*hidden), 2, hidden)},
		&StageRows{ID: 6, Hidden: Float32Tensor(ramp(hidden), 1, hidden), Figures: &StageFigures{First: 2,
			Decode:  []LayerFigures{{Calls: 3, Main: 1e6, Loads: 7, Misses: 2, MissesLate: 1}, {}},
			Prefill: []LayerFigures{{Calls: 1, Experts: 5e5, Results: 4}, {Stall: 1 << 40}}}},
		&StageKV{Seq: 3, FromPos: 40, First: 2, Keys: []Tensor{kv(1), kv(2)}, Values: []Tensor{kv(3), kv(4)}},
		&StageEnd{Seq: 3},
		&Heartbeat{Seq: 99, UnixNano: 1763850000123456789},
		&StatsRequest{},
		&WorkerStats{Loads: 40, Hits: 42, Misses: 14, WastedLoads: 8, LatePredictions: 5, LoadTime: 12 * time.Millisecond, ComputeTime: 1500 * time.Microsecond,
			DeviceBudget: 1 << 30, DevicePeak: 794624, RSSPeak: 700 << 20, HostCacheHits: 3, HostCacheBytes: 1 << 20, ResidentHits: 7, ResidentEvicted: 2, ResidentExperts: 4, ResidentBytes: 4 << 20, WithdrawnLoads: 2, WithdrawnBytes: 3 << 20, CPU: 1500 * time.Millisecond, StoreFetched: 5 << 20, StoreServed: 7 << 20},
		&ShadowDone{Seq: 3, Pass: 8, LateDeparture: 50 * time.Microsecond, Forward: 30 * time.Millisecond, RSSPeak: 2 << 30, Ahead: 1, Reused: 1024, RewoundSeqs: []uint64{4, 9}, CPU: 2 * time.Second},
		&Placement{Version: 4, Workers: 3, Experts: 2, Layers: []int32{0, 2}, Owners: []int32{0, 1, 2, 0}},
		&Error{Code: 4, Msg: "expert 9 unknown", Pass: 7, Layer: 3, Expert: 9, Seq: 3},
		&Trace{From: 2, To: 4},
		&Trace{Clock: true, UnixNano: 1763850000123456789},
		&Trace{Collect: true, UnixNano: 1763850000123456789, Dropped: 1, Events: []trace.Event{
			{Node: "w1", Kind: trace.Compute, Pass: 2, Layer: 3, Expert: 5, Start: 10, End: 20},
			{Node: "w1", Kind: trace.Send, Msg: trace.MsgResult, Peer: "main", Pass: 2, Layer: 3, Expert: 5, ID: 9, Start: 21, End: 21},
		}},
	}
}

// bulk is a message that travels on a bulk stream of its own, carrying
// data (an even number of bytes) as an alignment's key rows; id goes in
// Seq.
func bulk(id uint64, data []byte) *Alignment {
	return &Alignment{Seq: id, Keys: []Tensor{{DType: BF16, Shape: []int{1, len(data) / 2}, Data: data}},
		Values: []Tensor{{DType: BF16, Shape: []int{1, 0}, Data: []byte{}}}, Batch: 1, BatchPass: 1, BatchSize: 1}
}

// bulkData is what bulk carries.
func bulkData(a *Alignment) []byte { return a.Keys[0].Data }
