package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Error types used in error bodies.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "not_found_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeUpstream       = "upstream_error"
	TypeServer         = "server_error"
)

// Error is an OpenAI error body: {"error": {"message", "type", "param", "code"}}. Status is the
// HTTP status it is sent with; it is not part of the body.
type Error struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Error returns the message with its status and type.
func (e *Error) Error() string {
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// NewError builds an Error. Empty param and code are sent as null.
func NewError(status int, typ, param, code, message string) *Error {
	e := &Error{Status: status, Type: typ, Message: message}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// BadRequest is a 400 invalid_request_error about param.
func BadRequest(param, format string, args ...any) *Error {
	return NewError(http.StatusBadRequest, TypeInvalidRequest, param, "", fmt.Sprintf(format, args...))
}

// belowMin is the 400 for a count field whose value is below 1, as OpenAI answers it:
// param the field, code integer_below_min_value; hint says what to do instead.
func belowMin(field string, v int, hint string) *Error {
	return NewError(http.StatusBadRequest, TypeInvalidRequest, field, "integer_below_min_value",
		fmt.Sprintf("%s must be at least 1, got %d: %s", field, v, hint))
}

// Body returns the JSON error body.
func (e *Error) Body() []byte {
	b, err := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	if err != nil { // cannot happen: only strings and pointers to strings
		return []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}`)
	}
	return b
}

// WriteError writes e as the response, with its status. Headers already set on w (such as
// Retry-After or x-request-id) are kept.
func WriteError(w http.ResponseWriter, e *Error) {
	b := e.Body()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Del("Content-Encoding")
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

// NormalizeUpstreamError turns the body of an engine's error response into an OpenAI error
// body, keeping its message, type, param and code when it has them. Engines disagree: vLLM
// sends code as a number (and older releases put the fields at the top level with
// "object":"error"), llama.cpp sends {"error":{"code":503,"message":...,"type":...}}, and a
// proxy in between may send plain text. An empty or unreadable message becomes one naming the
// status.
func NormalizeUpstreamError(status int, body []byte) *Error {
	e := &Error{Status: status}
	var outer map[string]json.RawMessage
	if json.Unmarshal(body, &outer) == nil {
		fields := outer
		if inner, ok := outer["error"]; ok {
			var m map[string]json.RawMessage
			if json.Unmarshal(inner, &m) == nil {
				fields = m
			} else {
				var s string
				if json.Unmarshal(inner, &s) == nil {
					fields = map[string]json.RawMessage{"message": inner}
				}
			}
		}
		e.Message = scalarText(fields["message"])
		e.Type = scalarText(fields["type"])
		if p := scalarText(fields["param"]); p != "" {
			e.Param = &p
		}
		if c := scalarText(fields["code"]); c != "" {
			e.Code = &c
		}
	} else if len(body) > 0 {
		msg := strings.TrimSpace(string(body)) // a plain-text body's line end is no part of it
		if len(msg) > 512 {
			msg = msg[:512]
		}
		e.Message = msg
	}
	if e.Message == "" {
		e.Message = fmt.Sprintf("upstream returned %d %s", status, http.StatusText(status))
	}
	if e.Type == "" {
		switch {
		case status == http.StatusNotFound:
			e.Type = TypeNotFound
		case status >= 500:
			e.Type = TypeUpstream
		default:
			e.Type = TypeInvalidRequest
		}
	}
	return e
}

// scalarText renders a JSON string, number or bool as text; anything else as "".
func scalarText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(x)
	}
	return ""
}
