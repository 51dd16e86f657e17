package openai

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Field names in a request body are case-sensitive for the engines behind the router (Python's
// json and pydantic: "Model" is not "model", and is ignored), but encoding/json matches them
// ignoring case, the last match winning. A body that names a field the router reads in another
// case ({"model": "b", "Model": "a"}, or a "Content" beside a message's "content") would be read
// one way by the router (its model check, token limits, prefix and salt) and another by the
// engine. Such bodies are refused (foldedKey); the fast path (scanBody) leaves every body with
// a case-folded key to parseDecoded, which asks foldedKey first.

// keyLevel says which of the router's shapes an object in the body is.
type keyLevel uint8

const (
	levelOther         keyLevel = iota // not read by the router: its keys are not checked
	levelBody                          // the top-level object (wire)
	levelMessage                       // an item of messages or input (wireMessage)
	levelPart                          // a content part
	levelToolCall                      // an item of a message's tool_calls
	levelFunction                      // a tool call's function
	levelStreamOptions                 // stream_options
)

// streamOptionsKeys are the keys fromWire reads in stream_options.
var streamOptionsKeys = [...]string{"include_usage"}

// levels says, per level, the keys the router reads in an object there, and the level of the
// value under those of them whose value it reads too.
var levels = [...]struct {
	names []string
	child map[string]keyLevel
}{
	levelBody:          {bodyKeys[:], map[string]keyLevel{"messages": levelMessage, "input": levelMessage, "stream_options": levelStreamOptions}},
	levelMessage:       {messageKeys[:], map[string]keyLevel{"content": levelPart, "output": levelPart, "tool_calls": levelToolCall}},
	levelPart:          {partKeys[:], nil},
	levelToolCall:      {toolCallKeys[:], map[string]keyLevel{"function": levelFunction}},
	levelFunction:      {functionKeys[:], nil},
	levelStreamOptions: {streamOptionsKeys[:], nil},
}

// foldedKey returns an error for the first key in body, where the router reads a field, that
// names one of its fields only when case is ignored; nil when there is none, or the body is not
// JSON (encoding/json then words the error).
func foldedKey(body []byte) error { return foldedIn(body, levelBody) }

// foldedIn is foldedKey for a value at lv.
func foldedIn(raw []byte, lv keyLevel) error {
	// encoding/json folds by Unicode's simple folding, where U+017F (long s) matches s and
	// U+212A (Kelvin sign) matches k: "max_tokenſ" is read as max_tokens. Without an upper-case
	// letter, either of those, or an escape that could make one, no key can be folded.
	if !bytes.ContainsAny(raw, "ABCDEFGHIJKLMNOPQRSTUVWXYZ\\\u017f\u212a") {
		return nil
	}
	key, want, found, _ := walkKeys(json.NewDecoder(bytes.NewReader(raw)), lv, 0)
	if !found {
		return nil
	}
	return BadRequest(key, "unknown field %q: field names are case-sensitive (%q is the field; an engine would ignore %q)", key, want, key)
}

// walkKeys reads one value from d; objects in it at lv (an array's items at lv too) have their
// keys checked. err is set when the body is not JSON or is nested too deep to follow.
func walkKeys(d *json.Decoder, lv keyLevel, depth int) (key, want string, found bool, err error) {
	if depth > maxScanDepth {
		return "", "", false, errTooDeep
	}
	t, err := d.Token()
	if err != nil {
		return "", "", false, err
	}
	delim, ok := t.(json.Delim)
	if !ok {
		return "", "", false, nil
	}
	switch delim {
	case '[':
		for d.More() {
			if key, want, found, err = walkKeys(d, lv, depth+1); found || err != nil {
				return key, want, found, err
			}
		}
	case '{':
		for d.More() {
			t, err := d.Token()
			if err != nil {
				return "", "", false, err
			}
			k, _ := t.(string)
			l := levels[lv]
			for _, n := range l.names {
				if k != n && strings.EqualFold(k, n) {
					return k, n, true, nil
				}
			}
			if key, want, found, err = walkKeys(d, l.child[k], depth+1); found || err != nil {
				return key, want, found, err
			}
		}
	}
	_, err = d.Token() // the closing delimiter
	return "", "", false, err
}

// errTooDeep: a body nested deeper than maxScanDepth, left to encoding/json.
var errTooDeep = jsonError("nested too deep")

type jsonError string

func (e jsonError) Error() string { return string(e) }
