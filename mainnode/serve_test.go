package mainnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/odmoe/odmoe/align"
	"github.com/odmoe/odmoe/harness/inproc"
	"github.com/odmoe/odmoe/kernels"
	"github.com/odmoe/odmoe/mainnode"
	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/odmoe/odmoe/serve"
	"github.com/rs/zerolog"
)

// TestServedConcurrentRequestsOnTheSwarmAreEachLocalModesAnswer: four
// greedy completions sent at once to the API of a main node whose swarm
// is driven by a shadow each return exactly the tokens local mode
// generates for that prompt alone, and /healthz says the swarm is ready.
func TestServedConcurrentRequestsOnTheSwarmAreEachLocalModesAnswer(t *testing.T) {
	f, err := inproc.Generate(context.Background(), t.TempDir(), "qwen3-moe-tiny", 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	local, mainModel := loadModels(t, f)
	tok, err := tokenizer.LoadDir(f.Model)
	if err != nil {
		t.Fatal(err)
	}
	sw := dialSwarm(t, f, 4, mainnode.Options{Prefetch: mainnode.Shadow, Align: align.Policy{TokenPeriod: 1, KVPeriod: 1}}, &shadowSpec{quant: kernels.Q8})
	b := sw.Batcher(mainModel)
	defer b.Close()
	srv, err := serve.New(serve.Config{Model: "m", Tokenizer: tok, Context: mainModel.Config.MaxPositions,
		Generator: b, Health: sw.Health, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()

	const n = 12
	prompts := []string{"The quick brown fox", "Hello there", "Once upon a time", "1 2 3 4 5"}
	want := make([]string, len(prompts))
	for i, p := range prompts {
		ids, _ := generateAlone(t, local, tok.Encode(p, true), n)
		want[i] = tok.Decode(ids, true)
	}
	got := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var cr struct {
				Choices []struct{ Text string } `json:"choices"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil || resp.StatusCode != 200 || len(cr.Choices) != 1 {
				t.Errorf("%q: status %d, %v", p, resp.StatusCode, err)
				return
			}
			got[i] = cr.Choices[0].Text
		})
	}
	wg.Wait()
	for i := range prompts {
		if got[i] != want[i] {
			t.Errorf("%q: served %q, local mode alone %q", prompts[i], got[i], want[i])
		}
	}
	if st, ok := sw.ShadowStats(10e9); !ok || st.Recall <= 0 {
		t.Fatalf("the shadow predicted nothing for the served sequences (recall over batched passes %v, ok %v)", st.Recall, ok)
	}
}

// generateAlone is local mode's greedy generation of n tokens (EOS
// ignored).
func generateAlone(t *testing.T, m *model.Model, prompt []int, n int) ([]int, model.GenerateStats) {
	t.Helper()
	sess := model.NewSession(m, model.NewResidentExperts(m), len(prompt)+n)
	ids, st, err := model.Generate(context.Background(), sess, prompt, model.GenerateOptions{MaxTokens: n})
	if err != nil {
		t.Fatal(fmt.Errorf("local: %w", err))
	}
	return ids, st
}
