package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Set is one top-level field to set in a JSON object: Value is its JSON encoding, or nil to
// delete the field.
type Set struct {
	Key   string
	Value []byte
}

// Patch returns a copy of the JSON object body with the given top-level fields replaced, added
// (before the closing brace, in the order given) or deleted. Every other byte of the body is
// kept as it was, so fields the router does not know pass through unchanged. A body that is not
// a JSON object is an error.
func Patch(body []byte, sets ...Set) ([]byte, error) {
	spans, end, err := topLevel(body)
	if err != nil {
		return nil, err
	}
	type edit struct {
		start, end int // byte span replaced
		with       []byte
	}
	var edits []edit
	done := make([]bool, len(sets))
	for _, sp := range spans {
		for i, s := range sets {
			if s.Key != sp.key {
				continue
			}
			done[i] = true
			if s.Value == nil {
				edits = append(edits, edit{sp.keyStart, sp.valEnd, nil})
			} else {
				edits = append(edits, edit{sp.valStart, sp.valEnd, s.Value})
			}
		}
	}
	var add []byte
	hasFields := len(spans) > 0
	for i, s := range sets {
		if done[i] || s.Value == nil {
			continue
		}
		if hasFields {
			add = append(add, ',')
		}
		k, _ := json.Marshal(s.Key)
		add = append(add, k...)
		add = append(add, ':')
		add = append(add, s.Value...)
		hasFields = true
	}
	if len(add) > 0 {
		edits = append(edits, edit{end, end, add})
	}
	slices.SortFunc(edits, func(a, b edit) int { return a.start - b.start })
	out := make([]byte, 0, len(body)+len(add)+64)
	pos := 0
	for _, e := range edits {
		if e.start < pos {
			continue // the same key twice: the first edit wins
		}
		out = append(out, body[pos:e.start]...)
		out = append(out, e.with...)
		pos = e.end
	}
	out = append(out, body[pos:]...)
	if !json.Valid(out) {
		// A deletion leaves a dangling comma ("a":1,,"b":2 or {,"b":2}); fix it by re-encoding
		// only the object's member list.
		return repack(body, sets)
	}
	return out, nil
}

type span struct {
	key                        string
	keyStart, valStart, valEnd int
}

// topLevel returns the spans of the object's members and the offset of its closing brace.
func topLevel(body []byte) ([]span, int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, 0, fmt.Errorf("body is not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, 0, errors.New("body is not a JSON object")
	}
	var spans []span
	for dec.More() {
		before := int(dec.InputOffset())
		tok, err := dec.Token()
		if err != nil {
			return nil, 0, fmt.Errorf("body is not a JSON object: %w", err)
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, 0, fmt.Errorf("body field %q: %w", key, err)
		}
		valEnd := int(dec.InputOffset())
		// Key start: skip the separator and spaces after the previous member.
		ks := before
		for ks < len(body) && (body[ks] == ',' || isSpace(body[ks])) {
			ks++
		}
		spans = append(spans, span{key: key, keyStart: ks, valStart: valEnd - len(raw), valEnd: valEnd})
	}
	tok, err = dec.Token()
	if err != nil {
		return nil, 0, fmt.Errorf("body is not a JSON object: %w", err)
	}
	end := int(dec.InputOffset()) - 1
	if _, err := dec.Token(); err != io.EOF {
		return nil, 0, errors.New("body has data after the JSON object")
	}
	_ = tok
	return spans, end, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// repack rebuilds the object member by member (each value's bytes kept) with sets applied.
func repack(body []byte, sets []Set) ([]byte, error) {
	spans, _, err := topLevel(body)
	if err != nil {
		return nil, err
	}
	out := []byte{'{'}
	n := 0
	emit := func(k string, v []byte) {
		if n > 0 {
			out = append(out, ',')
		}
		kb, _ := json.Marshal(k)
		out = append(out, kb...)
		out = append(out, ':')
		out = append(out, v...)
		n++
	}
	used := make([]bool, len(sets))
	for _, sp := range spans {
		v := body[sp.valStart:sp.valEnd]
		for i, s := range sets {
			if s.Key == sp.key {
				used[i] = true
				v = s.Value
			}
		}
		if v != nil {
			emit(sp.key, v)
		}
	}
	for i, s := range sets {
		if !used[i] && s.Value != nil {
			emit(s.Key, s.Value)
		}
	}
	out = append(out, '}')
	return out, nil
}

// Field returns the raw JSON of a top-level field of the object body, or nil when absent.
func Field(body []byte, key string) []byte {
	spans, _, err := topLevel(body)
	if err != nil {
		return nil
	}
	for _, sp := range spans {
		if sp.key == key {
			return body[sp.valStart:sp.valEnd]
		}
	}
	return nil
}

// IncludeUsageSplice says how to make body, req's (or a rewrite of it that kept its fields), ask
// for stream_options.include_usage without copying it: insert field at offset at (before the
// object's closing brace). ok is false when the body names stream_options already, even as
// null: WithIncludeUsage patches it then. Splicing costs nothing; WithIncludeUsage scans and
// copies the whole body three times (9 to 17 ms for a 400 KB body on this machine:
// BenchmarkIncludeUsage).
func IncludeUsageSplice(body []byte, req *Request) (at int, field []byte, ok bool) {
	if req == nil || req.StreamOptionsField {
		return 0, nil, false
	}
	i, ok := closingBrace(body)
	if !ok {
		return 0, nil, false
	}
	return i, includeUsageField, true
}

var includeUsageField = []byte(`,"stream_options":{"include_usage":true}`)

// CacheSaltSplice says how to make body, req's (or a rewrite of it that kept its fields), carry
// cache_salt with the JSON value v without copying it: replace body[at:end] with field. A body
// that does not name cache_salt gets the member `,"cache_salt":v` before its closing brace (at
// == end, where IncludeUsageSplice puts its field). A body that names it gets v in place of the
// value it sent, when that value's place is known: req is the body's own parse (body is
// req.Raw) by the one-pass scanner, which saw the name once, spelled exactly, and no other
// name encoding/json could take for it, so that no reader of the result sees a cache_salt
// other than v. ok is false otherwise (a name in another case or escaped, twice, a body
// rewritten or parsed by encoding/json): Patch it then. Patch scans and copies the whole body
// (4.4 to 9.3 ms for a 400 KB body on this machine, against 16 to 49 ns for this:
// go test -run XXX -bench CacheSalt -benchtime 50x ./internal/openai/).
func CacheSaltSplice(body []byte, req *Request, v []byte) (at, end int, field []byte, ok bool) {
	if req == nil {
		return 0, 0, nil, false
	}
	if req.CacheSaltField {
		if req.CacheSaltEnd == 0 || len(body) != len(req.Raw) || &body[0] != &req.Raw[0] {
			return 0, 0, nil, false
		}
		return req.CacheSaltAt, req.CacheSaltEnd, v, true
	}
	i, ok := closingBrace(body)
	if !ok {
		return 0, 0, nil, false
	}
	field = make([]byte, 0, len(cacheSaltKey)+len(v))
	return i, i, append(append(field, cacheSaltKey...), v...), true
}

var cacheSaltKey = []byte(`,"cache_salt":`)

// closingBrace returns the offset of the closing brace of body, an object with at least one
// member followed by nothing but whitespace; ok is false for anything else.
func closingBrace(body []byte) (int, bool) {
	i := len(body) - 1
	for i >= 0 && isSpace(body[i]) {
		i--
	}
	if i < 1 || body[i] != '}' {
		return 0, false
	}
	j := i - 1
	for j >= 0 && isSpace(body[j]) {
		j--
	}
	if j < 0 || body[j] == '{' {
		return 0, false // an empty object: no member to follow
	}
	return i, true
}

// WithIncludeUsage returns body with stream_options.include_usage set to true, keeping any
// other stream_options fields.
func WithIncludeUsage(body []byte) ([]byte, error) {
	so := Field(body, "stream_options")
	var v []byte
	if isPresent(so) && bytes.TrimSpace(so)[0] == '{' {
		var err error
		v, err = Patch(so, Set{Key: "include_usage", Value: []byte("true")})
		if err != nil {
			return nil, fmt.Errorf("stream_options: %w", err)
		}
	} else {
		v = []byte(`{"include_usage":true}`)
	}
	return Patch(body, Set{Key: "stream_options", Value: v})
}
