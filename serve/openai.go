package serve

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// The request and response bodies of OpenAI's chat completions and
// (legacy) completions APIs, as far as odmoe serves them. Unknown request
// fields are ignored, as OpenAI-compatible servers do; known ones odmoe
// cannot honour (n > 1, logprobs, echo, ...) are refused by name.

// samplingFields are the fields both endpoints share.
type samplingFields struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Logprobs    json.RawMessage `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
	// IgnoreEOS keeps generating past an end-of-sequence token (vLLM's
	// and llama-server's extension; benchmarks use it).
	IgnoreEOS bool `json:"ignore_eos"`
}

// chatRequest keeps messages, tools and template variables as the client
// wrote them (json.RawMessage): a chat template renders them, and its
// tojson must see the client's key order and numbers.
type chatRequest struct {
	samplingFields
	Messages []json.RawMessage `json:"messages"`
	Tools    json.RawMessage   `json:"tools"`
	// ChatTemplateKwargs are extra template variables (vLLM's extension),
	// e.g. {"enable_thinking": false} for Qwen3.
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
}

type completionRequest struct {
	samplingFields
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	Suffix *string         `json:"suffix"`
	BestOf *int            `json:"best_of"`
}

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails promptTokensDetails `json:"prompt_tokens_details"`
}

// promptTokensDetails says, as OpenAI's API does, how many of the
// prompt's tokens came from the prefix cache.
type promptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatDelta   `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usage       `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usage             `json:"usage,omitempty"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is the context length (vLLM's field).
	MaxModelLen int `json:"max_model_len"`
}

// apiError is an error in OpenAI's shape, with the HTTP status it goes
// out with.
type apiError struct {
	Status  int
	Message string
	Type    string // invalid_request_error, not_found_error, server_error, ...
	Param   string
	Code    string
}

func (e *apiError) Error() string { return e.Message }

func (e *apiError) body() any {
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	in := inner{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		in.Param = &e.Param
	}
	if e.Code != "" {
		in.Code = &e.Code
	}
	return map[string]inner{"error": in}
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}
