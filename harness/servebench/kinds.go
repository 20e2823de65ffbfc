package servebench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Kind is a kind of request the clients send: how it samples, and
// whether a grammar constrains it. Each row of a run measures one kind
// at one client count; several kinds are measured in turn on the same
// swarm (Options.Kinds, Options.Rounds).
type Kind struct {
	Name                string
	Temperature         float64
	Presence, Frequency float64
	// JSONSchema sends a chat completion whose answer follows a JSON
	// schema (response_format json_schema) instead of a plain completion
	// of token ids.
	JSONSchema bool
}

// greedy is the kind every request was before kinds: temperature 0, a
// completion of token ids.
var greedy = Kind{Name: "greedy"}

// ParseKinds reads a comma-separated list of request kinds: greedy
// (temperature 0), tX (temperature X, e.g. t0.7, t1: top_p 1, as OpenAI's
// default), penalties (t0.7 with presence and frequency penalties of 0.5),
// greedy-penalties (greedy with those penalties: a greedy request that
// does not repeat itself) and json (t0.7, a chat completion following a
// JSON schema).
func ParseKinds(s string) ([]Kind, error) {
	var out []Kind
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		var k Kind
		switch {
		case name == greedy.Name:
			k = greedy
		case name == "penalties":
			k = Kind{Name: name, Temperature: 0.7, Presence: 0.5, Frequency: 0.5}
		case name == "greedy-penalties": // greedy, but not repeating itself
			k = Kind{Name: name, Presence: 0.5, Frequency: 0.5}
		case name == "json":
			k = Kind{Name: name, Temperature: 0.7, JSONSchema: true}
		case strings.HasPrefix(name, "t"):
			t, err := strconv.ParseFloat(name[1:], 64)
			if err != nil || !(t >= 0 && t <= 2) {
				return nil, fmt.Errorf("request kind %q: a temperature tX wants X in [0, 2]", name)
			}
			k = Kind{Name: name, Temperature: t}
		default:
			return nil, fmt.Errorf("request kind %q unknown: greedy, tX (a temperature, e.g. t0.7), penalties, greedy-penalties, json", name)
		}
		if slices.ContainsFunc(out, func(o Kind) bool { return o.Name == k.Name }) {
			return nil, fmt.Errorf("request kind %q given twice", name)
		}
		out = append(out, k)
	}
	return out, nil
}

// benchSchema is the json kind's answer: a few fields of every JSON type
// a client asks for.
var benchSchema = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string"},"count":{"type":"integer"},"score":{"type":"number"},"tags":{"type":"array","items":{"type":"string"}},"done":{"type":"boolean"}},"required":["name","count","score","tags","done"],"additionalProperties":false}`)

// request is the path and body of a streamed request of kind k: prompt
// (token ids; decode writes them as text, for a chat message) for
// maxTokens tokens, drawn with seed.
func (k Kind) request(prompt []int, decode func([]int) string, maxTokens int, seed uint64) (string, []byte) {
	body := map[string]any{"temperature": k.Temperature, "seed": seed, "stream": true, "stream_options": map[string]bool{"include_usage": true}}
	if k.Presence != 0 || k.Frequency != 0 {
		body["presence_penalty"], body["frequency_penalty"] = k.Presence, k.Frequency
	}
	path := "/v1/completions"
	if k.JSONSchema { // the answer ends where the schema's object does
		path = "/v1/chat/completions"
		body["messages"] = []map[string]string{{"role": "user", "content": "Describe this as JSON: " + decode(prompt)}}
		body["max_completion_tokens"] = maxTokens
		body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "item", "strict": true, "schema": benchSchema}}
	} else {
		body["prompt"], body["max_tokens"], body["ignore_eos"] = prompt, maxTokens, true
	}
	b, _ := json.Marshal(body)
	return path, b
}

// seedOf is the seed of client k's r-th request in round round: every
// request its own, the same from run to run.
func seedOf(base uint64, round, k, r int) uint64 {
	return base + uint64(round)<<32 + uint64(k)<<16 + uint64(r)
}

// writeKinds writes the rows' medians over the rounds by client count and
// kind, beside greedy's on the same swarm, when there is more than one
// kind or round.
func writeKinds(w io.Writer, rep *Report) {
	type key struct {
		clients int
		kind    string
		draft   string
	}
	by := map[key][]Result{}
	var keys []key
	for _, r := range rep.Rows {
		k := key{r.Clients, r.Kind, r.Draft}
		if by[k] == nil {
			keys = append(keys, k)
		}
		by[k] = append(by[k], r)
	}
	if len(keys) == len(rep.Rows) {
		return // one row each: the table above says it all
	}
	slices.SortStableFunc(keys, func(a, b key) int { return cmp.Compare(a.clients, b.clients) })
	median := func(rows []Result, f func(Result) float64) float64 { // of the rows that have f (not NaN)
		v := make([]float64, 0, len(rows))
		for _, r := range rows {
			if x := f(r); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return math.NaN()
		}
		return quantilesOf(v).P50
	}
	missed := func(r Result) float64 { return float64(r.Workers.Misses) / float64(max(1, r.Workers.Loads)) }
	perToken := func(r Result) float64 { return float64(r.Workers.Loads) / float64(max(1, r.Tokens)) }
	agreement := func(r Result) float64 {
		if r.TokenAgreement < 0 {
			return math.NaN()
		}
		return r.TokenAgreement
	}
	tokps := func(r Result) float64 { return r.TokensPerS }
	fmt.Fprintf(w, "\n## By kind of request (medians over %d rounds, each round every kind in turn)\n\n", len(by[keys[0]]))
	fmt.Fprintln(w, "| clients | kind | loads missed | vs greedy | loads / token | vs greedy | shadow's guesses met | tok/s | rounds' loads missed |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---|")
	for _, k := range keys {
		rows := by[k]
		m, p := median(rows, missed), median(rows, perToken)
		vsM, vsP := "–", "–"
		if g := by[key{k.clients, "greedy", k.draft}]; g != nil && k.kind != "greedy" {
			vsM = fmt.Sprintf("%.2fx", m/median(g, missed))
			vsP = fmt.Sprintf("%.2fx", p/median(g, perToken))
		}
		var each []string
		for _, r := range rows {
			each = append(each, fmt.Sprintf("%.1f%%", 100*missed(r)))
		}
		agree := "–"
		if a := median(rows, agreement); !math.IsNaN(a) {
			agree = fmt.Sprintf("%.1f%%", 100*a)
		}
		kind := k.kind
		if k.draft != "" {
			kind += ", -draft " + k.draft
		}
		fmt.Fprintf(w, "| %d | %s | %.1f%% | %s | %.2f | %s | %s | %.1f | %s |\n", k.clients, kind, 100*m, vsM, p, vsP, agree, median(rows, tokps), strings.Join(each, ", "))
	}
	fmt.Fprintln(w, "\nKinds: greedy (temperature 0), tX (temperature X, top_p 1), penalties (t0.7, presence and frequency penalties 0.5), greedy-penalties (greedy with those penalties), json (t0.7, a chat completion whose answer follows a JSON schema: it ends where the object does). Every request seeded, its own seed. Loads missed: the workers' misses over their loads; loads / token: the workers' loads over the generated tokens; the shadow's guesses met: the rows it ran ahead whose token the main node then fed (odmoe_shadow_guesses_total).")
}
