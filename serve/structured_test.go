package serve

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/odmoe/odmoe/internal/schematest"
	"github.com/odmoe/odmoe/model"
)

// referenceLogits are the logits local mode samples each token of a
// greedy generation from, and the tokens.
func (f *fixture) referenceLogits(t *testing.T, prompt []int, n int, sampler *model.Sampler) ([]int, [][]float32) {
	t.Helper()
	sess := model.NewSession(f.m, model.NewResidentExperts(f.m), len(prompt)+n)
	var logits [][]float32
	ids, _, err := model.Generate(context.Background(), sess, prompt, model.GenerateOptions{MaxTokens: n, StopAtEOS: true, Sampler: sampler,
		OnToken: func(_, _ int, l []float32) error {
			logits = append(logits, slices.Clone(l))
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return ids, logits
}

// logSoftmax is the float64 reference.
func logSoftmax(l []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range l {
		mx = max(mx, float64(v))
	}
	var sum float64
	for _, v := range l {
		sum += math.Exp(float64(v) - mx)
	}
	out := make([]float64, len(l))
	for i, v := range l {
		out[i] = float64(v) - mx - math.Log(sum)
	}
	return out
}

// TestLogprobsAreTheModelsLogSoftmax: completions' logprobs (legacy
// shape) and chat's, whole and streamed, give each generated token's
// log-softmax of local mode's logits, and the most likely alternatives.
func TestLogprobsAreTheModelsLogSoftmax(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	const n = 8
	prompt := f.tok.Encode("The swarm", true)
	ids, logits := f.referenceLogits(t, prompt, n, nil)
	resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The swarm", "max_tokens": 8, "temperature": 0, "logprobs": 3}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var c struct {
		Choices []struct {
			Logprobs completionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	lp := c.Choices[0].Logprobs
	if len(lp.Tokens) != len(ids) || len(lp.TopLogprobs) != len(ids) {
		t.Fatalf("%d tokens' logprobs for %d tokens: %s", len(lp.Tokens), len(ids), body)
	}
	for i, id := range ids {
		want := logSoftmax(logits[i])
		if math.Abs(lp.TokenLogprobs[i]-want[id]) > 1e-9 {
			t.Errorf("token %d: logprob %v, reference %v", i, lp.TokenLogprobs[i], want[id])
		}
		order := make([]int, len(want))
		for k := range order {
			order[k] = k
		}
		slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(want[b], want[a]) })
		for _, alt := range order[:3] {
			tok := (&Server{cfg: Config{Tokenizer: f.tok}}).tokenLogprob(alt, 0).Token
			if got, ok := lp.TopLogprobs[i][tok]; !ok || math.Abs(got-want[alt]) > 1e-9 {
				t.Errorf("token %d: alternative %q: %v (present %v), reference %v", i, tok, got, ok, want[alt])
			}
		}
	}
	// chat: whole and streamed give the same entries, one a token
	req := `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2`
	resp, body = post(t, hs.URL+"/v1/chat/completions", req+`}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	var whole struct {
		Choices []struct {
			Logprobs chatLogprobs `json:"logprobs"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	json.Unmarshal(body, &whole)
	entries := whole.Choices[0].Logprobs.Content
	if len(entries) != whole.Usage.CompletionTokens || len(entries[0].TopLogprobs) != 2 || entries[0].TopLogprobs[0].Logprob < entries[0].TopLogprobs[1].Logprob {
		t.Fatalf("chat logprobs %+v for %d tokens", entries, whole.Usage.CompletionTokens)
	}
	if resp, body = post(t, hs.URL+"/v1/chat/completions", req+`, "stream": true}`); resp.StatusCode != 200 {
		t.Fatalf("streamed: %d %s", resp.StatusCode, body)
	}
	var streamed []tokenLogprob
	chunks, _ := eventsOf[struct {
		Choices []struct {
			Logprobs *chatLogprobs `json:"logprobs"`
		} `json:"choices"`
	}](t, bytes.NewReader(body))
	for _, chunk := range chunks {
		if len(chunk.Choices) > 0 && chunk.Choices[0].Logprobs != nil {
			streamed = append(streamed, chunk.Choices[0].Logprobs.Content...)
		}
	}
	if !equalJSON(streamed, entries) {
		t.Fatalf("streamed logprobs %+v, whole %+v", streamed, entries)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestPenaltiesAndBiasReachTheSampler: the served tokens are local
// mode's with the same penalties, and a token biased by +100 is all a
// greedy answer says.
func TestPenaltiesAndBiasReachTheSampler(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	prompt := f.tok.Encode("The swarm", true)
	ids, _ := f.referenceLogits(t, prompt, 12, model.NewSampler(0, 1, 0).WithPenalties(0.4, 1.5))
	plain, _ := f.referenceLogits(t, prompt, 12, nil)
	if slices.Equal(ids, plain) {
		t.Fatal("the penalties change nothing on this prompt: pick another")
	}
	resp, body := post(t, hs.URL+"/v1/completions", `{"prompt": [`+joinInts(prompt)+`], "max_tokens": 12, "temperature": 0, "presence_penalty": 0.4, "frequency_penalty": 1.5}`)
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	json.Unmarshal(body, &c)
	if resp.StatusCode != 200 || c.Choices[0].Text != f.tok.Decode(ids, true) {
		t.Fatalf("%d: served %q, local mode with the penalties %q", resp.StatusCode, c.Choices[0].Text, f.tok.Decode(ids, true))
	}
	biased := f.tok.Encode("swarm", false)[0]
	resp, body = post(t, hs.URL+"/v1/completions", `{"prompt": "The", "max_tokens": 5, "temperature": 0, "ignore_eos": true, "logit_bias": {"`+itoa(biased)+`": 100}}`)
	json.Unmarshal(body, &c)
	if want := strings.Repeat(string(f.tok.TokenBytes(biased)), 5); resp.StatusCode != 200 || c.Choices[0].Text != strings.TrimPrefix(want, " ") && c.Choices[0].Text != want {
		t.Fatalf("%d: biased answer %q, want %q", resp.StatusCode, c.Choices[0].Text, want)
	}
	for body, param := range map[string]string{
		`{"prompt": "x", "frequency_penalty": 2.5}`:                                              "frequency_penalty",
		`{"prompt": "x", "logit_bias": {"-1": 1}}`:                                               "logit_bias",
		`{"prompt": "x", "logit_bias": {"3": 101}}`:                                              "logit_bias",
		`{"prompt": "x", "logprobs": 6}`:                                                         "logprobs",
		`{"messages": [{"role": "user", "content": "x"}], "logprobs": 2}`:                        "logprobs",
		`{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true}`: "top_logprobs",
	} {
		path := "/v1/completions"
		if strings.Contains(body, "messages") {
			path = "/v1/chat/completions"
		}
		resp, b := post(t, hs.URL+path, body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), `"param":"`+param+`"`) {
			t.Errorf("%s: %d %s; want 400 naming %s", body, resp.StatusCode, b, param)
		}
	}
}

func joinInts(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = itoa(id)
	}
	return strings.Join(s, ",")
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// TestStructuredOutputFollowsTheSchema: a random tiny model, sampled at
// temperature 1 under many seeds, answers what the schema accepts and
// stops there (checked by an independent JSON Schema validator).
func TestStructuredOutputFollowsTheSchema(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	const schema = `{"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
		"color": {"enum": ["red", "green", "dark blue"]}, "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
		"required": ["ok", "n", "color"], "additionalProperties": false}`
	v := schematest.Compile(t, []byte(schema))
	rng := rand.New(rand.NewPCG(5, 6))
	for range 6 {
		seed := rng.IntN(1 << 30)
		req := `{"messages": [{"role": "user", "content": "a JSON please"}], "max_tokens": 500, "seed": ` + itoa(seed) +
			`, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": ` + schema + `}}}`
		resp, body := post(t, hs.URL+"/v1/chat/completions", req)
		var c chatResponse
		json.Unmarshal(body, &c)
		if resp.StatusCode != 200 || *c.Choices[0].FinishReason != "stop" {
			t.Fatalf("seed %d: %d %s", seed, resp.StatusCode, body)
		}
		if err := schematest.Validate(v, *c.Choices[0].Message.Content); err != nil {
			t.Fatalf("seed %d: the answer %q does not follow the schema: %v", seed, *c.Choices[0].Message.Content, err)
		}
	}
	resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "response_format": {"type": "json_object"}}`)
	var c chatResponse
	json.Unmarshal(body, &c)
	if resp.StatusCode != 200 || !strings.HasPrefix(*c.Choices[0].Message.Content, "{") {
		t.Fatalf("json_object: %d %s", resp.StatusCode, body)
	}
	for req, want := range map[string]string{
		`{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "not": {}}}}`: `keyword \"not\" is not supported`,
		`{"type": "json_schema"}`: "needs json_schema.schema",
		`{"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}`:                "needs json_schema.name",
		`{"type": "json_schema", "json_schema": {"name": "a b", "schema": {"type": "string"}}}`: "needs json_schema.name",
		`{"type": "yaml"}`: `\"yaml\" is not one of`,
	} {
		resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "response_format": `+req+`}`)
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"response_format"`) || !strings.Contains(string(body), want) {
			t.Errorf("%s: %d %s; want 400 naming response_format and saying %s", req, resp.StatusCode, body, want)
		}
	}
}

const weatherTool = `{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
	"properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}}, "required": ["city"], "additionalProperties": false}}}`
const searchTool = `{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"enum": ["a", "b"]}}, "required": ["q"], "additionalProperties": false}}}`

// TestForcedToolCallsAreCallsOfTheTools: tool_choice required and a
// named function make even a random model answer with calls in the
// template's syntax, read back as tool_calls whose arguments follow the
// tool's parameters, whole and streamed alike.
func TestForcedToolCallsAreCallsOfTheTools(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	weatherArgs := schematest.Compile(t, []byte(`{"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}}, "required": ["city"], "additionalProperties": false}`))
	for _, tc := range []struct {
		choice string
		names  []string // the functions it may call
	}{
		{`"required"`, []string{"get_weather", "search"}},
		{`{"type": "function", "function": {"name": "get_weather"}}`, []string{"get_weather"}},
	} {
		for seed := range 4 {
			req := `{"messages": [{"role": "user", "content": "weather?"}], "max_tokens": 400, "seed": ` + itoa(seed) +
				`, "tools": [` + weatherTool + `, ` + searchTool + `], "tool_choice": ` + tc.choice
			resp, body := post(t, hs.URL+"/v1/chat/completions", req+`}`)
			var c chatResponse
			json.Unmarshal(body, &c)
			if resp.StatusCode != 200 || *c.Choices[0].FinishReason != "tool_calls" || c.Choices[0].Message.Content != nil || len(c.Choices[0].Message.ToolCalls) == 0 {
				t.Fatalf("%s seed %d: %d %s", tc.choice, seed, resp.StatusCode, body)
			}
			calls := c.Choices[0].Message.ToolCalls
			for _, call := range calls {
				if !slices.Contains(tc.names, call.Function.Name) || call.Index != nil || !strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
					t.Fatalf("%s seed %d: call %+v", tc.choice, seed, call)
				}
				if call.Function.Name == "get_weather" {
					if err := schematest.Validate(weatherArgs, call.Function.Arguments); err != nil {
						t.Fatalf("arguments %s: %v", call.Function.Arguments, err)
					}
				}
			}
			// streamed: the same calls, each whole in one delta
			_, body = post(t, hs.URL+"/v1/chat/completions", req+`, "stream": true}`)
			var streamed []toolCall
			var finish string
			chunks, _ := eventsOf[chatResponse](t, bytes.NewReader(body))
			for _, chunk := range chunks {
				if len(chunk.Choices) > 0 {
					if d := chunk.Choices[0].Delta; d.Content != "" {
						t.Fatalf("content %q streamed beside forced calls", d.Content)
					}
					streamed = append(streamed, chunk.Choices[0].Delta.ToolCalls...)
					if fr := chunk.Choices[0].FinishReason; fr != nil {
						finish = *fr
					}
				}
			}
			if len(streamed) != len(calls) || finish != "tool_calls" {
				t.Fatalf("streamed %d calls (%s), whole %d", len(streamed), finish, len(calls))
			}
			for i := range calls {
				if *streamed[i].Index != i || streamed[i].Function != calls[i].Function {
					t.Fatalf("streamed call %d %+v, whole %+v", i, streamed[i], calls[i])
				}
			}
		}
	}
	for req, param := range map[string]string{
		`"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [` + weatherTool + `]`: "tool_choice",
		`"tool_choice": "sometimes", "tools": [` + weatherTool + `]`:                                        "tool_choice",
		`"tool_choice": "required"`: "tool_choice",
		`"tool_choice": "required", "tools": [` + weatherTool + `], "response_format": {"type": "json_object"}`:                              "tool_choice",
		`"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}], "tool_choice": "required"`: "tools[0].function.parameters",
		`"tools": [{"type": "code_interpreter"}]`: "tools[0]",
	} {
		resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], `+req+`}`)
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"`+param+`"`) {
			t.Errorf("%s: %d %s; want 400 naming %s", req, resp.StatusCode, body, param)
		}
	}
}

// TestToolFilterReadsCallsHoweverTheTextIsCut: every way of cutting an
// answer into pieces gives the same content and calls as the whole.
func TestToolFilterReadsCallsHoweverTheTextIsCut(t *testing.T) {
	const answer = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n" +
		"<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a </tool_call> b\"}}\n</tool_call>\n"
	type result struct {
		content string
		calls   []string
	}
	run := func(pieces []string) result {
		f := &toolFilter{syntax: hermes}
		var r result
		for _, p := range pieces {
			c, calls := f.Push(p)
			r.content += c
			for _, call := range calls {
				r.calls = append(r.calls, itoa(*call.Index)+" "+call.Function.Name+" "+call.Function.Arguments)
			}
		}
		content, calls := f.Flush()
		r.content += content
		for _, call := range calls {
			r.calls = append(r.calls, itoa(*call.Index)+" "+call.Function.Name+" "+call.Function.Arguments)
		}
		return r
	}
	// the second call's argument holds the closing tag: passed over
	want := result{"Let me look.", []string{`0 get_weather {"city":"Paris","days":3}`, `1 search {"q":"a </tool_call> b"}`}}
	if got := run([]string{answer}); got.content != want.content || !slices.Equal(got.calls, want.calls) {
		t.Fatalf("whole: %+v, want %+v", got, want)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 500 {
		var pieces []string
		for rest := answer; rest != ""; {
			n := min(len(rest), 1+rng.IntN(12))
			pieces, rest = append(pieces, rest[:n]), rest[n:]
		}
		if got := run(pieces); got.content != want.content || !slices.Equal(got.calls, want.calls) {
			t.Fatalf("cut %q: %+v, want %+v", pieces, got, want)
		}
	}
	// a call that does not read is content, cut short or not; one whose
	// JSON reads so far is a call when its name is whole, with the
	// arguments as far as they came, and nothing when it is not
	for text, want := range map[string]result{
		"<tool_call>\nnot json\n</tool_call>":                               {"<tool_call>\nnot json\n</tool_call>", nil},
		"<tool_call>\nnot json":                                             {"<tool_call>\nnot json", nil},
		"a < b <tool":                                                       {"a < b <tool", nil},
		"ok <tool_call>\n{\"name\": \"f\", \"argu":                          {"ok", []string{"0 f "}},
		"<tool_call>\n{\"name\": \"set_unit\", \"arguments\": {  \"uni":     {"", []string{`0 set_unit {  "uni`}},
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool": {"", []string{`0 f {"a":1}`}},
		"<tool_call>\n{\"name\": \"set_u":                                   {"", nil},
		"ok <tool_call>\n":                                                  {"ok", nil},
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\":": {"", []string{"0 f {}", "1 g "}},
	} {
		if got := run([]string{text}); got.content != want.content || !slices.Equal(got.calls, want.calls) {
			t.Errorf("%q: content %q calls %q, want content %q calls %q", text, got.content, got.calls, want.content, want.calls)
		}
	}
}

// tojsonChat writes an assistant's calls as Qwen2.5's template does:
// arguments through tojson, whatever their type.
type tojsonChat struct{}

func (tojsonChat) Render(vars map[string]any) (string, error) {
	var b strings.Builder
	for _, m := range vars["messages"].([]any) {
		var mm map[string]any
		json.Unmarshal(m.(json.RawMessage), &mm)
		calls, _ := mm["tool_calls"].([]any)
		for _, c := range calls {
			fn := c.(map[string]any)["function"].(map[string]any)
			args, _ := json.Marshal(fn["arguments"])
			fmt.Fprintf(&b, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>", fn["name"], args)
		}
	}
	return b.String(), nil
}

func TestToolSyntaxIsFoundWhicheverWayATemplateWritesArguments(t *testing.T) {
	for name, tmpl := range map[string]ChatTemplate{"as given (Qwen3)": plainChat{}, "tojson (Qwen2.5)": tojsonChat{}} {
		if detectToolSyntax(tmpl) != hermes {
			t.Errorf("%s: no tool syntax found", name)
		}
	}
	if detectToolSyntax(recordingNothing{}) != nil {
		t.Error("a template that writes no calls was given a syntax")
	}
}

type recordingNothing struct{}

func (recordingNothing) Render(map[string]any) (string, error) { return "user: hi\n", nil }

// TestChatLogprobsAlwaysListTheirAlternatives: top_logprobs is an empty
// list, not absent, when none are asked for (OpenAI's schema requires it).
func TestChatLogprobsAlwaysListTheirAlternatives(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": true}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"top_logprobs":[]`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestHostileSchemasAreRefusedBeforeAnyWork: issue 54's schemas (26
// definitions of two references each to the next, as response_format
// and as a forced tool's parameters; items nested deep) are 400s naming
// the request field and the limit, and 1,000 optional properties (a 500
// at sampling before) are served.
func TestHostileSchemasAreRefusedBeforeAnyWork(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	defs := make([]string, 26)
	for i := range 25 {
		defs[i] = fmt.Sprintf(`"d%d": {"anyOf": [{"$ref": "#/$defs/d%d"}, {"$ref": "#/$defs/d%d"}]}`, i, i+1, i+1)
	}
	defs[25] = `"d25": {"type": "string"}`
	doubling := `{"$defs": {` + strings.Join(defs, ", ") + `}, "$ref": "#/$defs/d0"}`
	props := make([]string, 1000)
	for i := range props {
		props[i] = fmt.Sprintf(`"p%d": {"type": "string"}`, i)
	}
	optional := `{"type": "object", "properties": {` + strings.Join(props, ", ") + `}}`
	format := func(schema string) string {
		return `"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ` + schema + `}}`
	}
	for _, tc := range []struct{ name, field, param, want string }{
		{"doubling definitions", format(doubling), "response_format", "more than 64 ways to begin here"},
		{"doubling definitions as a tool's parameters", `"tools": [{"type": "function", "function": {"name": "f", "parameters": ` + doubling + `}}], "tool_choice": "required"`,
			"tools[0].function.parameters", "more than 64 ways to begin here"},
		{"items nested 100 deep", format(strings.Repeat(`{"items": `, 100) + `{}` + strings.Repeat(`}`, 100)), "response_format", "nested more than 10 deep"},
	} {
		resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, `+tc.field+`}`)
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"`+tc.param+`"`) || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s; want 400 naming %s and saying %s", tc.name, resp.StatusCode, body, tc.param, tc.want)
		}
	}
	resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 8, `+format(optional)+`}`)
	if resp.StatusCode != 200 {
		t.Errorf("1,000 optional properties: %d %s", resp.StatusCode, body)
	}
}

// TestForcedCallCutByMaxTokensIsACall: a forced call that max_tokens
// ends inside comes back as a call (its name, the arguments as far as
// they came, finish_reason "length"), whole and streamed alike, and the
// template's tags never reach the content; each token limit's arguments
// begin with the shorter limit's (one seed, one draw per position).
func TestForcedCallCutByMaxTokensIsACall(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	const unitTool = `{"type": "function", "function": {"name": "set_unit", "parameters": {"type": "object",
		"properties": {"unit": {"type": "string"}}, "required": ["unit"], "additionalProperties": false}}}`
	prev, named, partial := "", 0, 0
	for limit := 1; limit <= 48; limit++ {
		req := `{"messages": [{"role": "user", "content": "unit?"}], "seed": 3, "max_tokens": ` + itoa(limit) +
			`, "tools": [` + unitTool + `], "tool_choice": "required"`
		resp, body := post(t, hs.URL+"/v1/chat/completions", req+`}`)
		var c chatResponse
		json.Unmarshal(body, &c)
		if resp.StatusCode != 200 || strings.Contains(string(body), "tool_call>") || strings.Contains(string(body), `\u003ctool_call`) {
			t.Fatalf("max_tokens %d: %d %s", limit, resp.StatusCode, body)
		}
		ch := c.Choices[0]
		if ch.Message.Content != nil && *ch.Message.Content != "" {
			t.Fatalf("max_tokens %d: content %q beside a forced call", limit, *ch.Message.Content)
		}
		calls := ch.Message.ToolCalls
		if *ch.FinishReason == "tool_calls" {
			break // the call closed within the limit
		}
		if *ch.FinishReason != "length" || len(calls) > 1 {
			t.Fatalf("max_tokens %d: finish %s, %d calls: %s", limit, *ch.FinishReason, len(calls), body)
		}
		args := ""
		if len(calls) == 1 {
			if calls[0].Function.Name != "set_unit" || !strings.HasPrefix(calls[0].ID, "call_") {
				t.Fatalf("max_tokens %d: call %+v", limit, calls[0])
			}
			named++
			args = calls[0].Function.Arguments
			if args != "" {
				partial++
			}
		}
		if !strings.HasPrefix(args, prev) {
			t.Fatalf("max_tokens %d: arguments %q do not begin with the shorter limit's %q", limit, args, prev)
		}
		prev = args
		// streamed: the same call, in one delta, and no content
		_, body = post(t, hs.URL+"/v1/chat/completions", req+`, "stream": true}`)
		chunks, _ := eventsOf[chatResponse](t, bytes.NewReader(body))
		var streamed []toolCall
		finish := ""
		for _, chunk := range chunks {
			if len(chunk.Choices) == 0 {
				continue
			}
			if d := chunk.Choices[0].Delta; d.Content != "" {
				t.Fatalf("max_tokens %d: content %q streamed beside a forced call", limit, d.Content)
			}
			streamed = append(streamed, chunk.Choices[0].Delta.ToolCalls...)
			if fr := chunk.Choices[0].FinishReason; fr != nil {
				finish = *fr
			}
		}
		if finish != "length" || len(streamed) != len(calls) || len(calls) == 1 && streamed[0].Function != calls[0].Function {
			t.Fatalf("max_tokens %d: streamed %+v (%s), whole %+v", limit, streamed, finish, calls)
		}
	}
	if named == 0 || partial == 0 {
		t.Fatalf("no limit cut the call after its name (%d) or inside its arguments (%d)", named, partial)
	}
}

// TestToolMessagesAnswerACall: a tool message's tool_call_id names a call
// of an earlier assistant message, or the request is a 400 naming it.
func TestToolMessagesAnswerACall(t *testing.T) {
	f := newFixture(t)
	hs := f.server(t, nil)
	called := `{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}`
	for _, tc := range []struct {
		msgs string
		ok   bool
	}{
		{`{"role": "user", "content": "w?"}, ` + called + `, {"role": "tool", "tool_call_id": "call_1", "content": "21"}`, true},
		{`{"role": "user", "content": "w?"}, ` + called + `, {"role": "tool", "content": "21"}`, true},
		{`{"role": "user", "content": "w?"}, ` + called + `, {"role": "tool", "tool_call_id": "call_2", "content": "21"}`, false},
		{`{"role": "user", "content": "w?"}, {"role": "tool", "tool_call_id": "call_1", "content": "21"}, ` + called, false},
		{`{"role": "user", "content": "w?"}, ` + called + `, {"role": "tool", "tool_call_id": 1, "content": "21"}`, false},
	} {
		resp, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": [`+tc.msgs+`], "max_tokens": 2, "tools": [`+weatherTool+`]}`)
		switch {
		case tc.ok && resp.StatusCode != 200:
			t.Errorf("%s: %d %s", tc.msgs, resp.StatusCode, body)
		case !tc.ok && (resp.StatusCode != 400 || !strings.Contains(string(body), `tool_call_id"`) || !strings.Contains(string(body), "is not the id of a call")):
			t.Errorf("%s: %d %s; want 400 naming the tool_call_id", tc.msgs, resp.StatusCode, body)
		}
	}
}
