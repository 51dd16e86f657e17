package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
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

// Codes of the 400s about a field's value, as OpenAI's API names them.
const (
	CodeInvalidType = "invalid_type"            // a value of the wrong JSON type, or a number that is no integer
	CodeBelowMin    = "integer_below_min_value" // an integer below the field's least value
	CodeAboveMax    = "integer_above_max_value" // an integer above the field's greatest value
)

// BelowMin is the 400 for a count field whose value, got (as the client wrote it), is below 1:
// param the field, code integer_below_min_value; hint says what to do instead.
func BelowMin(field, got, hint string) *Error {
	return NewError(http.StatusBadRequest, TypeInvalidRequest, field, CodeBelowMin,
		fmt.Sprintf("%s must be at least 1, got %s: %s", field, cutValue(got), hint))
}

// AboveMax is the 400 for an integer field whose value, got (as the client wrote it), is above
// most: param the field, code integer_above_max_value; hint (optional) says why the bound.
func AboveMax(field string, most int, got, hint string) *Error {
	msg := fmt.Sprintf("%s must be at most %d, got %s", field, most, cutValue(got))
	if hint != "" {
		msg += ": " + hint
	}
	return NewError(http.StatusBadRequest, TypeInvalidRequest, field, CodeAboveMax, msg)
}

// NotInteger is the 400 for a count field (max_tokens, n, best_of...) whose JSON value v cannot
// be read as an int: a value of another type, or a number with a fraction or an exponent (40.5,
// 4e1, 1e400), is code invalid_type, as OpenAI's API answers "a decimal number" there (an
// engine in Python may take 4e1 for 40, or round 40.5, or refuse it: the router does not
// guess); an integer with more digits than an int holds is integer_above_max_value, or
// integer_below_min_value where it is negative.
func NotInteger(field string, v []byte) *Error {
	t := bytes.TrimSpace(v)
	if kind := jsonValueKind(t); kind != "number" {
		return notIntegerKind(field, kind)
	}
	return notIntegerNumber(field, string(t))
}

// notIntegerKind is NotInteger for a value of JSON kind kind ("string", "bool"...), not a number.
func notIntegerKind(field, kind string) *Error {
	return NewError(http.StatusBadRequest, TypeInvalidRequest, field, CodeInvalidType,
		fmt.Sprintf("%s must be an integer, not a JSON %s", field, jsonKindName(kind)))
}

// notIntegerNumber is NotInteger for a JSON number num that strconv.Atoi did not take.
func notIntegerNumber(field, num string) *Error {
	if jsonInteger(num) { // too many digits for an int
		if num[0] == '-' {
			return BelowMin(field, num, "leave it out for the default")
		}
		return AboveMax(field, math.MaxInt, num, "")
	}
	return NewError(http.StatusBadRequest, TypeInvalidRequest, field, CodeInvalidType,
		fmt.Sprintf("%s must be an integer, got %s: write it in digits, without a fraction or an exponent", field, cutValue(num)))
}

// jsonInteger reports whether s is an integer as JSON writes one: an optional minus, then 0
// or digits that do not begin with 0.
func jsonInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	return strings.Trim(s, "0123456789") == ""
}

// cutValue cuts a value a client wrote to at most 32 bytes for a message (a number can be a
// megabyte of digits).
func cutValue(s string) string {
	if len(s) <= 32 {
		return s
	}
	return s[:32] + "..."
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

// ErrorStatus returns the HTTP status that an engine's error object, sent in its stream,
// stands for: what the engine would have answered the request with had the error come before
// its head; 0 where the object names none. It reads the object's fields, or its "error"
// member's:
//   - "code", a number or a string of digits from 400 to 599: llama.cpp, vLLM and SGLang write
//     the status there (vLLM's older releases at the top level, beside "object": "error");
//   - else "http_status_code" (TGI's streams), with TGI's message: TGI names 422 for every error
//     in a stream, and its own failures are told by their fixed messages (tgiStatus);
//   - else "type", where it names a request's error: invalid_request_error (OpenAI's API,
//     ollama) or BadRequestError is a 400, not_found_error or NotFoundError a 404; a code that
//     is no status (OpenAI's "context_length_exceeded") leaves the status to the type.
//
// A 4xx whose message says that the engine itself is dead (engineDead) is a 500: vLLM's
// releases before its error classes wrote 400 for any failure in a stream, a dead engine
// included.
func ErrorStatus(obj []byte) int {
	status, _ := errorStatus(obj)
	return status
}

// errorStatus is ErrorStatus, and whether the status is the engine's failure where the
// object's fields named a request's error (a dead engine's 400).
func errorStatus(obj []byte) (status int, died bool) {
	var outer map[string]json.RawMessage
	if json.Unmarshal(obj, &outer) != nil {
		return 0, false
	}
	fields := outer
	var inner map[string]json.RawMessage
	if json.Unmarshal(outer["error"], &inner) == nil && inner != nil {
		fields = inner
	}
	msg := strings.TrimSpace(scalarText(fields["message"]))
	status = statusText(scalarText(fields["code"]))
	if status == 0 {
		if status = statusText(scalarText(fields["http_status_code"])); status != 0 {
			status = tgiStatus(status, msg)
		}
	}
	if status == 0 {
		switch scalarText(fields["type"]) {
		case TypeInvalidRequest, "BadRequestError":
			status = http.StatusBadRequest
		case TypeNotFound, "NotFoundError":
			status = http.StatusNotFound
		}
	}
	if status >= 400 && status < 500 && engineDead(msg) {
		return http.StatusInternalServerError, true
	}
	return status, false
}

// statusText reads s as an HTTP error status, 400 to 599; 0 where it is none.
func statusText(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 400 || n > 599 {
		return 0
	}
	return n
}

// tgiStatus is the status of TGI's error in a stream, named status, with message msg: TGI
// names 422 there for every error (into_openai_event), and answers the same errors outside a
// stream with their own statuses, each error with its fixed message: an overloaded engine 429,
// a failure in the generation 424, an incomplete generation (or stream) and an event it could
// not write 500. Any other message (an input validation, template or tool error) is the 422
// it names.
func tgiStatus(status int, msg string) int {
	if status != http.StatusUnprocessableEntity {
		return status
	}
	switch {
	case msg == "Model is overloaded":
		return http.StatusTooManyRequests
	case strings.HasPrefix(msg, "Request failed during generation"):
		return http.StatusFailedDependency
	case strings.HasPrefix(msg, "Incomplete generation"), msg == "Stream event serialization error":
		return http.StatusInternalServerError
	}
	return status
}

// deadEngine are the beginnings of the messages with which engines say they are dead, each
// the message of the engine's own exception: vLLM V1's EngineDeadError, V0's
// AsyncEngineDeadError (an errored or stopped background loop) and MQEngineDeadError; and a
// message that begins with the name of such an exception. Only the beginning is read: an
// engine's message about a request may quote the request's text further on.
var deadEngine = []string{
	"EngineCore encountered an issue",
	"Background loop has errored",
	"Background loop is not running",
	"Engine loop is not running",
	"EngineDeadError",
	"AsyncEngineDeadError",
	"MQEngineDeadError",
}

// engineDead reports whether msg, an engine's error message, says that the engine is dead.
func engineDead(msg string) bool {
	for _, p := range deadEngine {
		if len(msg) >= len(p) && strings.EqualFold(msg[:len(p)], p) {
			return true
		}
	}
	return false
}

// StreamError is the error answer that an engine's error object, sent as its stream's first
// event, stands for: the status ErrorStatus reads (orElse where it names none), and the
// object's message, type, param and code (NormalizeUpstreamError). A dead engine's error that
// named a request's (vLLM's 400) is a 500 of type upstream_error without the engine's code, so
// that no client takes it for its request's fault.
func StreamError(obj []byte, orElse int) *Error {
	status, died := errorStatus(obj)
	if status == 0 {
		status = orElse
	}
	e := NormalizeUpstreamError(status, obj)
	if died {
		e.Type, e.Code = TypeUpstream, nil
	}
	return e
}
