package serve

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/odmoe/odmoe/model"
	"github.com/odmoe/odmoe/model/tokenizer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/odmoe/odmoe/console"
	"github.com/rs/zerolog"
)

// ServingMessage is the line a server logs once it listens: what a
// harness waits for to know the node serves.
const ServingMessage = "serving the OpenAI-compatible API"

// Generator runs one sequence's generation: the prompt, then up to
// opt.MaxTokens tokens, each handed to opt.OnToken. It must be safe for
// concurrent use; a cancelled ctx ends the sequence and frees what it
// held (its KV rows, its state on other nodes).
type Generator interface {
	Generate(ctx context.Context, prompt []int, opt model.GenerateOptions) ([]int, model.GenerateStats, error)
}

// ChatTemplate renders a conversation into prompt text as Hugging Face's
// apply_chat_template does. vars holds messages, add_generation_prompt,
// tools (when given) and any extra template variables; the template adds
// bos_token and eos_token itself.
type ChatTemplate interface {
	Render(vars map[string]any) (string, error)
}

// Health is what GET /healthz reports: Ready (200, else 503) while the
// node can answer requests, the nodes that are down, and those that serve
// with a fault.
type Health struct {
	Ready bool     `json:"ready"`
	Down  []string `json:"down,omitempty"`
	// Degraded names nodes that serve with a fault, each with what it is
	// (a worker whose store failed a load, a lost worker and why): ready,
	// but worth a look.
	Degraded []string `json:"degraded,omitempty"`
}

// Config is what a Server serves.
type Config struct {
	Model     string // the model's name in the API (GET /v1/models, the "model" field)
	Tokenizer *tokenizer.Tokenizer
	Chat      ChatTemplate // nil: the model has none, and chat completions are refused
	Context   int          // the model's context (max_position_embeddings), in tokens
	// ModelIdentity says which weights and configuration answer (e.g. a
	// digest of config.json); with the build it makes each answer's
	// system_fingerprint.
	ModelIdentity string
	Generator     Generator
	// Health reports the node's roles; nil: always ready (local mode).
	Health func() Health
	// MaxStops is how many stop strings a request may give (default 4,
	// OpenAI's).
	MaxStops int
	// MaxBatch is how many sequences generate at once (default 8);
	// MaxQueue how many more requests may wait for a place (0: 64;
	// negative: none). A request beyond both is refused with 503.
	MaxBatch, MaxQueue int
	// Registry, if set, receives the server's metrics (GET /metrics serves
	// it); nil: a new registry.
	Registry *prometheus.Registry
	// APIKey, if set, is required as "Authorization: Bearer KEY" on every
	// route but GET /healthz (401 otherwise, in OpenAI's error shape).
	APIKey string
	// DrainTimeout is how long running requests may go on once Serve's
	// context ends (SIGINT, SIGTERM) before they are cut short (default
	// 10 s); new requests are refused meanwhile.
	DrainTimeout time.Duration
	// CORSOrigin lists, comma-separated, the browser origins whose pages
	// may call the API ("*": any; "": none, the default).
	CORSOrigin string
	// BodyTimeout is how long a request's body may take to arrive,
	// counted from when its headers were read (default 20 s): a client
	// trickling it in is answered 408 and its connection closed, whatever
	// the route (one that never reads the body too).
	BodyTimeout time.Duration
	// StreamWriteTimeout bounds one event's write to a streaming client
	// (default 10 s): a client that does not read has its request ended.
	StreamWriteTimeout time.Duration
	// NoConsole leaves out the console (a page at / with a chat and a
	// tile per node, and its feed at /console/events).
	NoConsole bool
	// Timeline, if set, gives the console the last decode passes' layer
	// timelines (JSON-able; the swarm's).
	Timeline func() any
	Log      zerolog.Logger
}

// Server is the HTTP API. Make one with New; Handler serves it.
type Server struct {
	cfg     Config
	admit   *admission
	metrics *metrics
	handler http.Handler // mux, behind the API key's check when there is one
	created int64
	// maxPromptBytes: a prompt text longer than this has more tokens than
	// the context for certain, and is refused before it is tokenized;
	// maxBody bounds a request's body (a request past the context is all
	// a longer one could carry)
	maxPromptBytes int
	maxBody        int64
	// draining: Serve's context ended, new requests are refused (503);
	// cutShort: the drain's time is up, running generations end at their
	// next token with finish_reason "length"
	draining, cutShort atomic.Bool
	// grammars constrain structured output and forced tool calls; tools
	// is the chat template's tool-call syntax (nil: none odmoe reads)
	grammars constraints
	tools    *toolSyntax
	// fingerprint is every answer's system_fingerprint: the build and
	// the model
	fingerprint string
	// drain ends when the drain starts
	drain    context.Context
	endDrain context.CancelFunc
	// open are the paths served without the API key: /healthz (load
	// balancers probe it without one) and the console's page, which holds
	// no data (what it shows comes through the routes behind the key)
	open map[string]bool
}

// bounds sets the prompt and body limits from the context and the
// tokenizer's longest token: no prompt of n bytes has fewer than n/L
// tokens, L the most bytes one token decodes to; a factor of 4 leaves
// room for normalizers that shrink text, and a body may carry 8 bytes of
// JSON per prompt byte (escapes, the messages' fields) plus 1 MiB.
func (s *Server) bounds() {
	longest := 1
	for id := range s.cfg.Tokenizer.VocabSize() {
		longest = max(longest, len(s.cfg.Tokenizer.Decode([]int{id}, false)))
	}
	s.maxPromptBytes = 4 * longest * s.cfg.Context
	s.maxBody = min(maxBody, 8*int64(longest)*int64(s.cfg.Context)+1<<20)
}

// New checks cfg and returns its server.
func New(cfg Config) (*Server, error) {
	if cfg.Tokenizer == nil || cfg.Generator == nil {
		return nil, errors.New("serve: a server needs a tokenizer and a generator")
	}
	if cfg.Context <= 0 {
		return nil, fmt.Errorf("serve: context of %d tokens", cfg.Context)
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 8
	}
	if cfg.MaxStops <= 0 {
		cfg.MaxStops = 4
	}
	if cfg.StreamWriteTimeout <= 0 {
		cfg.StreamWriteTimeout = 10 * time.Second
	}
	switch {
	case cfg.MaxQueue < 0:
		cfg.MaxQueue = 0
	case cfg.MaxQueue == 0:
		cfg.MaxQueue = 64
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 20 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	s := &Server{cfg: cfg, admit: newAdmission(cfg.MaxBatch, cfg.MaxQueue), created: time.Now().Unix(), tools: detectToolSyntax(cfg.Chat),
		fingerprint: fingerprint(buildID(), cfg.Model, cfg.ModelIdentity, cfg.Context)}
	s.drain, s.endDrain = context.WithCancel(context.Background())
	s.open = map[string]bool{"/healthz": true}
	s.bounds()
	s.metrics = newMetrics(cfg.Registry, s.admit)
	mux := http.NewServeMux()
	routes := []route{
		{"POST", "/v1/chat/completions", http.HandlerFunc(s.chatCompletions)},
		{"POST", "/v1/completions", http.HandlerFunc(s.completions)},
		{"GET", "/v1/models", http.HandlerFunc(s.models)},
		{"GET", "/v1/models/{id...}", http.HandlerFunc(s.model)},
		{"POST", "/tokenize", http.HandlerFunc(s.tokenize)},
		{"POST", "/detokenize", http.HandlerFunc(s.detokenize)},
		{"GET", "/healthz", http.HandlerFunc(s.healthz)},
		{"GET", "/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry})},
	}
	if !cfg.NoConsole {
		c := console.New(console.Config{Model: cfg.Model, Gatherer: cfg.Registry, Timeline: cfg.Timeline, Health: func() (down, degraded []string) {
			if cfg.Health == nil {
				return nil, nil
			}
			h := cfg.Health()
			return h.Down, h.Degraded
		}})
		routes = append(routes, route{"GET", "/{$}", http.HandlerFunc(c.Page)}, route{"GET", "/console/events", s.untilDrained(c.Events)})
		s.open["/"] = true
	}
	s.register(mux, routes)
	s.handler = mux
	if cfg.APIKey != "" {
		s.handler = s.requireKey(mux)
	}
	s.handler = s.bodyDeadline(s.cors(s.handler))
	return s, nil
}

// bodyDeadline bounds how long every request's body may take to arrive
// (Config.BodyTimeout), before any route runs: net/http reads what a
// handler left of a small body before it answers, with no deadline of
// its own, so a 404 or 401 to a client trickling its body would
// otherwise hold the connection for as long as the client likes.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)) // an httptest recorder has none: then unbounded
		next.ServeHTTP(w, r)
	})
}

// untilDrained serves h with a request context that also ends when the
// server starts draining: for streams that would otherwise never end.
func (s *Server) untilDrained(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(s.drain, cancel)()
		h(w, r.WithContext(ctx))
	})
}

// Handler is the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.handler }

// requireKey lets through requests that carry the API key as a bearer
// token, and those to the open paths (Server.open); the others
// get 401 in OpenAI's shape, as OpenAI's API answers a missing or wrong
// key.
func (s *Server) requireKey(next http.Handler) http.Handler {
	want := []byte("Bearer " + s.cfg.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.open[r.URL.Path] || subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		msg := "missing API key: send it as Authorization: Bearer KEY (odmoe run -api-key)"
		if r.Header.Get("Authorization") != "" {
			msg = "incorrect API key"
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="odmoe"`)
		w.Header().Set("Connection", "close") // answered now, its body left unread

		s.fail(w, endpointOf(r.URL.Path), &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key", Message: msg})
	})
}

// Serve answers on addr until ctx is cancelled, then drains: new
// connections and requests are refused, running requests go on for up to
// Config.DrainTimeout, then the ones still generating are cut short at
// their next token (a stream ends with its final chunk, finish_reason
// "length", and [DONE]; a whole answer comes with what it has) and
// waited for. ready, if set, gets the bound address once the listener is
// up.
func (s *Server) Serve(ctx context.Context, addr string, ready func(net.Addr)) error {
	ln, err := Listen(addr)
	if err != nil {
		return err
	}
	return s.ServeOn(ctx, ln, ready)
}

// Listen opens the API's TCP address (-http), saying what to do when it
// cannot.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-http %s: cannot serve there (%w): choose another ADDR, or port 0 for any free one", addr, err)
	}
	return ln, nil
}

// ServeOn is Serve on a listener already open (a node opens its address
// before it loads the model, so that an address in use is said at once).
func (s *Server) ServeOn(ctx context.Context, ln net.Listener, ready func(net.Addr)) error {
	// an idle keep-alive connection is closed after two minutes, as
	// nginx's and Go's reverse proxies do: idle clients cannot pile up
	// descriptors
	// requests do not inherit ctx: its end starts the drain, not their end
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	hs := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return base }}
	if ready != nil {
		ready(ln.Addr())
	}
	s.cfg.Log.Info().Str("addr", ln.Addr().String()).Str("model", s.cfg.Model).Int("max_batch", s.cfg.MaxBatch).
		Int("context", s.cfg.Context).Bool("chat_template", s.cfg.Chat != nil).Bool("api_key", s.cfg.APIKey != "").Msg(ServingMessage)
	if s.cfg.APIKey == "" && !loopback(ln.Addr()) {
		s.cfg.Log.Warn().Str("addr", ln.Addr().String()).
			Msg("serving the API beyond this machine without an API key: anyone who reaches this address can use it (-api-key KEY or $ODMOE_API_KEY)")
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	s.endDrain() // the console's feeds end: they would hold the drain open
	s.cfg.Log.Info().Dur("drain_timeout", s.cfg.DrainTimeout).Msg("draining: new requests are refused, running ones finish or are cut short")
	cut := time.AfterFunc(s.cfg.DrainTimeout, func() { s.cutShort.Store(true) })
	defer cut.Stop()
	// the running requests' time, and a last 10 s for those cut short to
	// write their ends
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout+10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		cancelBase()
		hs.Close()
	}
	<-errc
	return nil
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "odmoe", MaxModelLen: s.cfg.Context,
	}}})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	h := Health{Ready: true}
	if s.cfg.Health != nil {
		h = s.cfg.Health()
	}
	status := http.StatusOK
	if !h.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, h)
}

// maxBody is the most a request body may hold whatever the context.
const maxBody = 16 << 20

// decodeBody reads a JSON request body of at most s.maxBody bytes, which
// must arrive within Config.BodyTimeout, into v.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	// JSON only: a browser page may send a form or plain text anywhere
	// without asking first (no CORS preflight), never JSON
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		w.Header().Set("Connection", "close") // the body is not read
		return &apiError{Status: http.StatusUnsupportedMediaType, Type: "invalid_request_error",
			Message: fmt.Sprintf("the request body must be JSON (Content-Type: application/json), not %q", r.Header.Get("Content-Type"))}
	}
	rc := http.NewResponseController(w)
	body, err := readBody(http.MaxBytesReader(w, r.Body, s.maxBody), r.ContentLength, s.maxBody) // within bodyDeadline's
	if err != nil {
		// the rest of the body is not read: the connection closes after
		// the answer instead of waiting for it
		w.Header().Set("Connection", "close")
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
				Message: fmt.Sprintf("request body over %d bytes: more than a prompt of this model's %d-token context could need", s.maxBody, s.cfg.Context)}
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return &apiError{Status: http.StatusRequestTimeout, Type: "invalid_request_error", Message: fmt.Sprintf("the request body did not arrive within %v", s.cfg.BodyTimeout)}
		}
		return badRequest("", "reading the request body: %v", err)
	}
	rc.SetReadDeadline(time.Time{}) // the answer may stream for long; the server still sees the client hang up
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := strings.TrimPrefix(te.Field, "samplingFields.") // the embedded struct is not in the API
			return badRequest(field, "field %q: expected %s, got JSON %s", field, te.Type, te.Value)
		}
		return badRequest("", "invalid JSON in the request body: %v", err)
	}
	return nil
}

// readBody reads all of r into one buffer of the length the request
// announced (its Content-Length, when within limit; net/http's body ends
// there), not one grown by doubling: a body near the limit then holds its
// length, not up to twice it.
func readBody(r io.Reader, announced, limit int64) ([]byte, error) {
	if announced <= 0 || announced > limit {
		return io.ReadAll(r)
	}
	b := make([]byte, announced)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// encode tokenizes a prompt, refusing one too long for the context
// before it is tokenized (param names it in the error).
func (s *Server) encode(text string, addSpecial bool, param string) ([]int, error) {
	if len(text) > s.maxPromptBytes {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: "context_length_exceeded",
			Message: fmt.Sprintf("this model's maximum context length is %d tokens, and a prompt of %d bytes has more", s.cfg.Context, len(text))}
	}
	ids, ok := s.cfg.Tokenizer.EncodeAtMost(text, addSpecial, s.cfg.Context)
	if !ok { // found as its tokens pass the context, not after all of them
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Code: "context_length_exceeded",
			Message: fmt.Sprintf("this model's maximum context length is %d tokens, and the prompt has more", s.cfg.Context)}
	}
	return ids, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the response failed","type":"server_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// fail writes e (or, for any other error, a 500) and counts the request.
func (s *Server) fail(w http.ResponseWriter, endpoint string, err error) {
	var e *apiError
	if !errors.As(err, &e) {
		e = &apiError{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	}
	s.metrics.requests.WithLabelValues(endpoint, strconv.Itoa(e.Status)).Inc()
	if e.Status >= 500 {
		s.cfg.Log.Warn().Str("endpoint", endpoint).Int("status", e.Status).Str("error", e.Message).Msg("request failed")
	}
	writeJSON(w, e.Status, e.body())
}

// loopback reports whether a is a loopback address (an unspecified one,
// 0.0.0.0 or ::, listens on every interface: not loopback).
func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// endpointOf is the requests metric's endpoint label of a path: one of a
// few (the handlers' own: chat, completions; other), whatever path a
// client sends.
func endpointOf(path string) string {
	switch path {
	case "/v1/chat/completions":
		return "chat"
	case "/v1/completions":
		return "completions"
	}
	return "other"
}

// fingerprint is OpenAI's system_fingerprint for a build serving a
// model: it changes when either does, so a client that compares it
// between answers (a seeded request's reproducibility hangs on it) sees
// the change.
func fingerprint(build, model, identity string, context int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\n%s\n%s\n%d", build, model, identity, context)))
	return "fp_" + hex.EncodeToString(sum[:6])
}

// buildID is the binary's commit (and whether its tree was modified),
// or its module version when the build has no VCS stamp.
func buildID() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	id, modified := bi.Main.Version, ""
	for _, st := range bi.Settings {
		switch {
		case st.Key == "vcs.revision":
			id = st.Value
		case st.Key == "vcs.modified" && st.Value == "true":
			modified = "+modified"
		}
	}
	return id + modified
}
