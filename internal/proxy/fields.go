package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/openai"
)

// engineFields are the members of a request body that act on the engine beyond the request
// itself, on what every request sharing the engine gets (config.EngineFields says which and
// why), so that a tenant sends them only where the operator lets it (tenants[].allow_fields).
// None of them is set by kvroute, which routes whole requests.
var engineFields = config.EngineFields

// allows reports whether the request's tenant may send the body member field of engineFields
// to the engine: every request without tenants, a tenant's where its allow_fields names it.
func (c *call) allows(field string) bool {
	return c.id == nil || slices.Contains(c.id.AllowFields, field)
}

// dropEngineFields removes from the body to forward the members of engineFields that the
// request's tenant may not send, as the engine would read them: every top-level member whose
// name decodes to one of them (escaped, or more than once). A body that names none is left as it
// is, uncopied; one that cannot be patched is refused, never sent with them.
func (c *call) dropEngineFields() *openai.Error {
	var drop uint
	for i, f := range engineFields {
		if !c.allows(f) {
			drop |= 1 << i
		}
	}
	if drop == 0 {
		return nil
	}
	named, ok := topLevelNames(c.body, engineFields)
	if ok {
		drop &= named
	}
	if drop == 0 {
		return nil
	}
	var sets []openai.Set
	for i, f := range engineFields {
		if drop&(1<<i) != 0 {
			sets = append(sets, openai.Set{Key: f}) // no value: deleted
			if ok {
				c.removed = append(c.removed, f)
			}
		}
	}
	nb, err := openai.Patch(c.body, sets...)
	if err != nil {
		return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, "", "",
			"the request body cannot be read to leave out the fields its tenant may not send (priority, kv_transfer_params, ...); send one JSON object")
	}
	c.body = nb
	return nil
}

// topLevelNames reports, a bit for each of names, which of them the JSON object body names at
// its top level, by the names' decoded text (as a JSON reader finds them: escaped, repeated).
// ok is false when body is not an object it can read.
func topLevelNames(body []byte, names []string) (found uint, ok bool) {
	ok = topLevel(body, func(key, _ []byte) {
		for j, n := range names {
			if string(key) == n {
				found |= 1 << j
			}
		}
	})
	if !ok {
		return 0, false
	}
	return found, true
}

// topLevel calls visit with each member of the JSON object body at its top level, in order:
// its name's decoded text (as a JSON reader finds it: escaped, repeated) and its value's bytes
// as they are. It reports false when body is not an object it can read (visit may have been
// called for the members before the fault). It reads the body once without copying: strings
// are skipped with bytes.IndexByte, so a long prompt costs a memchr, not a decode
// (openai.Patch, which would find the names too, decodes and copies the whole body).
func topLevel(body []byte, visit func(key, value []byte)) bool {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	if i = skipSpace(body, i+1); i < len(body) && body[i] == '}' {
		return true
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return false
		}
		end, ok := stringEnd(body, i)
		if !ok {
			return false
		}
		key := body[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			if json.Unmarshal(body[i:end], &s) != nil {
				return false
			}
			key = []byte(s)
		}
		if i = skipSpace(body, end); i >= len(body) || body[i] != ':' {
			return false
		}
		start := skipSpace(body, i+1)
		if i, ok = skipValue(body, start); !ok {
			return false
		}
		visit(key, body[start:i])
		if i = skipSpace(body, i); i >= len(body) {
			return false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return true
		default:
			return false
		}
	}
}

// bestOf reads best_of from a completions request body: how many sequences the engine
// generates for each prompt, of which it returns the n best (vLLM's completions API, and
// OpenAI's legacy one). 0 when the body does not name it, or names it null. The member is
// found as an engine reads the body (its name unescaped, the last one where it is repeated);
// openai.Parse does not read it. Like n, it is at most maxChoices, and an integer: a value an
// engine might still take for one (2.0, "2") is refused rather than left uncounted.
func bestOf(body []byte) (int, *openai.Error) {
	if bytes.IndexByte(body, '\\') < 0 && !quoted(body, "best_of") {
		// No name decodes to best_of without an escape or these bytes: a prompt of token ids
		// is spared the scan, which reads numbers a byte at a time (0.5 to 0.9 ms for 100,000
		// ids, where the two searches take some 0.03 ms).
		return 0, nil
	}
	var val []byte
	if !topLevel(body, func(key, v []byte) {
		if string(key) == "best_of" {
			val = v
		}
	}) {
		return 0, openai.BadRequest("", "the request body cannot be read for best_of; send one JSON object")
	}
	if val == nil || string(val) == "null" {
		return 0, nil
	}
	digits := val
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' || bytes.ContainsFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) {
		return 0, openai.NotInteger("best_of", val)
	}
	n, err := strconv.Atoi(string(val))
	switch {
	case val[0] == '-' || n < 1 && err == nil:
		return 0, openai.BelowMin("best_of", string(val), "leave it out to generate n sequences")
	case err != nil || n > maxChoices:
		// (err: more digits than an int holds)
		return 0, openai.AboveMax("best_of", maxChoices, string(val), "the sequences generated for one prompt, as n")
	}
	return n, nil
}

// quoted reports whether b holds one of names between quotes, going from quote to quote with
// bytes.IndexByte (bytes.Contains, led by the quote, gave up on that for a slower search after
// the first few quotes it met: as slow as the scan it was to spare), once for all of them.
func quoted(b []byte, names ...string) bool {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return false
		}
		i += j + 1
		rest := b[i:]
		for _, s := range names {
			if len(rest) > len(s) && string(rest[:len(s)]) == s && rest[len(s)] == '"' {
				return true
			}
		}
	}
}

// stringEnd returns the offset just after the JSON string that starts at b[i] (a quote).
func stringEnd(b []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false
		}
		q := j + k
		n := 0 // backslashes before the quote: an odd number escapes it
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, true
		}
		j = q + 1
	}
}

// skipValue returns the offset just after the JSON value that starts at b[i]. Only the nesting
// of objects and arrays and the ends of strings are followed: the body was parsed whole before.
func skipValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, ok := stringEnd(b, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	start := i // a number, true, false or null: up to what may follow a value
	for ; i < len(b); i++ {
		if c := b[i]; c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			break
		}
	}
	return i, i > start
}
