package serve

import (
	"fmt"
	"net/http"
	"strings"
)

// The routes: one table of what the API serves, each path's other
// methods answered 405 (with Allow) and an unknown path 404, both as
// OpenAI's JSON errors where net/http answers in text/plain; and the
// handlers beside the completions: one model by id (OpenAI's
// /v1/models/{model}), llama-server's /tokenize and /detokenize.

// route is one served path and the method it answers.
type route struct {
	method, path string
	h            http.Handler
}

// register serves routes on mux, the JSON 405 for each path's other
// methods and the JSON 404 for any other path.
func (s *Server) register(mux *http.ServeMux, routes []route) {
	paths := make([]string, len(routes))
	for i, rt := range routes {
		paths[i] = rt.method + " " + asWritten(rt.path)
		mux.Handle(rt.method+" "+rt.path, rt.h)
		mux.HandleFunc(rt.path, func(w http.ResponseWriter, r *http.Request) { // any other method
			w.Header().Set("Allow", rt.method)
			s.fail(w, endpointOf(r.URL.Path), &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error",
				Message: r.Method + " " + r.URL.Path + " is not served; it answers " + rt.method})
		})
	}
	served := strings.Join(paths, ", ")
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, "other", &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "no route " + r.Method + " " + r.URL.Path + "; odmoe serves " + served})
	})
}

// model answers GET /v1/models/{id}: the served model's card, or 404 as
// OpenAI answers an unknown model.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id != s.cfg.Model {
		s.fail(w, "other", &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: "the model " + quoteID(id) + " does not exist; this server serves " + quoteID(s.cfg.Model)})
		return
	}
	writeJSON(w, http.StatusOK, modelCard{ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "odmoe", MaxModelLen: s.cfg.Context})
}

func quoteID(id string) string { return "'" + strings.ReplaceAll(id, "'", `\'`) + "'" }

// tokenizeRequest is llama-server's /tokenize body.
type tokenizeRequest struct {
	Content    *string `json:"content"`
	AddSpecial bool    `json:"add_special"`
	WithPieces bool    `json:"with_pieces"`
}

// tokenPiece is a token with its text, as /tokenize's with_pieces gives.
type tokenPiece struct {
	ID    int    `json:"id"`
	Piece string `json:"piece"`
}

// tokenize answers POST /tokenize {"content": TEXT, "add_special":
// bool, "with_pieces": bool} with {"tokens": [ids]}, or with pieces
// [{"id", "piece"}] whose texts make the content again, as
// llama-server does; a text longer than the context is refused as a
// prompt would be.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if e := s.decodeBody(w, r, &req); e != nil {
		s.fail(w, "other", e)
		return
	}
	if req.Content == nil {
		s.fail(w, "other", &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "content", Message: `"content" is required: the text to tokenize`})
		return
	}
	ids, ok := s.cfg.Tokenizer.EncodeAtMost(*req.Content, req.AddSpecial, s.cfg.Context)
	if !ok {
		s.fail(w, "other", &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "content", Code: "context_length_exceeded",
			Message: fmt.Sprintf("the text is longer than the model's context of %d tokens", s.cfg.Context)})
		return
	}
	if !req.WithPieces {
		writeJSON(w, http.StatusOK, map[string][]int{"tokens": append([]int{}, ids...)})
		return
	}
	pieces := make([]tokenPiece, len(ids))
	for i, id := range ids {
		pieces[i] = tokenPiece{ID: id, Piece: s.piece(ids, i)}
	}
	writeJSON(w, http.StatusOK, map[string][]tokenPiece{"tokens": pieces})
}

// piece is the text ids[i] adds after the id before it (its leading
// space included, which a SentencePiece decoder strips from a text's
// first token only), or its own text where that is not a clean suffix
// (a byte of an unfinished UTF-8 sequence).
func (s *Server) piece(ids []int, i int) string {
	tok := s.cfg.Tokenizer
	if i == 0 {
		return tok.Decode(ids[:1], false)
	}
	before, with := tok.Decode(ids[i-1:i], false), tok.Decode(ids[i-1:i+1], false)
	if rest, ok := strings.CutPrefix(with, before); ok && !strings.ContainsRune(with, '\uFFFD') {
		return rest
	}
	return tok.Decode(ids[i:i+1], false)
}

// detokenize answers POST /detokenize {"tokens": [ids]} with
// {"content": TEXT}; an id outside the vocabulary is refused by name.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens *[]int `json:"tokens"`
	}
	if e := s.decodeBody(w, r, &req); e != nil {
		s.fail(w, "other", e)
		return
	}
	if req.Tokens == nil {
		s.fail(w, "other", &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "tokens", Message: `"tokens" is required: the ids to detokenize`})
		return
	}
	for i, id := range *req.Tokens {
		if id < 0 || id >= s.cfg.Tokenizer.VocabSize() {
			s.fail(w, "other", &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: "tokens",
				Message: fmt.Sprintf("token %d is %d, outside the vocabulary of %d", i, id, s.cfg.Tokenizer.VocabSize())})
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": s.cfg.Tokenizer.Decode(*req.Tokens, false)})
}

// asWritten is a mux pattern as a person writes the path: "/{$}" is
// "/", "/v1/models/{id...}" is "/v1/models/{id}".
func asWritten(pattern string) string {
	return strings.ReplaceAll(strings.ReplaceAll(pattern, "{$}", ""), "...}", "}")
}
