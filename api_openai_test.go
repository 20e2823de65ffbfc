package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/internal/noderef"
	"github.com/odmoe/odmoe/internal/schematest"
	"github.com/odmoe/odmoe/serve"
)

// The official OpenAI client (the `openai` npm package, pinned in
// testdata/openai) is the reference API client, as Hugging Face's
// tokenizers are the reference tokenizer: install it with
//
//	npm ci --prefix testdata/openai
//
// (`make test` does). Without it the client's subtest skips, or fails
// when CI=true.
const openaiClientJS = "testdata/openai/client.mjs"

// openaiClient returns node, or skips the test (fails it when CI=true)
// when node or the client package is missing.
func openaiClient(t *testing.T) string {
	t.Helper()
	_, node := noderef.Require(t, "testdata/openai/node_modules", "openai", "npm ci --prefix testdata/openai")
	return node
}

// apiTestKey is the API key the test's main node requires (-api-key) and
// every client of the test sends: the official client as OPENAI_API_KEY,
// Go's as a bearer token.
const apiTestKey = "sk-odmoe-test"

// apiSwarm is a swarm of processes serving the API: 4 workers, an int8
// shadow and a main node with -http and -prefetch shadow.
type apiSwarm struct {
	*chaosRig
	base   string // http://ADDR/v1
	served string // the model's name in the API
}

func startAPISwarm(t testing.TB) *apiSwarm {
	t.Helper()
	return startAPISwarmOf(t, tinyModel(t))
}

// startAPISwarmOf is such a swarm of the model directory model.
func startAPISwarmOf(t testing.TB, model string) *apiSwarm {
	t.Helper()
	r := newChaosRigOf(t, 4, model)
	certs := filepath.Join(r.dir, "certs")
	for i, addr := range r.workers {
		name := fmt.Sprintf("w%d", i+1)
		r.start(name, "run", "-role", "worker", "-listen", addr, "-store", r.store, "-certs", certs, "-name", name,
			"-device-mem", "64MiB", "-log-level", "warn")
	}
	r.startShadow()
	r.start("main", "run", "-role", "main", "-model", r.model, "-workers", strings.Join(r.workers, ","), "-group", "2",
		"-certs", certs, "-name", "main", "-prefetch", "shadow", "-shadow", r.shadow,
		"-http", "127.0.0.1:0", "-api-key", apiTestKey, "-log-json", "-log-level", "info")
	s := &apiSwarm{chaosRig: r, served: filepath.Base(r.model)}
	// the port the kernel chose is in the main node's log; /healthz says
	// when every worker and the shadow are connected
	deadline := time.Now().Add(60 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if s.base == "" {
			addr := servingAddr(filepath.Join(r.dir, "main.log"))
			if addr == "" {
				continue
			}
			s.base = "http://" + addr + "/v1"
		}
		resp, err := http.Get(strings.TrimSuffix(s.base, "/v1") + "/healthz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return s
		}
	}
	t.Fatalf("the main node did not serve a healthy API within 60 s (base %q)\n%s", s.base, r.logs())
	return nil
}

// servingAddr is the address in the JSON log's "serving the
// OpenAI-compatible API" line, or "".
func servingAddr(logFile string) string {
	b, _ := os.ReadFile(logFile)
	for _, line := range strings.Split(string(b), "\n") {
		var l struct{ Message, Addr string }
		if json.Unmarshal([]byte(line), &l) == nil && strings.HasPrefix(l.Message, serve.ServingMessage) {
			return l.Addr
		}
	}
	return ""
}

// apiUsage is the API's usage object.
type apiUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// apiResult is one call of client.mjs: its text, finish reason and
// usage, or the server's refusal.
type apiResult struct {
	Text             string    `json:"text"`
	Role             string    `json:"role"`
	Deltas           int       `json:"deltas"`
	FinishReason     string    `json:"finish_reason"`
	Usage            *apiUsage `json:"usage"`
	Object           string    `json:"object"`
	ChunksAfterUsage int       `json:"chunks_after_usage"`
	Error            *struct {
		Status  int    `json:"status"`
		Message string `json:"message"`
	} `json:"error"`
}

// complete posts a greedy, non-streamed completion of prompt to the
// swarm with Go's HTTP client.
func (s *apiSwarm) complete(ctx context.Context, prompt string, maxTokens int) (apiResult, error) {
	body, _ := json.Marshal(map[string]any{"model": s.served, "prompt": prompt, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/completions", bytes.NewReader(body))
	if err != nil {
		return apiResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiTestKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return apiResult{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return apiResult{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return apiResult{}, fmt.Errorf("completion of %q: %s: %s", prompt, resp.Status, b)
	}
	var out struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		}
		Usage *apiUsage
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		return apiResult{}, fmt.Errorf("completion of %q: %s (%v)", prompt, b, err)
	}
	return apiResult{Text: out.Choices[0].Text, FinishReason: out.Choices[0].FinishReason, Usage: out.Usage}, nil
}

// metric reads one sample of the API's /metrics ("name" or
// `name{label="v",...}` as the exposition format spells it); 0 when absent.
func (s *apiSwarm) metric(t *testing.T, name string) float64 {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(s.base, "/v1")+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiTestKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, v)
			}
			return f
		}
	}
	return 0
}

// localReference runs `odmoe run -role local` on prompt for n greedy
// tokens: the text it prints after the prompt, and the prompt's and the
// generation's token counts (-dump).
func localReference(t *testing.T, model, prompt string, n int) (text string, promptTokens, generated int) {
	t.Helper()
	dump := filepath.Join(t.TempDir(), "dump")
	so, se, code := run(t, "", "run", "-role", "local", "-model", model, "-prompt", prompt, "-n", strconv.Itoa(n), "-dump", dump, "-log-level", "warn")
	if code != 0 {
		t.Fatalf("local exit %d: %s", code, se)
	}
	var toks struct{ Prompt, Generated []int }
	b, err := os.ReadFile(filepath.Join(dump, "tokens.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &toks); err != nil {
		t.Fatal(err)
	}
	// stdout: the prompt, the generated text, a newline, the summary (the
	// text itself may hold newlines)
	if !strings.HasPrefix(so, prompt) {
		t.Fatalf("local mode printed %q, not the prompt first", so)
	}
	rest := strings.TrimPrefix(so, prompt)
	i := strings.LastIndex(rest, "\nprompt tokens: ")
	if i < 0 {
		t.Fatalf("local mode's summary line is missing:\n%s", so)
	}
	return rest[:i], len(toks.Prompt), len(toks.Generated)
}

// hasChatTemplate reports whether the model directory has a chat template
// (tokenizer_config.json's chat_template, or chat_template.jinja).
func hasChatTemplate(t *testing.T, model string) bool {
	t.Helper()
	if _, err := os.Stat(filepath.Join(model, "chat_template.jinja")); err == nil {
		return true
	}
	b, err := os.ReadFile(filepath.Join(model, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	return len(cfg.ChatTemplate) > 0 && string(cfg.ChatTemplate) != "null"
}

// TestOpenAIAPIOnASwarmOfProcesses serves the OpenAI-compatible API from
// a swarm of real processes (4 workers, an int8 shadow, the main node with
// -http and -prefetch shadow) and checks it with the official OpenAI client
// and with plain HTTP: completions equal local mode's text, streamed equals
// not streamed, usage counts the tokens, concurrent (batched) requests
// each equal the request alone, and a client that hangs up mid-stream
// ends its sequence and leaves the server serving.
func TestOpenAIAPIOnASwarmOfProcesses(t *testing.T) {
	s := startAPISwarm(t)

	t.Run("OfficialClient", func(t *testing.T) {
		node := openaiClient(t)
		const prompt, n = "Hello world", 24
		want, promptTokens, generated := localReference(t, s.model, prompt, n)
		cmd := exec.Command(node, openaiClientJS, s.base, s.served, prompt, strconv.Itoa(n))
		cmd.Env = append(os.Environ(), "OPENAI_API_KEY="+apiTestKey)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		so, err := cmd.Output()
		if err != nil {
			t.Fatalf("client.mjs: %v\n%s\n%s", err, stderr.String(), s.logs())
		}
		type modelResult struct {
			ID, Object string
			Error      *struct{ Status int }
		}
		var got struct {
			Models       []struct{ ID, Object string } `json:"models"`
			Model        modelResult                   `json:"model"`
			MissingModel modelResult                   `json:"missing_model"`
			ChatStream   apiResult                     `json:"chat_stream"`
			Chat         apiResult                     `json:"chat"`
			Completion   apiResult                     `json:"completion"`
			CompStrm     apiResult                     `json:"completion_stream"`
		}
		if err := json.Unmarshal(so, &got); err != nil {
			t.Fatalf("client.mjs printed %s: %v", so, err)
		}
		t.Logf("client.mjs: %s", so)

		if len(got.Models) != 1 || got.Models[0].ID != s.served || got.Models[0].Object != "model" {
			t.Errorf("models.list() = %+v, want one model %q", got.Models, s.served)
		}
		if m := got.Model; m.Error != nil || m.ID != s.served || m.Object != "model" {
			t.Errorf("models.retrieve(%q) = %+v", s.served, m)
		}
		if m := got.MissingModel; m.Error == nil || m.Error.Status != 404 {
			t.Errorf("models.retrieve of a model not served = %+v, want a 404", m)
		}

		// completions: local mode's text and token counts, streamed or not
		wantFinish := "length"
		if generated < n {
			wantFinish = "stop"
		}
		wantUsage := apiUsage{PromptTokens: promptTokens, CompletionTokens: generated, TotalTokens: promptTokens + generated}
		for _, c := range []struct {
			name string
			r    apiResult
		}{{"completion", got.Completion}, {"streamed completion", got.CompStrm}} {
			switch {
			case c.r.Error != nil:
				t.Errorf("%s refused: %d %s", c.name, c.r.Error.Status, c.r.Error.Message)
			case c.r.Text != want:
				t.Errorf("%s text %q, local mode printed %q", c.name, c.r.Text, want)
			case c.r.FinishReason != wantFinish:
				t.Errorf("%s finish_reason %q, want %q (%d of %d tokens)", c.name, c.r.FinishReason, wantFinish, generated, n)
			case c.r.Usage == nil || *c.r.Usage != wantUsage:
				t.Errorf("%s usage %+v, want %+v", c.name, c.r.Usage, wantUsage)
			}
		}

		// chat completions: streamed equals not streamed, for the same
		// greedy request
		if !hasChatTemplate(t, s.model) {
			t.Fatalf("%s has no chat template: gen-tiny writes its family's into tokenizer_config.json", s.model)
		}
		cs, c := got.ChatStream, got.Chat
		if cs.Error != nil || c.Error != nil {
			t.Fatalf("chat completions refused: streamed %+v, not streamed %+v", cs.Error, c.Error)
		}
		if cs.Text != c.Text {
			t.Errorf("streamed chat text %q, not streamed %q", cs.Text, c.Text)
		}
		if c.Role != "assistant" || cs.Role != "assistant" || c.Object != "chat.completion" {
			t.Errorf("chat roles %q (streamed %q), object %q", c.Role, cs.Role, c.Object)
		}
		if cs.Text != "" && cs.Deltas == 0 {
			t.Errorf("streamed chat text %q came in no delta", cs.Text)
		}
		for _, r := range []apiResult{cs, c} {
			if r.FinishReason != "stop" && r.FinishReason != "length" {
				t.Errorf("chat finish_reason %q", r.FinishReason)
			}
			if u := r.Usage; u == nil || u.PromptTokens <= 0 || u.CompletionTokens < 1 || u.CompletionTokens > n || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
				t.Errorf("chat usage %+v (max_tokens %d)", u, n)
			}
		}
		if cs.FinishReason != c.FinishReason || cs.Usage == nil || c.Usage == nil || *cs.Usage != *c.Usage {
			t.Errorf("streamed chat ended %q with usage %+v, not streamed %q with %+v", cs.FinishReason, cs.Usage, c.FinishReason, c.Usage)
		}
		if (c.FinishReason == "length") != (c.Usage != nil && c.Usage.CompletionTokens == n) {
			t.Errorf("chat finish_reason %q after %+v of max_tokens %d", c.FinishReason, c.Usage, n)
		}
		if cs.ChunksAfterUsage != 0 {
			t.Errorf("%d chunks after the usage chunk: it must be the last", cs.ChunksAfterUsage)
		}
	})

	prompts := []string{"The capital of France is", "Once upon a time", "1, 2, 3,", "Hello world"}
	const n = 16
	alone := make([]string, len(prompts))
	t.Run("ConcurrentCompletionsEqualEachAlone", func(t *testing.T) {
		ctx := t.Context()
		for i, p := range prompts {
			r, err := s.complete(ctx, p, n)
			if err != nil {
				t.Fatal(err)
			}
			if r.Usage == nil || r.Usage.CompletionTokens != n || r.FinishReason != "length" {
				t.Fatalf("%q alone: finish %q, usage %+v (ignore_eos, max_tokens %d)", p, r.FinishReason, r.Usage, n)
			}
			alone[i] = r.Text
		}
		together := make([]apiResult, len(prompts))
		errs := make([]error, len(prompts))
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Go(func() { together[i], errs[i] = s.complete(ctx, p, n) })
		}
		wg.Wait()
		for i, p := range prompts {
			if errs[i] != nil {
				t.Errorf("%q with 3 others: %v", p, errs[i])
			} else if together[i].Text != alone[i] {
				t.Errorf("%q with 3 others gave %q, alone %q", p, together[i].Text, alone[i])
			}
		}
	})

	t.Run("AClientWithoutTheKeyIsRefused", func(t *testing.T) {
		resp, err := http.Post(s.base+"/completions", "application/json", strings.NewReader(`{"prompt": "Hello", "max_tokens": 2}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"invalid_api_key"`) {
			t.Fatalf("a completion without the key: %s %s, want 401 invalid_api_key", resp.Status, b)
		}
	})

	t.Run("ClientHangingUpMidStreamLeavesTheServerServing", func(t *testing.T) {
		const long = 4000 // far more than the hang-up lets run
		before := s.metric(t, "odmoe_generated_tokens_total")
		ctx, hangUp := context.WithCancel(t.Context())
		body, _ := json.Marshal(map[string]any{"model": s.served, "prompt": prompts[0], "max_tokens": long, "temperature": 0, "ignore_eos": true, "stream": true})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+apiTestKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		chunks := 0
		for chunks < 3 && sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: {") {
				chunks++
			}
		}
		if chunks < 3 {
			t.Fatalf("the stream ended after %d chunks: %v", chunks, sc.Err())
		}
		hangUp()
		resp.Body.Close()

		// the sequence ends: the batch empties long before max_tokens
		deadline := time.Now().Add(30 * time.Second)
		for s.metric(t, "odmoe_batch_size") != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("a sequence still generates 30 s after its client hung up\n%s", s.logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if got := s.metric(t, "odmoe_generated_tokens_total") - before; got >= long {
			t.Errorf("the hung-up request generated %v tokens: it ran to max_tokens", got)
		}
		if got := s.metric(t, `odmoe_requests_total{endpoint="completions",status="499"}`); got != 1 {
			t.Errorf("requests answered 499 (client gone): %v, want 1", got)
		}
		// and the server goes on serving, with the same answers
		r, err := s.complete(t.Context(), prompts[0], n)
		if err != nil {
			t.Fatalf("after a hang-up: %v\n%s", err, s.logs())
		}
		if alone[0] != "" && r.Text != alone[0] {
			t.Errorf("after a hang-up %q gave %q, before %q", prompts[0], r.Text, alone[0])
		}
		if !slices.Contains([]string{"stop", "length"}, r.FinishReason) {
			t.Errorf("finish_reason %q", r.FinishReason)
		}
	})
}

// TestOfficialClientGetsToolCallsStructuredOutputAndLogprobs runs the
// official client's own helpers (its stream accumulator, its parse of
// structured output) against a swarm with a shadow serving
// qwen3-moe-tiny, whose chat template writes Hermes tool calls: forced
// calls come back as tool_calls of the tools with arguments that read as
// their parameters, whole and streamed; a tool's result goes back
// through the template; 20 json_schema answers (random weights, sampled)
// parse, and an independent validator takes each for its schema;
// logprobs come one a token.
// parsedAnswer is features.mjs's answer to one strict json_schema:
// the client's parse of it, or why the client refused it.
type parsedAnswer struct {
	Name         string          `json:"name"`
	Error        string          `json:"error"`
	Parsed       json.RawMessage `json:"parsed"`
	Content      string          `json:"content"`
	FinishReason string          `json:"finish_reason"`
}

// checkParsed holds the answers to the 20 schemas of file against them
// with the independent validator, and against the client's parse.
func checkParsed(t *testing.T, file string, answers []parsedAnswer) {
	t.Helper()
	var schemas []struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
	}
	if b, err := os.ReadFile(file); err != nil || json.Unmarshal(b, &schemas) != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(answers) != len(schemas) || len(schemas) != 20 {
		t.Fatalf("%s: %d structured answers for %d schemas", file, len(answers), len(schemas))
	}
	for i, p := range answers {
		err := schematest.Validate(schematest.Compile(t, schemas[i].Schema), p.Content)
		var parsed, content any
		json.Unmarshal(p.Parsed, &parsed)
		json.Unmarshal([]byte(p.Content), &content)
		if err != nil || p.Error != "" || p.FinishReason != "stop" || !reflect.DeepEqual(parsed, content) {
			t.Errorf("%s: answer %q (finish %q, parsed %s, the client: %s): %v", p.Name, p.Content, p.FinishReason, p.Parsed, p.Error, err)
		}
	}
}

func TestOfficialClientGetsToolCallsStructuredOutputAndLogprobs(t *testing.T) {
	node := openaiClient(t)
	model := filepath.Join(t.TempDir(), "qwen3-moe-tiny")
	if _, se, code := run(t, "", "gen-tiny", "-preset", "qwen3-moe-tiny", "-out", model, "-log-level", "warn"); code != 0 {
		t.Fatalf("gen-tiny: %s", se)
	}
	s := startAPISwarmOf(t, model)
	cmd := exec.Command(node, "testdata/openai/features.mjs", s.base, s.served, "testdata/openai/schemas.json", "testdata/openai/keyword-schemas.json")
	cmd.Env = append(os.Environ(), "OPENAI_API_KEY="+apiTestKey)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	so, err := cmd.Output()
	if err != nil {
		t.Fatalf("features.mjs: %v\n%s\n%s", err, stderr.String(), s.logs())
	}
	t.Logf("features.mjs: %s", so)
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	var got struct {
		Tools struct {
			ToolCalls    []call  `json:"tool_calls"`
			Content      *string `json:"content"`
			FinishReason string  `json:"finish_reason"`
		} `json:"tools"`
		Streamed struct {
			ToolCalls    []call `json:"tool_calls"`
			FinishReason string `json:"finish_reason"`
		} `json:"streamed"`
		Roundtrip struct {
			FinishReason string `json:"finish_reason"`
		} `json:"roundtrip"`
		Parsed   []parsedAnswer `json:"parsed"`
		Keywords struct {
			Parsed  []parsedAnswer `json:"parsed"`
			Bounded struct {
				ToolCalls    []call `json:"tool_calls"`
				FinishReason string `json:"finish_reason"`
			} `json:"bounded"`
		} `json:"keywords"`
		Logprobs struct {
			Content []struct {
				Token       string  `json:"token"`
				Logprob     float64 `json:"logprob"`
				TopLogprobs []struct {
					Logprob float64 `json:"logprob"`
				} `json:"top_logprobs"`
			} `json:"content"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"logprobs"`
	}
	if err := json.Unmarshal(so, &got); err != nil {
		t.Fatal(err)
	}
	checkCalls := func(what string, calls []call, finish string, names ...string) {
		if finish != "tool_calls" || len(calls) == 0 {
			t.Fatalf("%s: finish %q with %d calls", what, finish, len(calls))
		}
		for _, c := range calls {
			var args map[string]any
			if !slices.Contains(names, c.Function.Name) || c.Type != "function" || c.ID == "" || json.Unmarshal([]byte(c.Function.Arguments), &args) != nil {
				t.Fatalf("%s: call %+v", what, c)
			}
			if c.Function.Name == "get_weather" && args["city"] != "Paris" && args["city"] != "Rome" {
				t.Fatalf("%s: get_weather arguments %s", what, c.Function.Arguments)
			}
		}
	}
	checkCalls("tool_choice required", got.Tools.ToolCalls, got.Tools.FinishReason, "get_weather", "search")
	if got.Tools.Content != nil {
		t.Errorf("content %q beside forced calls", *got.Tools.Content)
	}
	checkCalls("streamed, get_weather named", got.Streamed.ToolCalls, got.Streamed.FinishReason, "get_weather")
	if got.Roundtrip.FinishReason == "" {
		t.Error("no answer to a conversation with a tool's result")
	}
	checkParsed(t, "testdata/openai/schemas.json", got.Parsed)
	// string lengths, patterns, formats and number bounds, checked by the
	// independent validator with formats asserted
	checkParsed(t, "testdata/openai/keyword-schemas.json", got.Keywords.Parsed)
	checkCalls("a forced call with maxLength parameters", got.Keywords.Bounded.ToolCalls, got.Keywords.Bounded.FinishReason, "set_unit")
	bounded := schematest.Compile(t, []byte(`{"type": "object", "properties": {"unit": {"type": "string", "maxLength": 4}, "note": {"type": "string", "maxLength": 12}}, "required": ["unit", "note"], "additionalProperties": false}`))
	for _, c := range got.Keywords.Bounded.ToolCalls {
		if err := schematest.Validate(bounded, c.Function.Arguments); err != nil {
			t.Errorf("set_unit's arguments %s: %v", c.Function.Arguments, err)
		}
	}
	lp := got.Logprobs
	if len(lp.Content) != lp.CompletionTokens || lp.CompletionTokens == 0 {
		t.Fatalf("%d logprobs for %d tokens", len(lp.Content), lp.CompletionTokens)
	}
	for _, e := range lp.Content {
		if e.Logprob > 0 || len(e.TopLogprobs) != 2 || e.TopLogprobs[0].Logprob != e.Logprob || e.TopLogprobs[1].Logprob > e.Logprob {
			t.Errorf("greedy token %+v: not the first of its alternatives", e)
		}
	}
}
