package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/synth"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/rs/zerolog"
)

// localGenerator runs each generation on its own session of a resident
// model: local mode.
type localGenerator struct {
	m *model.Model
	// ended counts generations that have returned, and how
	mu    sync.Mutex
	ended []error
}

func (g *localGenerator) Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	sess := model.NewSession(g.m, model.NewResidentExperts(g.m), len(prompt)+opt.MaxTokens)
	ids, st, err := model.Generate(ctx, sess, prompt, opt)
	g.mu.Lock()
	g.ended = append(g.ended, err)
	g.mu.Unlock()
	return ids, st, err
}

// waitEnded waits up to timeout for the first generation to return:
// whether one has, and how it ended.
func (g *localGenerator) waitEnded(timeout time.Duration) (bool, error) {
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		g.mu.Lock()
		ended := slices.Clone(g.ended)
		g.mu.Unlock()
		if len(ended) > 0 {
			return true, ended[0]
		}
		if time.Now().After(deadline) {
			return false, nil
		}
	}
}

// gatedGenerator holds every generation until open is closed.
type gatedGenerator struct {
	Generator
	open chan struct{}
}

func (g gatedGenerator) Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, model.GenerateStats{}, ctx.Err()
	}
	return g.Generator.Generate(ctx, prompt, opt)
}

// plainChat is a chat template for tests: "role: content" lines and
// "assistant:" to generate; an assistant's tool calls in Hermes' syntax.
type plainChat struct{}

func (plainChat) Render(vars map[string]any) (string, error) {
	var b strings.Builder
	for _, m := range vars["messages"].([]any) {
		mm, ok := m.(map[string]any)
		if raw, isRaw := m.(json.RawMessage); isRaw {
			ok = json.Unmarshal(raw, &mm) == nil
		}
		if !ok {
			return "", fmt.Errorf("message %v", m)
		}
		fmt.Fprintf(&b, "%s: %s\n", mm["role"], mm["content"])
		calls, _ := mm["tool_calls"].([]any)
		for _, c := range calls {
			fn := c.(map[string]any)["function"].(map[string]any)
			fmt.Fprintf(&b, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", fn["name"], fn["arguments"])
		}
	}
	if vars["add_generation_prompt"] == true {
		b.WriteString("assistant:")
	}
	return b.String(), nil
}

type fixture struct {
	m   *model.Model
	tok *tokenizer.Tokenizer
	gen *localGenerator
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := synth.Generate(dir, synth.Options{Preset: "tiny", Seed: 3}); err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(dir, model.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{m: m, tok: tok, gen: &localGenerator{m: m}}
}

func (f *fixture) server(t *testing.T, mod func(*Config)) *httptest.Server {
	t.Helper()
	cfg := Config{Model: "tiny", Tokenizer: f.tok, Chat: plainChat{}, Context: f.m.Config.MaxPositions, Generator: f.gen, Log: zerolog.Nop()}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return hs
}

// reference is what local mode generates greedily for text (encoded as
// a completion prompt is).
func (f *fixture) reference(t *testing.T, prompt []int, n int) string {
	t.Helper()
	sess := model.NewSession(f.m, model.NewResidentExperts(f.m), len(prompt)+n)
	ids, _, err := model.Generate(context.Background(), sess, prompt, model.GenerateOptions{MaxTokens: n, StopAtEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	return f.tok.Decode(ids, true)
}

func post(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	return send(t, http.MethodPost, url, body)
}

// send is method url (a JSON body, if any)'s response and its body.
func send(t *testing.T, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// events reads a server-sent event stream: the data of every event, up
// to and without [DONE] (done says whether it came).
func events(t *testing.T, r io.Reader) (data []map[string]any, done bool) {
	t.Helper()
	return eventsOf[map[string]any](t, r)
}

// eventsOf is events with each event's data decoded into a T.
func eventsOf[T any](t *testing.T, r io.Reader) (data []T, done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if payload == "[DONE]" {
			return data, true
		}
		var v T
		if err := json.Unmarshal([]byte(payload), &v); err != nil {
			t.Fatalf("event %q: %v", payload, err)
		}
		data = append(data, v)
	}
	return data, false
}

func TestCompletionIsLocalModesGreedyText(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	resp, body := post(t, hs.URL+"/v1/completions", `{"model":"tiny","prompt":"The quick brown fox","max_tokens":12,"temperature":0}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var got completionResponse
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	prompt := f.tok.Encode("The quick brown fox", true)
	want := f.reference(t, prompt, 12)
	if len(got.Choices) != 1 || got.Choices[0].Text != want {
		t.Fatalf("text %+v, want %q", got.Choices, want)
	}
	if got.Object != "text_completion" || got.Usage == nil || got.Usage.PromptTokens != len(prompt) || got.Usage.TotalTokens != len(prompt)+got.Usage.CompletionTokens {
		t.Fatalf("response %+v usage %+v", got, got.Usage)
	}
	if fr := *got.Choices[0].FinishReason; (fr != "length" || got.Usage.CompletionTokens != 12) && fr != "stop" {
		t.Fatalf("finish %q after %d tokens", fr, got.Usage.CompletionTokens)
	}
}

// TestStreamedChatEqualsTheWholeAnswer: the streamed deltas of a chat
// completion concatenate to the non-streamed message, start with the
// assistant role, end with a finish reason, the usage chunk and [DONE].
func TestStreamedChatEqualsTheWholeAnswer(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	const req = `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Name a colour."}],"max_tokens":10,"temperature":0%s}`
	resp, body := post(t, hs.URL+"/v1/chat/completions", fmt.Sprintf(req, ""))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var whole chatResponse
	json.Unmarshal(body, &whole)
	if whole.Object != "chat.completion" || len(whole.Choices) != 1 || whole.Choices[0].Message.Role != "assistant" {
		t.Fatalf("response %s", body)
	}
	prompt := f.tok.Encode("system: Be brief.\nuser: Name a colour.\nassistant:", false)
	if want := f.reference(t, prompt, 10); *whole.Choices[0].Message.Content != want {
		t.Fatalf("content %q, want local mode's %q", *whole.Choices[0].Message.Content, want)
	}

	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(fmt.Sprintf(req, `,"stream":true,"stream_options":{"include_usage":true}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	evs, done := events(t, resp.Body)
	if !done || len(evs) < 3 {
		t.Fatalf("%d events, [DONE] %v", len(evs), done)
	}
	var text strings.Builder
	var finish any
	for i, ev := range evs[:len(evs)-1] {
		if ev["object"] != "chat.completion.chunk" {
			t.Fatalf("event %d: %v", i, ev)
		}
		ch := ev["choices"].([]any)[0].(map[string]any)
		delta := ch["delta"].(map[string]any)
		if i == 0 && delta["role"] != "assistant" {
			t.Fatalf("first delta %v", delta)
		}
		if c, ok := delta["content"].(string); ok {
			text.WriteString(c)
		}
		if ch["finish_reason"] != nil {
			finish = ch["finish_reason"]
		}
	}
	last := evs[len(evs)-1]
	u, _ := last["usage"].(map[string]any)
	if text.String() != *whole.Choices[0].Message.Content || finish != *whole.Choices[0].FinishReason {
		t.Fatalf("streamed %q (%v), whole %q (%v)", text.String(), finish, *whole.Choices[0].Message.Content, *whole.Choices[0].FinishReason)
	}
	if u == nil || int(u["prompt_tokens"].(float64)) != whole.Usage.PromptTokens || int(u["completion_tokens"].(float64)) != whole.Usage.CompletionTokens {
		t.Fatalf("usage chunk %v, whole %+v", last, whole.Usage)
	}
}

// TestStopStringCutsTheText: a stop string taken from the greedy answer
// ends it just before, and is not in the text.
func TestStopStringCutsTheText(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	full := f.reference(t, f.tok.Encode("Once upon a time", true), 24)
	if len([]rune(full)) < 8 {
		t.Fatalf("reference text %q too short for the test", full)
	}
	runes := []rune(full)
	stop := string(runes[len(runes)/2 : len(runes)/2+2])
	want := full[:strings.Index(full, stop)]
	for _, stream := range []bool{false, true} {
		b, _ := json.Marshal(map[string]any{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stop": []string{"no such text", stop}, "stream": stream})
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		var text string
		var finish any
		if stream {
			evs, _ := events(t, resp.Body)
			for _, ev := range evs {
				ch := ev["choices"].([]any)[0].(map[string]any)
				text += ch["text"].(string)
				if ch["finish_reason"] != nil {
					finish = ch["finish_reason"]
				}
			}
		} else {
			var cr completionResponse
			json.NewDecoder(resp.Body).Decode(&cr)
			text, finish = cr.Choices[0].Text, *cr.Choices[0].FinishReason
		}
		resp.Body.Close()
		if text != want || finish != "stop" {
			t.Fatalf("stream %v, stop %q: %q (%v), want %q (stop)", stream, stop, text, finish, want)
		}
	}
}

// TestBadRequestsGetOpenAIErrorsAndServingGoesOn sends each kind of bad
// request, checks its status and error body, and checks a good request
// still succeeds after them.
func TestBadRequestsGetOpenAIErrorsAndServingGoesOn(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.Context = 64 })
	long := strings.Repeat("word ", 200)
	longIDs := strings.Repeat("5, ", 99) + "5" // 100 ids: past the context of 64 after tokenizing
	for _, c := range []struct {
		path, body string
		status     int
		param      string
	}{
		{"/v1/completions", `{"prompt": "hi", "max_tokens": `, 400, ""},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": -1}`, 400, "max_tokens"},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": "many"}`, 400, "max_tokens"},
		{"/v1/completions", `{"model": "gpt-4", "prompt": "hi"}`, 404, "model"},
		{"/v1/completions", `{"prompt": "` + long + `"}`, 400, "prompt"},
		{"/v1/completions", `{"prompt": "hi", "max_tokens": 1000}`, 400, "max_tokens"},
		{"/v1/completions", `{"prompt": "hi", "n": 2}`, 400, "n"},
		{"/v1/completions", `{"prompt": "hi", "temperature": 3}`, 400, "temperature"},
		{"/v1/completions", `{"prompt": [1, 99999999]}`, 400, "prompt"},
		{"/v1/completions", `{"prompt": [` + longIDs + `]}`, 400, "prompt"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "` + long + `"}]}`, 400, "messages"},
		{"/v1/completions", `{}`, 400, "prompt"},
		{"/v1/chat/completions", `{"messages": []}`, 400, "messages"},
		{"/v1/chat/completions", `{"messages": [{"content": "no role"}]}`, 400, "messages[0].role"},
		{"/v1/chat/completions", `[1, 2]`, 400, ""},
	} {
		resp, body := post(t, hs.URL+c.path, c.body)
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != c.status || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("%s %s: status %d, body %s (want %d and an OpenAI error)", c.path, c.body, resp.StatusCode, body, c.status)
		}
		if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Fatalf("%s %s: param %v, want %q (%s)", c.path, c.body, e.Error.Param, c.param, e.Error.Message)
		}
	}
	resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 3}`)
	if resp.StatusCode != 200 {
		t.Fatalf("after the bad requests: status %d: %s", resp.StatusCode, body)
	}
}

// TestClientHangingUpEndsItsSequence: a client that goes away mid-stream
// ends its generation early (the generator returns with an error, not
// after its 4000 tokens) and the server goes on serving.
func TestClientHangingUpEndsItsSequence(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/completions",
		strings.NewReader(`{"prompt": "hi", "max_tokens": 4000, "ignore_eos": true, "stream": true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // the first event
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	// the hang-up shows as the request's cancelled context or as a failed
	// write to the stream, whichever comes first
	ok, ended := f.gen.waitEnded(10 * time.Second)
	switch {
	case !ok:
		t.Fatal("the generation went on after its client hung up")
	case ended == nil:
		t.Fatal("the generation ran to its end after its client hung up")
	}
	if resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2}`); resp.StatusCode != 200 {
		t.Fatalf("after the hang-up: %d %s", resp.StatusCode, body)
	}
}

// TestFullQueueIsRefusedWith503: with one place in the batch and one in
// the queue, a third request is refused at once; the first two complete.
func TestFullQueueIsRefusedWith503(t *testing.T) {
	f := newFixture(t)
	open := make(chan struct{})
	hs := f.server(t, func(c *Config) {
		c.MaxBatch, c.MaxQueue = 1, 1
		c.Generator = gatedGenerator{Generator: f.gen, open: open}
	})
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Go(func() {
			resp, _ := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2}`)
			codes[i] = resp.StatusCode
		})
		// let the first take the batch's place before the second queues
		waitFor(t, hs.URL, "odmoe_batch_size 1")
		if i == 1 {
			waitFor(t, hs.URL, "odmoe_requests_waiting 1")
		}
	}
	resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2}`)
	if resp.StatusCode != 503 || !strings.Contains(string(body), "busy") {
		t.Fatalf("third request: %d %s", resp.StatusCode, body)
	}
	close(open)
	wg.Wait()
	if codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("queued requests: %v", codes)
	}
}

// waitFor polls /metrics until it has the line.
func waitFor(t *testing.T, url, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(b), "\n") {
				if l == line {
					return
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("/metrics never showed %q", line)
}

// TestConcurrentGreedyRequestsEachGetTheirOwnAnswer: four requests at
// once each return exactly what they return alone.
func TestConcurrentGreedyRequestsEachGetTheirOwnAnswer(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	prompts := []string{"The quick brown fox", "Hello", "Once upon a time there", "1 2 3 4"}
	ask := func(p string) string {
		b, _ := json.Marshal(map[string]any{"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": true})
		resp, body := post(t, hs.URL+"/v1/completions", string(b))
		if resp.StatusCode != 200 {
			t.Errorf("%q: %d %s", p, resp.StatusCode, body)
			return ""
		}
		var cr completionResponse
		json.Unmarshal(body, &cr)
		return cr.Choices[0].Text
	}
	alone := make([]string, len(prompts))
	for i, p := range prompts {
		alone[i] = ask(p)
	}
	together := make([]string, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() { together[i] = ask(p) })
	}
	wg.Wait()
	for i := range prompts {
		if together[i] != alone[i] {
			t.Fatalf("%q: together %q, alone %q", prompts[i], together[i], alone[i])
		}
	}
}

func TestModelsAndHealth(t *testing.T) {
	f := newFixture(t)
	var health atomic.Pointer[Health]
	health.Store(&Health{Ready: false, Down: []string{"w2", "shadow"}})
	hs := f.server(t, func(c *Config) { c.Health = func() Health { return *health.Load() } })
	resp, err := http.Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml modelList
	json.NewDecoder(resp.Body).Decode(&ml)
	resp.Body.Close()
	if len(ml.Data) != 1 || ml.Data[0].ID != "tiny" || ml.Data[0].MaxModelLen != f.m.Config.MaxPositions {
		t.Fatalf("models %+v", ml)
	}
	resp, err = http.Get(hs.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(b), `"w2"`) || !strings.Contains(string(b), `"shadow"`) {
		t.Fatalf("healthz with w2 and the shadow down: %d %s", resp.StatusCode, b)
	}
	health.Store(&Health{Ready: true})
	if resp, err = http.Get(hs.URL + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz when ready: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
}

// recordingChat renders like plainChat and keeps the variables of its
// latest rendering.
type recordingChat struct {
	mu   sync.Mutex
	last map[string]any
}

func (r *recordingChat) Render(vars map[string]any) (string, error) {
	r.mu.Lock()
	r.last = vars
	r.mu.Unlock()
	return plainChat{}.Render(vars)
}

// TestChatTemplateGetsTheClientsJSON: tools and messages reach the
// template as the client wrote them (key order, numbers), so the
// template's tojson prints what Hugging Face's would.
func TestChatTemplateGetsTheClientsJSON(t *testing.T) {
	f := newFixture(t)
	rec := &recordingChat{}
	hs := f.server(t, func(c *Config) { c.Chat = rec })
	const tools = `[{"type":"function","function":{"name":"f","parameters":{"z":1.0,"a":2}}}]`
	const msg = `{"role":"user","content":"hi","zeta":3.0}`
	resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages":[`+msg+`],"tools":`+tools+`,"max_tokens":1,"chat_template_kwargs":{"enable_thinking":false}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	rec.mu.Lock()
	vars := rec.last
	rec.mu.Unlock()
	if got, ok := vars["tools"].(json.RawMessage); !ok || string(got) != tools {
		t.Fatalf("tools reached the template as %T %v", vars["tools"], vars["tools"])
	}
	if got, ok := vars["messages"].([]any)[0].(json.RawMessage); !ok || string(got) != msg {
		t.Fatalf("the message reached the template as %T %v", vars["messages"].([]any)[0], vars["messages"].([]any)[0])
	}
	if got, ok := vars["enable_thinking"].(json.RawMessage); !ok || string(got) != "false" {
		t.Fatalf("enable_thinking reached the template as %T %v", vars["enable_thinking"], vars["enable_thinking"])
	}
}

// prefixGenerator is a generator with a prefix cache that held the
// first cached tokens of every prompt.
type prefixGenerator struct {
	Generator
	cached int
}

func (g prefixGenerator) Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error) {
	ids, st, err := g.Generator.Generate(ctx, prompt, opt)
	st.CachedTokens = g.cached
	return ids, st, err
}

// TestUsageReportsCachedPromptTokens: the prompt tokens a generation
// reused from the prefix cache are the usage's
// prompt_tokens_details.cached_tokens, as OpenAI reports them, and are
// counted in /metrics with the request as a hit.
func TestUsageReportsCachedPromptTokens(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.Generator = prefixGenerator{Generator: f.gen, cached: 3} })
	resp, body := post(t, hs.URL+"/v1/completions", `{"model":"tiny","prompt":"The quick brown fox","max_tokens":4}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var got struct {
		Usage map[string]any `json:"usage"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	details, _ := got.Usage["prompt_tokens_details"].(map[string]any)
	if cached, _ := details["cached_tokens"].(float64); cached != 3 {
		t.Fatalf("usage %v: want prompt_tokens_details.cached_tokens 3", got.Usage)
	}
	waitFor(t, hs.URL, "odmoe_prompt_cached_tokens_total 3")
	waitFor(t, hs.URL, "odmoe_prefix_cache_hits_total 1")
}

// TestAPIKeyIsRequiredOnEveryRouteButHealthz: with Config.APIKey, a
// request without the bearer token or with another gets 401 in OpenAI's
// error shape (code invalid_api_key) on the API and /metrics; the right
// key is served; /healthz answers load balancers without one.
func TestAPIKeyIsRequiredOnEveryRouteButHealthz(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.APIKey = "sk-test-key" })
	do := func(method, path, key, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	completion := `{"prompt": "hi", "max_tokens": 2}`
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/completions", completion}, {"POST", "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`},
		{"GET", "/v1/models", ""}, {"GET", "/metrics", ""},
	} {
		for _, key := range []string{"", "sk-wrong", "sk-test-key-but-longer"} {
			status, body := do(c.method, c.path, key, c.body)
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if status != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error.Code != "invalid_api_key" || e.Error.Message == "" {
				t.Errorf("%s %s with key %q: %d %s, want 401 with an invalid_api_key error", c.method, c.path, key, status, body)
			}
		}
		if status, body := do(c.method, c.path, "sk-test-key", c.body); status != http.StatusOK {
			t.Errorf("%s %s with the key: %d %s", c.method, c.path, status, body)
		}
	}
	if status, body := do("GET", "/healthz", "", ""); status != http.StatusOK {
		t.Errorf("/healthz without a key: %d %s", status, body)
	}
}

func TestLoopbackTellsWhereTheAPIIsReachable(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "[::1]:80": true, "0.0.0.0:8080": false, "[::]:8080": false, "192.168.1.7:8080": false} {
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := loopback(a); got != want {
			t.Errorf("loopback(%s) = %v, want %v", addr, got, want)
		}
	}
}

// TestServeWarnsWhenTheAPIIsOpenBeyondThisMachine: listening on every
// interface without a key logs a warning naming the address; with a key,
// or on loopback, no warning.
func TestServeWarnsWhenTheAPIIsOpenBeyondThisMachine(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		addr, key string
		warn      bool
	}{{"0.0.0.0:0", "", true}, {"0.0.0.0:0", "k", false}, {"127.0.0.1:0", "", false}} {
		var logs strings.Builder
		s, err := New(Config{Model: "tiny", Tokenizer: f.tok, Context: f.m.Config.MaxPositions, Generator: f.gen, APIKey: c.key, Log: zerolog.New(&logs)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var bound string
		if err := s.Serve(ctx, c.addr, func(a net.Addr) { bound = a.String(); cancel() }); err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(logs.String(), "without an API key") && strings.Contains(logs.String(), bound)
		if warned != c.warn {
			t.Errorf("-http %s, key %q: warned %v, want %v; logs:\n%s", c.addr, c.key, warned, c.warn, logs.String())
		}
	}
}

// TestAPromptPastTheContextIsRefusedBeforeItIsTokenized: a prompt whose
// bytes alone prove it longer than the context is refused without being
// tokenized (context_length_exceeded, in either endpoint), and a body
// larger than any prompt of the context could need is refused as it is
// read (413), so neither holds more memory than a request can use.
func TestAPromptPastTheContextIsRefusedBeforeItIsTokenized(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	s, err := New(Config{Model: "tiny", Tokenizer: f.tok, Context: f.m.Config.MaxPositions, Generator: f.gen, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", s.maxPromptBytes+1)
	body, _ := json.Marshal(map[string]any{"prompt": long, "max_tokens": 1})
	if int64(len(body)) >= s.maxBody {
		t.Fatalf("the fixture's prompt bound %d and body bound %d leave no room for the test", s.maxPromptBytes, s.maxBody)
	}
	resp, b := post(t, hs.URL+"/v1/completions", string(body))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "context_length_exceeded") || !strings.Contains(string(b), "bytes has more") {
		t.Errorf("a %d-byte prompt: %d %s", len(long), resp.StatusCode, b)
	}
	chat, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": long}}, "max_tokens": 1})
	resp, b = post(t, hs.URL+"/v1/chat/completions", string(chat))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "context_length_exceeded") {
		t.Errorf("a %d-byte chat message: %d %s", len(long), resp.StatusCode, b)
	}
	huge, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("b", int(s.maxBody)), "max_tokens": 1})
	resp, b = post(t, hs.URL+"/v1/completions", string(huge))
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "context") {
		t.Errorf("a %d-byte body (bound %d): %d %s", len(huge), s.maxBody, resp.StatusCode, b)
	}
	// a prompt under the bound is still tokenized and answered
	if resp, b := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 2}`); resp.StatusCode != http.StatusOK {
		t.Errorf("a short prompt: %d %s", resp.StatusCode, b)
	}
}

// TestABodyTricklingInIsCutOff: a client that sends its headers and then
// its body a byte at a time is answered once BodyTimeout passes at the
// latest, whatever the route, and its connection closed: 408 where the
// body is read, the route's own answer (a 404, a 401 without the API
// key) where it is not; net/http would otherwise read the rest of a small
// body, with no deadline, before it answers.
func TestABodyTricklingInIsCutOff(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct {
		path, key string
		want      int
		body      string
	}{
		{"/v1/completions", "", http.StatusRequestTimeout, "did not arrive within"},
		{"/v1/chat/completions", "", http.StatusRequestTimeout, "did not arrive within"},
		{"/v1/nope", "", http.StatusNotFound, ""},
		{"/v1/completions", "secret", http.StatusUnauthorized, "missing API key"},
	} {
		s, err := New(Config{Model: "tiny", Tokenizer: f.tok, Context: f.m.Config.MaxPositions, Generator: f.gen, BodyTimeout: 300 * time.Millisecond,
			APIKey: c.key, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		resp, b := trickle(t, s, c.path)
		if resp.StatusCode != c.want || !strings.Contains(b, c.body) {
			t.Errorf("a trickling body to %s (key %q): %d %s, want %d", c.path, c.key, resp.StatusCode, b, c.want)
		}
		if !resp.Close {
			t.Errorf("a trickling body to %s (key %q): the connection stays open", c.path, c.key)
		}
	}
}

// trickle serves s and sends it a POST to path whose 1,000-byte body
// comes a byte every 50 ms, until the server answers (within 10 s).
func trickle(t *testing.T, s *Server, path string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() }) }()
	defer func() { cancel(); <-served }()
	c, err := net.Dial("tcp", <-addrc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", path)
	done := make(chan struct{})
	stop := make(chan struct{})
	go func() { // trickle: a byte every 50 ms until the server hangs up
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a body trickling to %s: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestEveryOpenAIRequestFieldIsHonouredOrRefusedByName walks the request
// fields of OpenAI's API reference for chat completions and completions
// (this list is the reference's, not the server's): a field the server
// acts on, or one that cannot change an answer (who asked, what to store,
// a cache key), is answered; any other, set to a value that would change
// the answer, is refused with a 400 naming it, and accepted at its
// neutral value. None is ignored silently.
func TestEveryOpenAIRequestFieldIsHonouredOrRefusedByName(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	type field struct {
		name, value string // value: one that asks for something
		refused     bool   // else answered
		neutral     string // refused fields: a value that asks for nothing, answered
	}
	chat := []field{
		{name: "model", value: `"tiny"`},
		{name: "max_tokens", value: `2`},
		{name: "max_completion_tokens", value: `2`},
		{name: "temperature", value: `0.7`},
		{name: "top_p", value: `0.9`},
		{name: "seed", value: `7`},
		{name: "stop", value: `["\n"]`},
		{name: "stream", value: `true`},
		{name: "tools", value: `[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]`},
		{name: "parallel_tool_calls", value: `false`},
		{name: "user", value: `"u-1"`},
		{name: "metadata", value: `{"k": "v"}`},
		{name: "store", value: `true`},
		{name: "service_tier", value: `"default"`},
		{name: "prompt_cache_key", value: `"k"`},
		{name: "safety_identifier", value: `"s"`},
		{name: "n", value: `2`, refused: true, neutral: `1`},
		{name: "logprobs", value: `true`},
		{name: "frequency_penalty", value: `0.5`},
		{name: "presence_penalty", value: `-0.5`},
		{name: "logit_bias", value: `{"5": 100}`},
		{name: "response_format", value: `{"type": "json_object"}`},
		{name: "top_logprobs", value: `3`, refused: true, neutral: `0`},              // without logprobs: true
		{name: "tool_choice", value: `"required"`, refused: true, neutral: `"auto"`}, // without tools
		{name: "functions", value: `[{"name": "f", "parameters": {}}]`, refused: true, neutral: `[]`},
		{name: "function_call", value: `{"name": "f"}`, refused: true, neutral: `"none"`},
		{name: "audio", value: `{"voice": "alloy", "format": "wav"}`, refused: true, neutral: `null`},
		{name: "modalities", value: `["text", "audio"]`, refused: true, neutral: `["text"]`},
		{name: "prediction", value: `{"type": "content", "content": "x"}`, refused: true, neutral: `null`},
		{name: "reasoning_effort", value: `"low"`, refused: true, neutral: `null`},
		{name: "verbosity", value: `"low"`, refused: true, neutral: `null`},
		{name: "web_search_options", value: `{}`, refused: true, neutral: `null`},
		{name: "stream_options", value: `{"include_usage": true}`, refused: true, neutral: `null`}, // without stream: true
	}
	completion := []field{
		{name: "model", value: `"tiny"`},
		{name: "max_tokens", value: `2`},
		{name: "temperature", value: `0.7`},
		{name: "top_p", value: `0.9`},
		{name: "seed", value: `7`},
		{name: "stop", value: `"\n"`},
		{name: "stream", value: `true`},
		{name: "user", value: `"u-1"`},
		{name: "n", value: `2`, refused: true, neutral: `1`},
		{name: "best_of", value: `2`, refused: true, neutral: `1`},
		{name: "echo", value: `true`, refused: true, neutral: `false`},
		{name: "suffix", value: `"end"`, refused: true, neutral: `""`},
		{name: "logprobs", value: `2`},
		{name: "frequency_penalty", value: `0.5`},
		{name: "presence_penalty", value: `0.5`},
		{name: "logit_bias", value: `{"5": -100}`},
		{name: "stream_options", value: `{"include_usage": true}`, refused: true, neutral: `null`},
	}
	// llama-server's samplers, on both endpoints: honoured, or refused
	llama := []field{
		{name: "min_p", value: `0.1`},
		{name: "repeat_penalty", value: `1.1`},
		{name: "repeat_last_n", value: `32`},
		{name: "mirostat", value: `2`, refused: true, neutral: `0`},
		{name: "typical_p", value: `0.9`, refused: true, neutral: `1`},
		{name: "tfs_z", value: `0.9`, refused: true, neutral: `1.0`},
		{name: "dry_multiplier", value: `0.8`, refused: true, neutral: `0`},
		{name: "xtc_probability", value: `0.5`, refused: true, neutral: `0`},
		{name: "dynatemp_range", value: `0.5`, refused: true, neutral: `0`},
		{name: "n_probs", value: `5`, refused: true, neutral: `0`},
		{name: "grammar", value: `"root ::= \"a\""`, refused: true, neutral: `""`},
		{name: "json_schema", value: `{"type": "object"}`, refused: true, neutral: `{}`},
	}
	chat, completion = append(chat, llama...), append(completion, llama...)
	for _, ep := range []struct {
		path, base string
		fields     []field
	}{
		{"/v1/chat/completions", `"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2`, chat},
		{"/v1/completions", `"prompt": "hi", "max_tokens": 2`, completion},
	} {
		ask := func(name, value string) (int, string) {
			body := "{" + ep.base + fmt.Sprintf(", %q: %s}", name, value)
			if name == "max_tokens" { // the base's, replaced
				body = strings.Replace(body, `"max_tokens": 2, `, "", 1)
			}
			resp, b := post(t, hs.URL+ep.path, body)
			var e struct {
				Error struct {
					Param *string `json:"param"`
				} `json:"error"`
			}
			json.Unmarshal(b, &e)
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			return resp.StatusCode, param
		}
		for _, fl := range ep.fields {
			status, param := ask(fl.name, fl.value)
			switch {
			case fl.refused && (status != 400 || param != fl.name):
				t.Errorf("%s %s: %s: status %d, param %q; want 400 naming it", ep.path, fl.name, fl.value, status, param)
			case !fl.refused && status != 200:
				t.Errorf("%s %s: %s: status %d; want it answered", ep.path, fl.name, fl.value, status)
			}
			if fl.refused {
				if status, _ := ask(fl.name, fl.neutral); status != 200 {
					t.Errorf("%s %s: %s (asking for nothing): status %d; want it answered", ep.path, fl.name, fl.neutral, status)
				}
			}
		}
	}
}

// A POST body must be JSON: a form or plain text (what a browser page
// may send anywhere without a CORS preflight) is refused with 415 naming
// the type, before its body is read; JSON with a charset is taken.
func TestPostBodiesMustBeJSON(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	body := `{"prompt": "hi", "max_tokens": 2}`
	for ct, want := range map[string]int{"text/plain": 415, "application/x-www-form-urlencoded": 415, "": 415, "multipart/form-data; boundary=x": 415,
		"application/json": 200, "application/json; charset=utf-8": 200, "Application/JSON": 200} {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/completions", strings.NewReader(body))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == 415 && !strings.Contains(string(b), "application/json") {
			t.Errorf("Content-Type %q: %d %s, want %d", ct, resp.StatusCode, b, want)
		}
	}
}

// A prompt is a string or token ids, or one of those in an array (OpenAI's
// batch form with one entry), nothing deeper: a prompt nested 9,990 deep
// is refused by name before any work (each level was parsed again:
// issue 54 measured 3.9 s of CPU for 20 KB); a message's content parts
// are bounded (1,024) and joined in one pass (28,500 took 1.3 s there).
func TestPromptsAndContentPartsAreBoundedBeforeAnyWork(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	for prompt, want := range map[string]int{`["Once upon a time"]`: 200, `[[5, 6, 7]]`: 200, `[["Once"]]`: 400,
		strings.Repeat("[", 9990) + "1" + strings.Repeat("]", 9990): 400} {
		resp, b := post(t, hs.URL+"/v1/completions", `{"max_tokens": 2, "prompt": `+prompt+`}`)
		if resp.StatusCode != want || want == 400 && !strings.Contains(string(b), `"param":"prompt"`) {
			t.Errorf("prompt %.30s...: %d %s, want %d", prompt, resp.StatusCode, b, want)
		}
	}
	parts := func(n int) string {
		p := make([]string, n)
		for i := range p {
			p[i] = `{"type": "text", "text": "a"}`
		}
		return `{"max_tokens": 2, "messages": [{"role": "user", "content": [` + strings.Join(p, ",") + `]}]}`
	}
	if resp, b := post(t, hs.URL+"/v1/chat/completions", parts(1024)); resp.StatusCode != 200 {
		t.Errorf("1,024 content parts: %d %s", resp.StatusCode, b)
	}
	if resp, b := post(t, hs.URL+"/v1/chat/completions", parts(28500)); resp.StatusCode != 400 || !strings.Contains(string(b), "28500 parts, at most 1024") {
		t.Errorf("28,500 content parts: %d %s, want a 400 naming the limit", resp.StatusCode, b)
	}
}

// TestAClientThatDoesNotReadEndsItsOwnRequest: a streaming client that
// never reads (its socket's receive buffer small, so the server's writes
// block soon) has its generation ended with an error well before its
// 4,000 tokens, by the write deadline or the bound on queued events,
// instead of the node holding every event; the server goes on serving.
func TestAClientThatDoesNotReadEndsItsOwnRequest(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.StreamWriteTimeout = 300 * time.Millisecond })
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}}
	body := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "ignore_eos": true, "stream": true, "logprobs": true, "top_logprobs": 20}`
	req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // never read
	ok, ended := f.gen.waitEnded(60 * time.Second)
	switch {
	case !ok:
		t.Fatal("the generation went on for a client that read nothing")
	case ended == nil:
		t.Fatal("the generation ran its 4,000 tokens for a client that read nothing")
	}
	t.Logf("ended: %v", ended)
	if resp, b := post(t, hs.URL+"/v1/completions", `{"prompt": "hi", "max_tokens": 3}`); resp.StatusCode != 200 {
		t.Fatalf("after the slow reader: %d %s", resp.StatusCode, b)
	}
}

// TestLlamaSamplersAreHonoured: min_p 1 at any temperature keeps the
// likeliest token alone (the greedy answer); a repeat penalty changes a
// greedy answer that repeats itself, and repeat_last_n 0 turns it off;
// values out of range are 400s naming the field.
func TestLlamaSamplersAreHonoured(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	answer := func(extra string) string {
		t.Helper()
		resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": "hi there", "max_tokens": 24, "ignore_eos": true, `+extra+`}`)
		var c completionResponse
		if resp.StatusCode != 200 || json.Unmarshal(body, &c) != nil {
			t.Fatalf("%s: %d %s", extra, resp.StatusCode, body)
		}
		return c.Choices[0].Text
	}
	greedy := answer(`"temperature": 0`)
	if got := answer(`"temperature": 2, "seed": 5, "min_p": 1`); got != greedy {
		t.Errorf("min_p 1 at temperature 2: %q, want the greedy %q", got, greedy)
	}
	if got := answer(`"temperature": 2, "seed": 5`); got == greedy {
		t.Errorf("temperature 2 without min_p gave the greedy answer: the test shows nothing")
	}
	if got := answer(`"temperature": 0, "repeat_penalty": 5`); got == greedy {
		t.Errorf("repeat_penalty 5 left the greedy answer %q as it was", greedy)
	}
	if got := answer(`"temperature": 0, "repeat_penalty": 5, "repeat_last_n": 0`); got != greedy {
		t.Errorf("repeat_last_n 0: %q, want the greedy %q", got, greedy)
	}
	for _, bad := range []struct{ field, value string }{{"min_p", "1.5"}, {"repeat_penalty", "0"}, {"repeat_penalty", "11"}, {"repeat_last_n", "-2"}, {"repeat_last_n", "5000"}} {
		resp, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt": "hi", "max_tokens": 2, %q: %s}`, bad.field, bad.value))
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"`+bad.field+`"`) {
			t.Errorf("%s %s: %d %s, want 400 naming it", bad.field, bad.value, resp.StatusCode, body)
		}
	}
}
