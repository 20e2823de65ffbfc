package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/odmoe/odmoe/model"
)

// job is one checked request, ready to generate.
type job struct {
	endpoint  string
	prompt    []int
	maxTokens int
	sampler   *model.Sampler
	stops     []string
	ignoreEOS bool
	stream    bool
	usage     bool // stream_options.include_usage
	arrived   time.Time
	// logprobs: return each token's log-probability and topLogprobs
	// alternatives
	logprobs    bool
	topLogprobs int
	tools       *toolSyntax // read tool calls out of the answer in this syntax
	// toolsForced: the answer is calls alone (tool_choice required or a
	// named function), so text that could begin one is a call's
	toolsForced bool
}

// outcome is what a generation gave.
type outcome struct {
	text      string // all of it (non-streamed requests)
	calls     []toolCall
	generated int
	cached    int    // prompt tokens reused from the prefix cache
	finish    string // stop, length, tool_calls
	// choices are the tokens' logprobs: all of them (non-streamed
	// requests), or those no piece carried (streams)
	choices []model.Choice
}

// piece is what a stream sends at once: text, the tool calls that
// closed, and the logprobs of the tokens since the last piece.
type piece struct {
	text     string
	calls    []toolCall
	logprobs []model.Choice
}

// errStopString ends a generation at a stop string; errCutShort one the
// server's drain cuts short.
var (
	errStopString = errors.New("serve: stop string")
	errCutShort   = errors.New("serve: cut short by the server's shutdown")
)

// shape is how one endpoint's answers look: the whole response, and
// the chunks of a stream (first, if set, goes before the first piece).
type shape struct {
	whole func(out outcome, u *usage) any
	first any
	piece func(p piece) any
	final func(out outcome) any
	usage func(u *usage) any
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	s.answer(w, r, "chat", func() (*job, error) {
		var req chatRequest
		if err := s.decodeBody(w, r, &req); err != nil {
			return nil, err
		}
		if err := checkUnhonoured(req.unhonoured()...); err != nil {
			return nil, err
		}
		return s.chatJob(&req)
	}, s.chatShape)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	s.answer(w, r, "completions", func() (*job, error) {
		var req completionRequest
		if err := s.decodeBody(w, r, &req); err != nil {
			return nil, err
		}
		return s.completionJob(&req)
	}, s.completionShape)
}

// chatShape is chat.completion and chat.completion.chunk.
func (s *Server) chatShape(j *job) shape {
	id, created := "chatcmpl-"+randomID(), j.arrived.Unix()
	logprobs := func(choices []model.Choice) any {
		if !j.logprobs {
			return nil
		}
		return s.chatLogprobsOf(choices)
	}
	chunk := func(delta *chatDelta, finish *string, lps []model.Choice, u *usage) any {
		choices := []chatChoice{}
		if delta != nil {
			choices = []chatChoice{{Delta: delta, FinishReason: finish, Logprobs: logprobs(lps)}}
		}
		return chatResponse{ID: id, Object: "chat.completion.chunk", Created: created, Model: s.cfg.Model, SystemFingerprint: s.fingerprint, Choices: choices, Usage: u}
	}
	return shape{
		whole: func(out outcome, u *usage) any {
			msg := &chatMessage{Role: "assistant", Content: &out.text}
			if len(out.calls) > 0 {
				for i := range out.calls {
					out.calls[i].Index = nil
				}
				msg.ToolCalls = out.calls
				if out.text == "" {
					msg.Content = nil
				}
			}
			return chatResponse{ID: id, Object: "chat.completion", Created: created, Model: s.cfg.Model, SystemFingerprint: s.fingerprint,
				Choices: []chatChoice{{Message: msg, FinishReason: &out.finish, Logprobs: logprobs(out.choices)}}, Usage: u}
		},
		first: chunk(&chatDelta{Role: "assistant"}, nil, nil, nil),
		piece: func(p piece) any { return chunk(&chatDelta{Content: p.text, ToolCalls: p.calls}, nil, p.logprobs, nil) },
		final: func(out outcome) any { return chunk(&chatDelta{}, &out.finish, out.choices, nil) },
		usage: func(u *usage) any { return chunk(nil, nil, nil, u) },
	}
}

// completionShape is text_completion, whole and as chunks.
func (s *Server) completionShape(j *job) shape {
	id, created := "cmpl-"+randomID(), j.arrived.Unix()
	offset := 0 // where the next token's text starts, in bytes
	logprobs := func(choices []model.Choice) any {
		if !j.logprobs {
			return nil
		}
		lp, end := s.completionLogprobsOf(choices, offset)
		offset = end
		return lp
	}
	resp := func(choices []completionChoice, u *usage) any {
		return completionResponse{ID: id, Object: "text_completion", Created: created, Model: s.cfg.Model, SystemFingerprint: s.fingerprint, Choices: choices, Usage: u}
	}
	return shape{
		whole: func(out outcome, u *usage) any {
			return resp([]completionChoice{{Text: out.text, FinishReason: &out.finish, Logprobs: logprobs(out.choices)}}, u)
		},
		piece: func(p piece) any {
			return resp([]completionChoice{{Text: p.text, Logprobs: logprobs(p.logprobs)}}, nil)
		},
		final: func(out outcome) any {
			return resp([]completionChoice{{FinishReason: &out.finish, Logprobs: logprobs(out.choices)}}, nil)
		},
		usage: func(u *usage) any { return resp([]completionChoice{}, u) },
	}
}

// answer parses a request into a job with parse and answers it in the
// endpoint's shape, whole or streamed.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, endpoint string, parse func() (*job, error), shapeOf func(j *job) shape) {
	arrived := time.Now()
	if s.draining.Load() {
		w.Header().Set("Connection", "close")
		w.Header().Set("Retry-After", "1")
		s.fail(w, endpoint, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
			Message: "the server is shutting down: send the request to another node"})
		return
	}
	j, err := parse()
	if err != nil {
		s.fail(w, endpoint, err)
		return
	}
	j.endpoint, j.arrived = endpoint, arrived
	sh := shapeOf(j)
	if j.stream {
		s.streamEvents(w, r, j, sh)
		return
	}
	out, err := s.generate(r.Context(), j, nil)
	if err != nil {
		s.fail(w, endpoint, err)
		return
	}
	s.metrics.requests.WithLabelValues(endpoint, "200").Inc()
	writeJSON(w, http.StatusOK, sh.whole(out, j.usageOf(out)))
}

func (j *job) usageOf(out outcome) *usage {
	return &usage{PromptTokens: len(j.prompt), CompletionTokens: out.generated, TotalTokens: len(j.prompt) + out.generated,
		PromptTokensDetails: promptTokensDetails{CachedTokens: out.cached}}
}

// streamEvents answers j as server-sent events in shape sh: its first
// chunk (if any), a chunk per piece of text, the final chunk with the
// finish reason, the usage chunk when asked for, and [DONE]. Once the
// stream has begun an error can no longer change the status: it goes out
// as an error event.
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request, j *job, sh shape) {
	rc := http.NewResponseController(w)
	defer rc.SetWriteDeadline(time.Time{}) // a kept-alive connection's next answer has its own
	started := false
	send := func(v any) error {
		if !started {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		// a client that does not read holds the write, and its
		// connection, this long at most
		rc.SetWriteDeadline(time.Now().Add(s.cfg.StreamWriteTimeout))
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	ctx := r.Context()
	// the pieces go out on this goroutine's writer, not on the batch's
	// pass loop that generates them: a slow client (or a slow flush) holds
	// up no other request's next token
	w8 := newEventWriter(send)
	emitted := false
	out, err := s.generate(ctx, j, func(p piece) error {
		if !emitted && sh.first != nil {
			if err := w8.put(sh.first); err != nil {
				return err
			}
		}
		emitted = true
		return w8.put(sh.piece(p))
	})
	if werr := w8.close(); err == nil {
		err = werr
	}
	if err != nil && !started {
		s.fail(w, j.endpoint, err)
		return
	}
	if err != nil {
		status := http.StatusInternalServerError
		if ctx.Err() != nil {
			status = 499 // the client went away: nginx's code for it
		}
		s.metrics.requests.WithLabelValues(j.endpoint, strconv.Itoa(status)).Inc()
		if ctx.Err() == nil {
			e := &apiError{Status: status, Type: "server_error", Message: err.Error()}
			send(e.body())
		}
		return
	}
	s.metrics.requests.WithLabelValues(j.endpoint, "200").Inc()
	if !emitted && sh.first != nil {
		send(sh.first)
	}
	send(sh.final(out))
	if j.usage {
		send(sh.usage(j.usageOf(out)))
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	rc.Flush()
}

// eventWriter sends events in order on a goroutine of its own: put
// queues one (never waiting on the client) and reports the writer's
// error, if it has failed; close waits for the queue to drain.
type eventWriter struct {
	mu     sync.Mutex
	queue  []any
	closed bool
	err    error
	wake   chan struct{}
	done   chan struct{}
}

func newEventWriter(send func(any) error) *eventWriter {
	e := &eventWriter{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(e.done)
		var batch []any // the events being sent; its array goes back as the queue's
		for {
			e.mu.Lock()
			batch, e.queue = e.queue, batch[:0]
			closed := e.closed
			e.mu.Unlock()
			for _, v := range batch {
				if err := send(v); err != nil {
					e.mu.Lock()
					e.err = err
					e.mu.Unlock()
					return
				}
			}
			if closed && len(batch) == 0 {
				return
			}
			if len(batch) == 0 {
				<-e.wake
			}
		}
	}()
	return e
}

func (e *eventWriter) put(v any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return e.err
	}
	if len(e.queue) >= maxQueuedEvents { // the client reads slower than the tokens come: its request ends
		e.err = errSlowReader
		return e.err
	}
	e.queue = append(e.queue, v)
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

// maxQueuedEvents bound the events a stream holds for its client: a
// client that reads slower than its tokens come (or not at all) ends its
// own request, its memory freed, instead of the node holding every event
// it has not read.
const maxQueuedEvents = 1024

var errSlowReader = fmt.Errorf("serve: the client did not read its stream: %d events waited", maxQueuedEvents)

// close ends the queue once it has drained and returns the writer's
// error, if any.
func (e *eventWriter) close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	<-e.done
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// generate runs j when the batch has room, handing each piece of text
// that is final (stop strings cut, incomplete characters held back, tool
// calls read) to emit, or collecting it in the outcome when emit is nil.
func (s *Server) generate(ctx context.Context, j *job, emit func(piece) error) (outcome, error) {
	release, err := s.admit.acquire(ctx)
	if err != nil {
		return outcome{}, err
	}
	defer release()
	var out outcome
	var text []byte
	var pending []model.Choice // logprobs no piece has carried yet
	send := func(p piece) error {
		if p.text == "" && len(p.calls) == 0 {
			return nil
		}
		if emit == nil {
			text = append(text, p.text...)
			out.calls = append(out.calls, p.calls...)
			return nil
		}
		p.logprobs, pending = pending, nil
		return emit(p)
	}
	var tools *toolFilter
	if j.tools != nil {
		tools = &toolFilter{syntax: j.tools, forced: j.toolsForced}
	}
	put := func(text string) error {
		p := piece{text: text}
		if tools != nil {
			p.text, p.calls = tools.Push(text)
		}
		return send(p)
	}
	dec := s.cfg.Tokenizer.NewStreamDecoder()
	stop := newStopFilter(j.stops)
	last := j.arrived
	s.metrics.promptTokens.Add(float64(len(j.prompt)))
	generated, st, err := s.cfg.Generator.Generate(ctx, j.prompt, model.GenerateOptions{
		MaxTokens: j.maxTokens,
		Sampler:   j.sampler,
		StopAtEOS: !j.ignoreEOS,
		OnToken: func(step, id int, _ []float32) error {
			now := time.Now()
			if step == 0 {
				s.metrics.timeToFirstToken.Observe(now.Sub(j.arrived).Seconds())
			} else {
				s.metrics.interToken.Observe(now.Sub(last).Seconds())
			}
			last = now
			s.metrics.generatedTokens.Inc()
			if j.logprobs {
				pending = append(pending, j.sampler.Last())
			}
			piece, stopped := stop.Push(dec.Next(id))
			if err := put(piece); err != nil {
				return err
			}
			if stopped {
				return errStopString
			}
			if s.cutShort.Load() {
				return errCutShort
			}
			return nil
		},
	})
	out.generated, out.cached, out.finish = len(generated), st.CachedTokens, st.FinishReason
	if st.CachedTokens > 0 {
		s.metrics.prefixHits.Inc()
		s.metrics.cachedTokens.Add(float64(st.CachedTokens))
	}
	s.metrics.draftGuesses.Add(float64(st.Drafted))
	s.metrics.draftAccepted.Add(float64(st.Accepted))
	s.metrics.decodePasses.Add(float64(max(st.GeneratedTokens-1-st.Accepted, 0)))
	if e := st.Experts; e.Routed > 0 {
		s.metrics.requestRecall.Observe(e.Recall())
	}
	if e := st.Experts; e.Steps > 0 {
		s.metrics.requestMisses.Observe(float64(e.Misses) / float64(e.Steps))
	}
	if errors.Is(err, errCutShort) { // ends as max_tokens would end it
		err, out.finish = nil, "length"
	}
	switch {
	case errors.Is(err, errStopString):
		out.finish = "stop"
	case err != nil:
		return out, err
	default:
		piece, stopped := stop.Push(dec.Flush())
		if err := put(piece); err != nil {
			return out, err
		}
		if !stopped {
			if err := put(stop.Flush()); err != nil {
				return out, err
			}
		} else {
			out.finish = "stop"
		}
	}
	if tools != nil {
		text, calls := tools.Flush()
		if err := send(piece{text: text, calls: calls}); err != nil {
			return out, err
		}
		if tools.calls > 0 && out.finish == "stop" {
			out.finish = "tool_calls"
		}
	}
	out.choices = pending
	out.text = string(text)
	return out, nil
}

// chatJob checks a chat request and renders its prompt.
func (s *Server) chatJob(req *chatRequest) (*job, error) {
	if s.cfg.Chat == nil {
		return nil, badRequest("messages", "model %q has no chat template (tokenizer_config.json chat_template): use /v1/completions", s.cfg.Model)
	}
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages: at least one message is required")
	}
	msgs := make([]any, len(req.Messages))
	called := map[string]bool{} // the ids of the calls the assistant made so far
	for i, raw := range req.Messages {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
			return nil, badRequest(fmt.Sprintf("messages[%d]", i), "messages[%d]: not a JSON object", i)
		}
		role, ok := m["role"].(string)
		if !ok {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "messages[%d]: a role (string) is required", i)
		}
		if err := answersACall(m, role, i, called); err != nil {
			return nil, err
		}
		msgs[i] = raw // as the client wrote it
		// the OpenAI content-part form: text parts are joined, as
		// single-modality servers do
		if parts, ok := m["content"].([]any); ok {
			text, err := joinTextParts(parts, i)
			if err != nil {
				return nil, err
			}
			m["content"] = text
			msgs[i] = m
		}
	}
	vars := map[string]any{}
	for k, v := range req.ChatTemplateKwargs {
		vars[k] = v
	}
	vars["messages"] = msgs
	vars["add_generation_prompt"] = true
	tools, err := s.toolChoice(req)
	if err != nil {
		return nil, err
	}
	format, err := responseFormat(req.ResponseFormat)
	if err != nil {
		return nil, err
	}
	if format != nil && tools.force != nil {
		return nil, badRequest("tool_choice", "tool_choice %s cannot go with a response_format: both would constrain the answer", req.ToolChoice)
	}
	if tools.render {
		vars["tools"] = req.Tools
	}
	if v, ok := req.ChatTemplateKwargs["add_generation_prompt"]; ok {
		vars["add_generation_prompt"] = v
	}
	text, err := s.cfg.Chat.Render(vars)
	if err != nil {
		return nil, badRequest("messages", "the chat template refused the conversation: %v", err)
	}
	// the template writes the special tokens itself (apply_chat_template
	// tokenizes with add_special_tokens=False)
	prompt, err := s.encode(text, false, "messages")
	if err != nil {
		return nil, err
	}
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	j, err := s.job(&req.samplingFields, prompt, "messages", maxTokens, -1)
	if err != nil {
		return nil, err
	}
	j.tools, j.toolsForced = tools.parse, tools.force != nil
	for _, g := range []*answerGrammar{format, tools.force} {
		if g != nil {
			if err := s.constrain(j, g); err != nil {
				return nil, err
			}
		}
	}
	return j, nil
}

// answersACall notes the ids of an assistant message's tool calls in
// called, and refuses a tool message whose tool_call_id names none of
// them (as OpenAI does): its answer would go to no call.
func answersACall(m map[string]any, role string, i int, called map[string]bool) error {
	switch role {
	case "assistant":
		calls, _ := m["tool_calls"].([]any)
		for _, c := range calls {
			if cm, ok := c.(map[string]any); ok {
				if id, ok := cm["id"].(string); ok {
					called[id] = true
				}
			}
		}
	case "tool":
		id, present := m["tool_call_id"]
		if !present || id == nil {
			return nil
		}
		if s, ok := id.(string); !ok || !called[s] {
			return badRequest(fmt.Sprintf("messages[%d].tool_call_id", i), "messages[%d]: tool_call_id %v is not the id of a call in an earlier assistant message's tool_calls", i, jsonText(id))
		}
	}
	return nil
}

// jsonText writes v as JSON, for an error message.
func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func joinTextParts(parts []any, i int) (string, error) {
	if len(parts) > maxContentParts {
		return "", badRequest(fmt.Sprintf("messages[%d].content", i), "messages[%d].content: %d parts, at most %d", i, len(parts), maxContentParts)
	}
	var text strings.Builder // in one pass: += copied the text so far at every part
	for k, p := range parts {
		pm, ok := p.(map[string]any)
		if !ok || pm["type"] != "text" {
			return "", badRequest(fmt.Sprintf("messages[%d].content[%d]", i, k), "messages[%d].content[%d]: only text parts are supported", i, k)
		}
		t, _ := pm["text"].(string)
		text.WriteString(t)
	}
	return text.String(), nil
}

// maxContentParts bounds a message's content parts: text parts are
// joined, and a message has no use for thousands of them.
const maxContentParts = 1024

// completionJob checks a completion request and tokenizes its prompt.
func (s *Server) completionJob(req *completionRequest) (*job, error) {
	switch {
	case req.Echo:
		return nil, badRequest("echo", "echo is not supported")
	case req.Suffix != nil && *req.Suffix != "":
		return nil, badRequest("suffix", "suffix is not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		return nil, badRequest("best_of", "best_of must be 1")
	}
	if len(req.Prompt) == 0 || string(req.Prompt) == "null" {
		return nil, badRequest("prompt", "prompt is required")
	}
	prompt, err := s.completionPrompt(req.Prompt, false)
	if err != nil {
		return nil, err
	}
	return s.job(&req.samplingFields, prompt, "prompt", req.MaxTokens, 16)
}

// completionPrompt tokenizes a completion's prompt: a string, token ids,
// or (not inArray) one of those in an array, OpenAI's batch form with one
// entry, and nothing deeper.
func (s *Server) completionPrompt(raw json.RawMessage, inArray bool) ([]int, error) {
	var text string
	var ids []int
	var list []json.RawMessage
	switch {
	case json.Unmarshal(raw, &text) == nil:
		return s.encode(text, true, "prompt")
	case json.Unmarshal(raw, &ids) == nil:
		for _, id := range ids {
			if id < 0 || id >= s.cfg.Tokenizer.VocabSize() {
				return nil, badRequest("prompt", "prompt token id %d is outside the vocabulary of %d", id, s.cfg.Tokenizer.VocabSize())
			}
		}
		return ids, nil
	case inArray:
		return nil, badRequest("prompt", "prompt: an array holds one string or one array of token ids, nothing deeper")
	case json.Unmarshal(raw, &list) == nil && len(list) != 1:
		return nil, badRequest("prompt", "one prompt per request (got %d)", len(list))
	case len(list) == 1:
		return s.completionPrompt(list[0], true)
	}
	return nil, badRequest("prompt", "prompt must be a string or an array of token ids")
}

// job checks the fields both endpoints share; param names the prompt's
// field in errors ("messages" or "prompt"). defaultMax < 0 means the rest
// of the context.
func (s *Server) job(f *samplingFields, prompt []int, param string, maxTokens *int, defaultMax int) (*job, error) {
	if f.Model != "" && f.Model != s.cfg.Model {
		return nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q does not exist: this server serves %q", f.Model, s.cfg.Model)}
	}
	if err := checkUnhonoured(f.samplersUnhonoured()...); err != nil {
		return nil, err
	}
	if len(prompt) == 0 {
		return nil, badRequest(param, "the prompt encodes to no tokens")
	}
	ctxLen := s.cfg.Context
	if len(prompt) > ctxLen {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: "context_length_exceeded",
			Message: fmt.Sprintf("this model's maximum context length is %d tokens, but the prompt has %d", ctxLen, len(prompt))}
	}
	// n generated tokens take len(prompt)+n-1 positions (the last is
	// never fed back)
	room := ctxLen - len(prompt) + 1
	j := &job{prompt: prompt, stream: f.Stream, ignoreEOS: f.IgnoreEOS}
	switch {
	case maxTokens != nil && *maxTokens < 1:
		return nil, badRequest("max_tokens", "max_tokens must be at least 1, got %d", *maxTokens)
	case maxTokens != nil && *maxTokens > room:
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "max_tokens", Code: "context_length_exceeded",
			Message: fmt.Sprintf("this model's maximum context length is %d tokens: %d in the prompt leave room for %d, but max_tokens is %d", ctxLen, len(prompt), room, *maxTokens)}
	case maxTokens != nil:
		j.maxTokens = *maxTokens
	case defaultMax < 0:
		j.maxTokens = room
	default:
		j.maxTokens = min(defaultMax, room)
	}
	if f.N != nil && *f.N != 1 {
		return nil, badRequest("n", "n must be 1 (one choice per request)")
	}
	if f.StreamOptions != nil {
		if !f.Stream {
			return nil, badRequest("stream_options", "stream_options is only allowed with stream: true")
		}
		j.usage = f.StreamOptions.IncludeUsage
	}
	temperature, topP, topK := 1.0, 1.0, 0
	if f.Temperature != nil {
		temperature = *f.Temperature
	}
	if f.TopP != nil {
		topP = *f.TopP
	}
	if f.TopK != nil {
		topK = *f.TopK
	}
	switch {
	case temperature < 0 || temperature > 2 || math.IsNaN(temperature):
		return nil, badRequest("temperature", "temperature must be between 0 and 2, got %v", temperature)
	case topP <= 0 || topP > 1 || math.IsNaN(topP):
		return nil, badRequest("top_p", "top_p must be in (0, 1], got %v", topP)
	case topK < -1:
		return nil, badRequest("top_k", "top_k must be -1 or 0 (none) or positive, got %d", topK)
	}
	seed := mrand.Uint64()
	if f.Seed != nil {
		seed = uint64(*f.Seed)
	}
	j.sampler = model.NewSampler(temperature, topP, seed).WithTopK(topK)
	if err := s.samplingExtras(f, param == "messages", j); err != nil {
		return nil, err
	}
	stops, err := stopStrings(f.Stop, s.cfg.MaxStops)
	if err != nil {
		return nil, err
	}
	j.stops = stops
	return j, nil
}

// maxStopBytes bounds one stop string: a stop is a marker (a turn's end,
// a delimiter), and the automaton a request builds grows with its bytes.
const maxStopBytes = 1024

// stopStrings reads "stop": null, a string, or up to limit strings
// (Config.MaxStops: OpenAI's 4 by default), each of at most maxStopBytes.
func stopStrings(raw json.RawMessage, limit int) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var many []string
	var one string
	if json.Unmarshal(raw, &one) == nil {
		many = []string{one}
	} else if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	if len(many) > limit {
		return nil, badRequest("stop", "stop: %d stop strings, at most %d (the server's -max-stops)", len(many), limit)
	}
	for i, x := range many {
		if len(x) > maxStopBytes {
			return nil, badRequest("stop", "stop: stop string %d is %d bytes, at most %d", i, len(x), maxStopBytes)
		}
	}
	return many, nil
}

func randomID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
