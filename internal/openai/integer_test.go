package openai

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Every integer field the parser reads (max_tokens, max_completion_tokens, max_output_tokens,
// n) answers a value that is no integer as OpenAI's API does: code invalid_type, "must be an
// integer", for 4e1, 40.5, 1e400, a string or a bool; integer_above_max_value for an integer
// with more digits than an int holds (integer_below_min_value where it is negative). Before,
// each was "field max_tokens must be a number, not a JSON number 4e1" with code null.
func TestParseIntegerFields(t *testing.T) {
	type res struct{ Param, Code, Words string }
	bodies := map[Kind]string{
		KindChat:       `{"model":"m","messages":[{"role":"user","content":"x"}],%s}`,
		KindCompletion: `{"model":"m","prompt":"x",%s}`,
		KindResponse:   `{"model":"m","input":"x",%s}`,
	}
	for _, field := range []string{"max_tokens", "max_completion_tokens", "max_output_tokens", "n"} {
		for _, tc := range []struct {
			value string
			want  res
		}{
			{"4e1", res{field, CodeInvalidType, field + " must be an integer, got 4e1"}},
			{"40.5", res{field, CodeInvalidType, field + " must be an integer, got 40.5"}},
			{"40.0", res{field, CodeInvalidType, field + " must be an integer, got 40.0"}},
			{"1e400", res{field, CodeInvalidType, field + " must be an integer, got 1e400"}},
			{"-2.5", res{field, CodeInvalidType, field + " must be an integer, got -2.5"}},
			{`"40"`, res{field, CodeInvalidType, field + " must be an integer, not a JSON string"}},
			{"true", res{field, CodeInvalidType, field + " must be an integer, not a JSON boolean"}},
			{"[1]", res{field, CodeInvalidType, field + " must be an integer, not a JSON array"}},
			{"99999999999999999999", res{field, CodeAboveMax, field + " must be at most 9223372036854775807, got 99999999999999999999"}},
			{"-99999999999999999999", res{field, CodeBelowMin, field + " must be at least 1, got -99999999999999999999"}},
			{strings.Repeat("9", 100), res{field, CodeAboveMax, "got " + strings.Repeat("9", 32) + "..."}},
		} {
			for kind, shape := range bodies {
				body := strings.Replace(shape, "%s", `"`+field+`":`+tc.value, 1)
				for path, parse := range map[string]func(Kind, []byte) (*Request, error){"Parse": Parse, "parseDecoded": parseDecoded} {
					_, err := parse(kind, []byte(body))
					var e *Error
					if !errors.As(err, &e) {
						t.Errorf("%s(%v, %s): %v, want an *Error", path, kind, body, err)
						continue
					}
					var got res
					if e.Param != nil {
						got.Param = *e.Param
					}
					if e.Code != nil {
						got.Code = *e.Code
					}
					if strings.Contains(e.Message, tc.want.Words) {
						got.Words = tc.want.Words
					} else {
						got.Words = e.Message
					}
					if e.Status != 400 || e.Type != TypeInvalidRequest {
						t.Errorf("%s(%v, %s): %d %s, want 400 %s", path, kind, body, e.Status, e.Type, TypeInvalidRequest)
					}
					if diff := cmp.Diff(tc.want, got); diff != "" {
						t.Errorf("%s(%v, %s) (-want +got):\n%s", path, kind, body, diff)
					}
				}
			}
		}
	}
}

// NotInteger, which the router uses where it reads a count itself (best_of, a repeated
// max_tokens), answers as the parser does.
func TestNotInteger(t *testing.T) {
	for _, tc := range []struct{ v, code, words string }{
		{"4e1", CodeInvalidType, "best_of must be an integer, got 4e1"},
		{" 01 ", CodeInvalidType, "best_of must be an integer, got 01"},
		{"-", CodeInvalidType, "best_of must be an integer, got -"},
		{`"2"`, CodeInvalidType, "best_of must be an integer, not a JSON string"},
		{"{}", CodeInvalidType, "best_of must be an integer, not a JSON object"},
		{"18446744073709551616", CodeAboveMax, "best_of must be at most 9223372036854775807, got 18446744073709551616"},
		{"-18446744073709551616", CodeBelowMin, "best_of must be at least 1, got -18446744073709551616"},
	} {
		e := NotInteger("best_of", []byte(tc.v))
		if e.Status != 400 || e.Param == nil || *e.Param != "best_of" || e.Code == nil || *e.Code != tc.code || !strings.Contains(e.Message, tc.words) {
			t.Errorf("NotInteger(%q): %+v; want 400, param best_of, code %s, saying %q", tc.v, e, tc.code, tc.words)
		}
	}
}
