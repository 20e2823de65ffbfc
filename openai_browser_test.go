package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/odmoe/odmoe/internal/noderef"
)

// browserSDKPage is a web page that imports the official openai package
// as a module (its ESM build, served beside the page) and streams a chat
// completion from the API of another origin with the key, as a chat page
// built on the SDK does; it then asks with a wrong key. It writes what it
// got into #out as JSON and adds #done.
const browserSDKPage = `<!doctype html>
<meta charset="utf-8">
<title>openai in a page</title>
<pre id="out"></pre>
<script type="module">
import OpenAI from "/openai/index.mjs";
const q = new URLSearchParams(location.search);
const result = {};
try {
	const client = new OpenAI({baseURL: q.get("api"), apiKey: q.get("key"), dangerouslyAllowBrowser: true, maxRetries: 0});
	const stream = await client.chat.completions.create({model: q.get("model"), stream: true, stream_options: {include_usage: true},
		messages: [{role: "user", content: "Say hello."}], max_tokens: 12, ignore_eos: true});
	result.text = ""; result.chunks = 0;
	for await (const chunk of stream) {
		result.chunks++;
		if (chunk.choices.length > 0) {
			result.text += chunk.choices[0].delta.content ?? "";
			result.finish = chunk.choices[0].finish_reason ?? result.finish;
		}
		if (chunk.usage) result.usage = chunk.usage;
	}
} catch (e) {
	result.error = String(e);
}
try {
	const wrong = new OpenAI({baseURL: q.get("api"), apiKey: "sk-wrong", dangerouslyAllowBrowser: true, maxRetries: 0});
	await wrong.chat.completions.create({model: q.get("model"), messages: [{role: "user", content: "hi"}], max_tokens: 1});
	result.wrongKey = "answered";
} catch (e) {
	result.wrongKey = e.constructor.name + " " + e.status;
}
document.getElementById("out").textContent = JSON.stringify(result);
document.body.appendChild(Object.assign(document.createElement("p"), {id: "done"}));
</script>
`

// TestOpenAISDKStreamsFromABrowserPage: the official openai package, in
// headless Chromium, from a page of an origin -cors-origin allows, gets
// through its preflight (the x-stainless-* headers it sends), streams a
// chat completion with the key to its usage chunk, and reads a wrong
// key's 401 as an AuthenticationError (the answer's CORS headers let the
// page see its status).
func TestOpenAISDKStreamsFromABrowserPage(t *testing.T) {
	browser := chromium(t)
	modules, _ := noderef.Require(t, "testdata/openai/node_modules", "openai", "npm ci --prefix testdata/openai")
	sdk := http.StripPrefix("/openai/", http.FileServer(http.Dir(filepath.Join(modules, "openai"))))
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Write([]byte(browserSDKPage))
		case strings.HasPrefix(r.URL.Path, "/openai/"):
			if strings.HasSuffix(r.URL.Path, ".mjs") {
				w.Header().Set("Content-Type", "text/javascript")
			}
			sdk.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	defer page.Close()

	model := tinyModel(t)
	r := &chaosRig{t: t, dir: t.TempDir(), model: model, procs: map[string]*exec.Cmd{}}
	t.Cleanup(func() {
		for _, c := range r.procs {
			c.Process.Kill()
			c.Wait()
		}
	})
	r.start("local", "run", "-role", "local", "-model", model, "-http", "127.0.0.1:0", "-api-key", apiTestKey,
		"-cors-origin", page.URL, "-log-json", "-log-level", "info")
	api := ""
	for deadline := time.Now().Add(60 * time.Second); api == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if addr := servingAddr(filepath.Join(r.dir, "local.log")); addr != "" {
			api = "http://" + addr + "/v1"
		}
	}
	if api == "" {
		t.Fatalf("the server did not say where it serves within 60 s\n%s", r.logs())
	}

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU)...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithBrowserOption(chromedp.WithConsolef(t.Logf)))
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()
	q := url.Values{"api": {api}, "key": {apiTestKey}, "model": {filepath.Base(model)}}
	if err := chromedp.Do(ctx, chromedp.Navigate(page.URL+"/?"+q.Encode()), chromedp.WaitVisible(chromedp.CSS(`#out`)),
		chromedp.Poll[chromedp.Void](`document.getElementById('done') !== null`, chromedp.WithPollingTimeout(time.Minute))); err != nil {
		t.Fatalf("the page: %v\n%s", err, r.logs())
	}
	out, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`#out`)))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Text, Finish, Error, WrongKey string
		Chunks                        int
		Usage                         *struct {
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("the page wrote %q: %v", out, err)
	}
	t.Logf("the page got %s", out)
	if got.Error != "" || got.Finish != "length" || got.Usage == nil || got.Usage.CompletionTokens != 12 || got.Chunks < 3 || got.Text == "" {
		t.Errorf("the stream: %s\n%s", out, r.logs())
	}
	if got.WrongKey != "AuthenticationError 401" {
		t.Errorf("a wrong key: %q, want AuthenticationError 401", got.WrongKey)
	}
}
