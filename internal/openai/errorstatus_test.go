package openai

import (
	"testing"
)

// TestErrorStatus: the status an engine's error object, sent in its stream, stands for, as
// each engine writes it.
func TestErrorStatus(t *testing.T) {
	for _, tc := range []struct {
		name, obj string
		want      int
	}{
		{"llama.cpp", `{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}`, 400},
		{"vLLM", `{"error":{"message":"too long","type":"BadRequestError","param":"input_tokens","code":400}}`, 400},
		{"older vLLM", `{"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}`, 500},
		{"SGLang", `{"error":{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}}`, 400},
		{"code as digits (LiteLLM)", `{"error":{"message":"slow down","type":"rate_limit_error","code":"429"}}`, 429},
		{"TGI validation", `{"error":{"message":"Input validation error: too long","http_status_code":422}}`, 422},
		{"TGI template", `{"error":{"message":"Template error: unknown filter","http_status_code":422}}`, 422},
		{"TGI overloaded", `{"error":{"message":"Model is overloaded","http_status_code":422}}`, 429},
		{"TGI generation", `{"error":{"message":"Request failed during generation: Server error: CUDA out of memory","http_status_code":422}}`, 424},
		{"TGI incomplete", `{"error":{"message":"Incomplete generation","http_status_code":422}}`, 500},
		{"TGI incomplete stream", `{"error":{"message":"Incomplete generation stream","http_status_code":422}}`, 500},
		{"TGI serialization", `{"error":{"message":"Stream event serialization error","http_status_code":422}}`, 500},
		{"http_status_code other than TGI's 422", `{"error":{"message":"Model is overloaded","http_status_code":503}}`, 503},
		{"code before http_status_code", `{"error":{"message":"m","code":400,"http_status_code":500}}`, 400},
		{"OpenAI type, code no status", `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, 400},
		{"ollama type", `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`, 400},
		{"not found type", `{"error":{"message":"no such model","type":"not_found_error"}}`, 404},
		{"vLLM not found type", `{"object":"error","message":"no such model","type":"NotFoundError"}`, 404},
		{"server type alone", `{"error":{"message":"boom","type":"server_error"}}`, 0},
		{"message alone", `{"error":{"message":"boom"}}`, 0},
		{"error a string", `{"error":"boom"}`, 0},
		{"code out of range", `{"error":{"message":"m","code":200}}`, 0},
		{"code not an integer", `{"error":{"message":"m","code":400.5}}`, 0},
		{"not JSON", `error`, 0},
		{"vLLM V0 dead", `{"object":"error","message":"Background loop has errored already.","type":"BadRequestError","code":400}`, 500},
		{"vLLM V0 stopped", `{"error":{"message":"Background loop is not running. If it was running, inspect the output to find the stacktrace of the error that caused the background loop to stop (AsyncEngineDeadError).","code":400}}`, 500},
		{"vLLM MQ dead", `{"object":"error","message":"Engine loop is not running. Inspect the stacktrace to find the original error: IndexError('pop from empty list').","code":400}`, 500},
		{"vLLM V1 dead", `{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for the root cause.","type":"BadRequestError","code":400}}`, 500},
		{"exception name first", `{"error":{"message":"AsyncEngineDeadError: Background loop has errored already.","code":400}}`, 500},
		{"dead, by type alone", `{"error":{"message":" enginecore encountered an issue","type":"BadRequestError"}}`, 500},
		{"dead engine's 503 kept", `{"error":{"message":"EngineCore encountered an issue.","code":503}}`, 503},
		{"dead engine named further on: the request's text", `{"error":{"message":"Invalid tool name 'EngineDeadError'","code":400}}`, 400},
		{"dead, no status", `{"error":{"message":"EngineCore encountered an issue."}}`, 0},
	} {
		if got := ErrorStatus([]byte(tc.obj)); got != tc.want {
			t.Errorf("%s: ErrorStatus(%s) = %d, want %d", tc.name, tc.obj, got, tc.want)
		}
	}
}

// TestStreamError: the error answer a stream's first event stands for keeps the engine's
// message, type and code, but for a dead engine's 400, which is a 500 of type upstream_error
// without the 400 as its code.
func TestStreamError(t *testing.T) {
	for _, tc := range []struct {
		name, obj      string
		status         int
		typ, code, msg string
	}{
		{"vLLM 400", `{"error":{"message":"too long","type":"BadRequestError","code":400}}`, 400, "BadRequestError", "400", "too long"},
		{"TGI 422", `{"error":{"message":"Input validation error: too long","http_status_code":422}}`, 422, TypeInvalidRequest, "", "Input validation error: too long"},
		{"no status", `{"error":{"message":"boom"}}`, 502, TypeUpstream, "", "boom"},
		{"vLLM dead 400", `{"object":"error","message":"Background loop has errored already.","type":"BadRequestError","code":400}`, 500, TypeUpstream, "", "Background loop has errored already."},
	} {
		e := StreamError([]byte(tc.obj), 502)
		code := ""
		if e.Code != nil {
			code = *e.Code
		}
		if e.Status != tc.status || e.Type != tc.typ || code != tc.code || e.Message != tc.msg {
			t.Errorf("%s: got %d %q code %q %q; want %d %q code %q %q", tc.name, e.Status, e.Type, code, e.Message, tc.status, tc.typ, tc.code, tc.msg)
		}
	}
}

// FuzzErrorStatus: whatever an engine sends as its error object, ErrorStatus answers a status
// from 400 to 599 or 0, and StreamError an error with a status and a message, without panicking.
func FuzzErrorStatus(f *testing.F) {
	for _, s := range []string{
		`{"error":{"message":"Input validation error","http_status_code":422}}`,
		`{"object":"error","message":"Background loop has errored already.","code":400}`,
		`{"error":{"message":"m","type":"invalid_request_error","code":"context_length_exceeded"}}`,
		`{"code":"4e2"}`, `{"error":null}`, `{"error":[1]}`, `[]`, `"x"`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if s := ErrorStatus(obj); s != 0 && (s < 400 || s > 599) {
			t.Fatalf("ErrorStatus(%q) = %d", obj, s)
		}
		if e := StreamError(obj, 502); e.Status < 400 || e.Status > 599 || e.Message == "" {
			t.Fatalf("StreamError(%q) = %+v", obj, e)
		}
	})
}
