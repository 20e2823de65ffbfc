package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
)

// The request and response bodies of OpenAI's chat completions and
// (legacy) completions APIs, as far as odmoe serves them. Unknown request
// fields are ignored, as OpenAI-compatible servers do; every field
// OpenAI's reference defines is honoured, or is one that cannot change
// the answer (user, metadata, store, service_tier, prompt_cache_key,
// safety_identifier), or is accepted at its neutral value alone and
// otherwise refused by name (unhonoured: n > 1, echo, audio, ...), so
// that no client is answered as if it had not asked.

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
	// Logprobs is a boolean in chat (with TopLogprobs the alternatives),
	// the number of alternatives in completions
	Logprobs         json.RawMessage    `json:"logprobs"`
	TopLogprobs      *int               `json:"top_logprobs"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	// IgnoreEOS keeps generating past an end-of-sequence token (vLLM's
	// and llama-server's extension; benchmarks use it).
	IgnoreEOS bool `json:"ignore_eos"`
	// MinP (min_p) keeps the tokens at least that share of the
	// likeliest's probability; RepeatPenalty and RepeatLastN are
	// llama-server's repeat_penalty over the last repeat_last_n tokens
	MinP          *float64 `json:"min_p"`
	RepeatPenalty *float64 `json:"repeat_penalty"`
	RepeatLastN   *int     `json:"repeat_last_n"`
	// llama-server's samplers odmoe does not have: refused by name
	// unless at their neutral values
	Mirostat   json.RawMessage `json:"mirostat"`
	TypicalP   json.RawMessage `json:"typical_p"`
	TFSZ       json.RawMessage `json:"tfs_z"`
	DRYMult    json.RawMessage `json:"dry_multiplier"`
	XTCProb    json.RawMessage `json:"xtc_probability"`
	Dynatemp   json.RawMessage `json:"dynatemp_range"`
	NProbs     json.RawMessage `json:"n_probs"`
	Grammar    json.RawMessage `json:"grammar"`
	JSONSchema json.RawMessage `json:"json_schema"`
}

// samplersUnhonoured are the llama-server sampling fields odmoe does not
// act on.
func (f *samplingFields) samplersUnhonoured() []unhonoured {
	return []unhonoured{
		{"mirostat", f.Mirostat, []string{"0"}, "mirostat sampling is not implemented (temperature, top_p, top_k, min_p, repeat_penalty and the penalties are)"},
		{"typical_p", f.TypicalP, []string{"1", "1.0"}, "locally typical sampling is not implemented"},
		{"tfs_z", f.TFSZ, []string{"1", "1.0"}, "tail-free sampling is not implemented"},
		{"dry_multiplier", f.DRYMult, []string{"0", "0.0"}, "DRY sampling is not implemented (frequency_penalty and presence_penalty are)"},
		{"xtc_probability", f.XTCProb, []string{"0", "0.0"}, "XTC sampling is not implemented"},
		{"dynatemp_range", f.Dynatemp, []string{"0", "0.0"}, "dynamic temperature is not implemented"},
		{"n_probs", f.NProbs, []string{"0"}, "give logprobs and top_logprobs instead"},
		{"grammar", f.Grammar, []string{`""`}, "GBNF grammars are not read: give response_format with a json_schema"},
		{"json_schema", f.JSONSchema, []string{"{}"}, "give response_format {\"type\": \"json_schema\", ...} instead"},
	}
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
	ToolChoice         json.RawMessage            `json:"tool_choice"`
	ParallelToolCalls  *bool                      `json:"parallel_tool_calls"`
	ResponseFormat     json.RawMessage            `json:"response_format"`
	// not acted on: accepted at their neutral values only
	Functions        json.RawMessage `json:"functions"`
	FunctionCall     json.RawMessage `json:"function_call"`
	Audio            json.RawMessage `json:"audio"`
	Modalities       json.RawMessage `json:"modalities"`
	Prediction       json.RawMessage `json:"prediction"`
	ReasoningEffort  json.RawMessage `json:"reasoning_effort"`
	Verbosity        json.RawMessage `json:"verbosity"`
	WebSearchOptions json.RawMessage `json:"web_search_options"`
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
	Role      string     `json:"role"`
	Content   *string    `json:"content"` // null when the answer is tool calls alone
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// toolCall is a call the model made, as OpenAI gives it: in a message,
// and (with Index) as a streamed delta, whole in one chunk.
type toolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON text
	} `json:"function"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatDelta   `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatDelta struct {
	Role      string     `json:"role,omitempty"`
	Content   string     `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// chatLogprobs is a chat choice's logprobs: one entry a token.
type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
	Refusal []tokenLogprob `json:"refusal"`
}

type tokenLogprob struct {
	topLogprob
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

// topLogprob is one alternative of a token's.
type topLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// completionLogprobs is a completion choice's logprobs, in the legacy
// shape: parallel lists, one entry a token.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

type chatResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint string       `json:"system_fingerprint"`
	Choices           []chatChoice `json:"choices"`
	Usage             *usage       `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type completionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint string             `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	Usage             *usage             `json:"usage,omitempty"`
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

// unhonoured is one request field odmoe does not act on: the JSON values
// (compact) at which acting on it changes nothing, and why it is refused
// otherwise.
type unhonoured struct {
	name    string
	value   json.RawMessage
	neutral []string
	why     string
}

// check refuses u by name unless it is absent, null or neutral.
func (u unhonoured) check() error {
	if len(u.value) == 0 || string(u.value) == "null" {
		return nil
	}
	var compact bytes.Buffer
	if json.Compact(&compact, u.value) == nil && slices.Contains(u.neutral, compact.String()) {
		return nil
	}
	return badRequest(u.name, "%s %s is not supported: %s", u.name, u.value, u.why)
}

// checkUnhonoured refuses the first of us set to other than its neutral
// value.
func checkUnhonoured(us ...unhonoured) error {
	for _, u := range us {
		if err := u.check(); err != nil {
			return err
		}
	}
	return nil
}

// unhonoured are the chat fields odmoe does not act on.
func (r *chatRequest) unhonoured() []unhonoured {
	return []unhonoured{
		{"functions", r.Functions, []string{"[]"}, "give tools instead (the deprecated functions are not read)"},
		{"function_call", r.FunctionCall, []string{`"none"`, `"auto"`}, "give tool_choice instead"},
		{"audio", r.Audio, nil, "the models here read and write text"},
		{"modalities", r.Modalities, []string{`["text"]`}, "the models here read and write text"},
		{"prediction", r.Prediction, nil, "predicted outputs are not used"},
		{"reasoning_effort", r.ReasoningEffort, nil, "no model here takes a reasoning effort (Qwen3's thinking: chat_template_kwargs enable_thinking)"},
		{"verbosity", r.Verbosity, nil, "no model here takes a verbosity"},
		{"web_search_options", r.WebSearchOptions, nil, "the server does not search the web"},
	}
}
