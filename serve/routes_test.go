package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// openAIError decodes an OpenAI error body, failing unless it is one in
// JSON.
func openAIError(t *testing.T, resp *http.Response, b []byte) (message, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message, Type string
			Code          *string
		}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" || json.Unmarshal(b, &e) != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("%d %s (%s): not an OpenAI error in JSON", resp.StatusCode, b, ct)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Message, code
}

// TestUnknownRoutesAndMethodsGetOpenAIErrors: an unknown path is a 404
// and a known one asked with another method a 405 naming the method it
// answers (with Allow), both as OpenAI's JSON errors, where net/http
// would answer in text/plain.
func TestUnknownRoutesAndMethodsGetOpenAIErrors(t *testing.T) {
	hs := newFixture(t).server(t, nil)
	resp, b := send(t, "GET", hs.URL+"/v1/nosuch", "")
	if msg, code := openAIError(t, resp, b); resp.StatusCode != 404 || code != "unknown_url" || !strings.Contains(msg, "/v1/nosuch") ||
		!strings.Contains(msg, "POST /v1/chat/completions") || !strings.Contains(msg, "GET /v1/models/{id},") || strings.Contains(msg, "{$}") {
		t.Errorf("GET /v1/nosuch: %d %s (want the routes listed as a person writes them)", resp.StatusCode, b)
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"}, {"PUT", "/v1/completions", "POST"}, {"POST", "/v1/models", "GET"},
		{"DELETE", "/v1/models/tiny", "GET"}, {"GET", "/tokenize", "POST"}, {"POST", "/healthz", "GET"},
	} {
		resp, b := send(t, c.method, hs.URL+c.path, "")
		msg, _ := openAIError(t, resp, b)
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow || !strings.Contains(msg, c.allow) {
			t.Errorf("%s %s: %d, Allow %q: %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), b)
		}
	}
}

// TestAModelByIDIsItsCardOrA404: /v1/models/{id} gives the served
// model's card (an id with a slash too, as Hugging Face names models),
// and OpenAI's model_not_found for another id.
func TestAModelByIDIsItsCardOrA404(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.Model = "odmoe/tiny" })
	resp, b := send(t, "GET", hs.URL+"/v1/models/odmoe/tiny", "")
	var card modelCard
	if resp.StatusCode != 200 || json.Unmarshal(b, &card) != nil || card.ID != "odmoe/tiny" || card.Object != "model" || card.MaxModelLen != f.m.Config.MaxPositions {
		t.Fatalf("the served model: %d %s", resp.StatusCode, b)
	}
	resp, b = send(t, "GET", hs.URL+"/v1/models/gpt-4o", "")
	if msg, code := openAIError(t, resp, b); resp.StatusCode != 404 || code != "model_not_found" || !strings.Contains(msg, "gpt-4o") {
		t.Errorf("another model: %d %s", resp.StatusCode, b)
	}
}

// TestTokenizeAndDetokenizeAsLlamaServer: /tokenize gives the ids the
// tokenizer gives (with the BOS when add_special), or with pieces whose
// texts make the content again; /detokenize turns them back; a missing
// field or an id outside the vocabulary is a 400 naming it.
func TestTokenizeAndDetokenizeAsLlamaServer(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	const text = "hello world, said the tiny model"
	var got struct{ Tokens []int }
	resp, b := post(t, hs.URL+"/tokenize", `{"content": "`+text+`"}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &got) != nil || !slices.Equal(got.Tokens, f.tok.Encode(text, false)) || len(got.Tokens) == 0 {
		t.Fatalf("tokenize: %d %s, want %v", resp.StatusCode, b, f.tok.Encode(text, false))
	}
	var special struct{ Tokens []int }
	resp, b = post(t, hs.URL+"/tokenize", `{"content": "`+text+`", "add_special": true}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &special) != nil || !slices.Equal(special.Tokens, f.tok.Encode(text, true)) || len(special.Tokens) != len(got.Tokens)+1 {
		t.Fatalf("tokenize add_special: %d %s", resp.StatusCode, b)
	}
	var pieces struct {
		Tokens []struct {
			ID    int
			Piece string
		}
	}
	resp, b = post(t, hs.URL+"/tokenize", `{"content": "`+text+`", "with_pieces": true}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &pieces) != nil || len(pieces.Tokens) != len(got.Tokens) {
		t.Fatalf("tokenize with_pieces: %d %s", resp.StatusCode, b)
	}
	var joined strings.Builder
	for i, p := range pieces.Tokens {
		if p.ID != got.Tokens[i] {
			t.Fatalf("piece %d has id %d, want %d", i, p.ID, got.Tokens[i])
		}
		joined.WriteString(p.Piece)
	}
	if joined.String() != f.tok.Decode(got.Tokens, false) {
		t.Errorf("the pieces make %q, the ids %q", joined.String(), f.tok.Decode(got.Tokens, false))
	}
	ids, _ := json.Marshal(got.Tokens)
	var back struct{ Content string }
	resp, b = post(t, hs.URL+"/detokenize", `{"tokens": `+string(ids)+`}`)
	if resp.StatusCode != 200 || json.Unmarshal(b, &back) != nil || back.Content != f.tok.Decode(got.Tokens, false) || !strings.Contains(back.Content, "tiny model") {
		t.Fatalf("detokenize: %d %s", resp.StatusCode, b)
	}
	for _, c := range []struct{ path, body, says string }{
		{"/tokenize", `{}`, `"content" is required`},
		{"/detokenize", `{}`, `"tokens" is required`},
		{"/detokenize", `{"tokens": [1, 99999999]}`, "token 1 is 99999999, outside the vocabulary"},
		{"/tokenize", `{"content": 5}`, "content"},
	} {
		resp, b := post(t, hs.URL+c.path, c.body)
		if msg, _ := openAIError(t, resp, b); resp.StatusCode != 400 || !strings.Contains(msg, c.says) {
			t.Errorf("%s %s: %d %s, want a 400 saying %s", c.path, c.body, resp.StatusCode, b, c.says)
		}
	}
}

// stainless are the headers the openai package (6.x, 7.x) sends from a
// browser besides Authorization and Content-Type, as its preflight asks.
const stainless = "x-stainless-arch, x-stainless-lang, x-stainless-os, x-stainless-package-version, x-stainless-retry-count, x-stainless-runtime, x-stainless-runtime-version, x-stainless-timeout"

// TestCORSLetsOnlyTheConfiguredOrigins: with -cors-origin, a page of a
// listed origin gets Access-Control-Allow-Origin on its answers and its
// preflight answered (204, the methods and the headers it asked for that
// are header names, before the API key is asked for); another origin gets neither; without -cors-origin (the
// default) no page does.
func TestCORSLetsOnlyTheConfiguredOrigins(t *testing.T) {
	f := newFixture(t)
	send := func(url, method, origin string, preflight bool) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", origin)
		if preflight {
			req.Header.Set("Access-Control-Request-Method", "POST")
			req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, "+stainless+", bad header, x:y")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	hs := f.server(t, func(c *Config) { c.CORSOrigin = "http://localhost:3000, https://chat.example"; c.APIKey = "k" })
	pre := send(hs.URL+"/v1/chat/completions", "OPTIONS", "https://chat.example", true)
	if pre.StatusCode != 204 || pre.Header.Get("Access-Control-Allow-Origin") != "https://chat.example" ||
		!strings.Contains(pre.Header.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(pre.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("a listed origin's preflight: %d %v", pre.StatusCode, pre.Header)
	}
	allowed := strings.Split(pre.Header.Get("Access-Control-Allow-Headers"), ", ")
	for _, h := range strings.Split(stainless, ", ") {
		if !slices.Contains(allowed, h) {
			t.Errorf("the openai package's %s is not allowed: %q", h, allowed)
		}
	}
	if slices.Contains(allowed, "bad header") || slices.Contains(allowed, "x:y") || len(allowed) != 2+8 {
		t.Errorf("allowed headers %q: want Authorization, Content-Type and the eight asked for that are header names", allowed)
	}
	if r := send(hs.URL+"/v1/models", "GET", "http://localhost:3000", false); r.Header.Get("Access-Control-Allow-Origin") != "http://localhost:3000" || r.StatusCode != 401 {
		t.Errorf("a listed origin's request without the key: %d, Allow-Origin %q (want 401 the browser can read)", r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
	}
	if r := send(hs.URL+"/v1/models", "OPTIONS", "https://evil.example", true); r.Header.Get("Access-Control-Allow-Origin") != "" || r.Header.Get("Access-Control-Allow-Methods") != "" {
		t.Errorf("another origin's preflight was allowed: %v", r.Header)
	}
	plain := f.server(t, nil)
	if r := send(plain.URL+"/v1/models", "GET", "http://localhost:3000", false); r.Header.Get("Access-Control-Allow-Origin") != "" || r.StatusCode != 200 {
		t.Errorf("without -cors-origin: %d, Allow-Origin %q", r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
	}
	any := f.server(t, func(c *Config) { c.CORSOrigin = "*" })
	if r := send(any.URL+"/v1/models", "GET", "http://anywhere.example", false); r.Header.Get("Access-Control-Allow-Origin") != "http://anywhere.example" {
		t.Errorf("-cors-origin *: Allow-Origin %q", r.Header.Get("Access-Control-Allow-Origin"))
	}
}

// TestShutdownDrainsRunningStreams: when Serve's context ends (SIGINT or
// SIGTERM in odmoe run), a stream already running goes on until the
// drain's time is up, then ends as a stream should (its final chunk with
// finish_reason "length", then [DONE]) long before its 4000 tokens; new
// requests are refused meanwhile; Serve returns once it has ended.
func TestShutdownDrainsRunningStreams(t *testing.T) {
	f := newFixture(t)
	s, err := New(Config{Model: "tiny", Tokenizer: f.tok, Chat: plainChat{}, Context: f.m.Config.MaxPositions, Generator: f.gen,
		Log: zerolog.Nop(), DrainTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrc, served := make(chan string, 1), make(chan error, 1)
	go func() { served <- s.Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() }) }()
	url := "http://" + <-addrc
	resp, err := http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": "hi", "max_tokens": 4000, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil { // the first event: it runs
		t.Fatal(err)
	}
	stopped := time.Now()
	stop()
	time.Sleep(50 * time.Millisecond)
	if resp2, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "hi", "max_tokens": 2}`)); err == nil {
		resp2.Body.Close()
		if resp2.StatusCode != 503 {
			t.Errorf("a request while draining: %d, want refused (503 or no connection)", resp2.StatusCode)
		}
	}
	data, done := events(t, r)
	if !done {
		t.Fatalf("the stream ended without [DONE] (%d events)", len(data))
	}
	last := data[len(data)-1]["choices"].([]any)[0].(map[string]any)
	if last["finish_reason"] != "length" || len(data) >= 4000 {
		t.Fatalf("the stream's last chunk %v after %d events, want finish_reason length well before 4000", last, len(data))
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
	if took := time.Since(stopped); took < 250*time.Millisecond {
		t.Errorf("the stream was cut %v after the shutdown began, before the drain's 300 ms", took)
	}
}

// TestConsoleIsAtTheRootBehindTheKey: the page at / holds no data and is
// served without the key; its feed needs it; -no-console leaves both out.
func TestConsoleIsAtTheRootBehindTheKey(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, func(c *Config) { c.APIKey = "k" })
	resp, body := send(t, "GET", hs.URL+"/", "")
	if resp.StatusCode != 200 || !strings.Contains(string(body), "<title>odmoe</title>") {
		t.Fatalf("GET /: %d %.100s", resp.StatusCode, body)
	}
	if resp, _ := send(t, "GET", hs.URL+"/console/events", ""); resp.StatusCode != 401 {
		t.Fatalf("the feed without the key: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", hs.URL+"/console/events", nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	resp.Body.Close()
	if resp.StatusCode != 200 || line != "event: snapshot\n" {
		t.Fatalf("the feed with the key: %d %q", resp.StatusCode, line)
	}
	off := f.server(t, func(c *Config) { c.NoConsole = true })
	for _, path := range []string{"/", "/console/events"} {
		if resp, _ := send(t, "GET", off.URL+path, ""); resp.StatusCode != 404 {
			t.Errorf("-no-console: GET %s %d", path, resp.StatusCode)
		}
	}
}

// TestConsoleFeedOutlivesTheBodyTimeoutAndEndsWithTheDrain: the feed
// has no body, so the read deadline for one does not cut it; and a
// feed left open does not hold a shutdown's drain.
func TestConsoleFeedOutlivesTheBodyTimeoutAndEndsWithTheDrain(t *testing.T) {
	f := newFixture(t)
	s, err := New(Config{Model: "tiny", Tokenizer: f.tok, Chat: plainChat{}, Context: f.m.Config.MaxPositions, Generator: f.gen,
		Log: zerolog.Nop(), BodyTimeout: 300 * time.Millisecond, DrainTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addr <- a }) }()
	resp, err := http.Get("http://" + (<-addr).String() + "/console/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := 0
	sc := bufio.NewScanner(resp.Body)
	deadline := time.Now().Add(1200 * time.Millisecond) // four body timeouts
	for time.Now().Before(deadline) && sc.Scan() {
		if strings.HasPrefix(sc.Text(), "event: snapshot") {
			events++
		}
	}
	if events < 2 || sc.Err() != nil {
		t.Fatalf("%d snapshots in 1.2 s, then %v", events, sc.Err())
	}
	t0 := time.Now()
	stop()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(t0); d > 3*time.Second {
			t.Fatalf("the drain took %v with a feed open", d)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("an open feed held the drain past 8 s")
	}
}

// TestAnswersCarryTheSystemFingerprint: every answer, whole or streamed,
// chat or completion, carries one system_fingerprint, which changes with
// the model's identity.
func TestAnswersCarryTheSystemFingerprint(t *testing.T) {
	f := newFixture(t)
	prints := func(hs string) map[string]bool {
		seen := map[string]bool{}
		for _, req := range []struct{ path, body string }{
			{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}`},
			{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": true}`},
			{"/v1/completions", `{"prompt": "hi", "max_tokens": 2}`},
			{"/v1/completions", `{"prompt": "hi", "max_tokens": 2, "stream": true}`},
		} {
			resp, body := post(t, hs+req.path, req.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s %s: %d %s", req.path, req.body, resp.StatusCode, body)
			}
			for _, m := range regexp.MustCompile(`"system_fingerprint":"([^"]*)"`).FindAllStringSubmatch(string(body), -1) {
				seen[m[1]] = true
			}
			if !strings.Contains(string(body), `"system_fingerprint":"fp_`) {
				t.Errorf("%s %s: no system_fingerprint: %s", req.path, req.body, body)
			}
		}
		return seen
	}
	one := prints(f.server(t, func(c *Config) { c.ModelIdentity = "a" }).URL)
	other := prints(f.server(t, func(c *Config) { c.ModelIdentity = "b" }).URL)
	if len(one) != 1 || len(other) != 1 || maps.Equal(one, other) {
		t.Errorf("fingerprints %v and %v: want one each, differing with the model", one, other)
	}
}
