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

// ErrorStatus returns the HTTP status that an engine's error object, sent in its stream, names:
// its "code" (or its "error" member's), a number or a string of digits from 400 to 599, as
// llama.cpp and vLLM write the status there; 0 where it names none.
func ErrorStatus(obj []byte) int {
	var outer map[string]json.RawMessage
	if json.Unmarshal(obj, &outer) != nil {
		return 0
	}
	fields := outer
	var inner map[string]json.RawMessage
	if json.Unmarshal(outer["error"], &inner) == nil && inner != nil {
		fields = inner
	}
	n, err := strconv.Atoi(scalarText(fields["code"]))
	if err != nil || n < 400 || n > 599 {
		return 0
	}
	return n
}
