package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// RewriteText returns body with every prompt text the engine sees passed through f: each chat
// message's string content or text parts (messages), a completion's string prompt or strings
// (prompt), a Responses request's string input or its items' text (input) and its
// instructions. Every other field, in the object and in each message, is kept as received.
// changed is false (and body returned as is) when f changed nothing.
func RewriteText(kind Kind, body []byte, f func(string) string) (out []byte, changed bool, err error) {
	var sets []Set
	switch kind {
	case KindChat:
		v, ch, err := rewriteMessages(Field(body, "messages"), f)
		if err != nil {
			return nil, false, fmt.Errorf("messages: %w", err)
		}
		if ch {
			sets = append(sets, Set{Key: "messages", Value: v})
		}
	case KindCompletion:
		v, ch, err := rewritePromptValue(Field(body, "prompt"), f)
		if err != nil {
			return nil, false, fmt.Errorf("prompt: %w", err)
		}
		if ch {
			sets = append(sets, Set{Key: "prompt", Value: v})
		}
	case KindResponse:
		in := Field(body, "input")
		var v []byte
		var ch bool
		var err error
		if t := bytes.TrimSpace(in); len(t) > 0 && t[0] == '[' {
			v, ch, err = rewriteMessages(in, f)
		} else {
			v, ch, err = rewritePromptValue(in, f)
		}
		if err != nil {
			return nil, false, fmt.Errorf("input: %w", err)
		}
		if ch {
			sets = append(sets, Set{Key: "input", Value: v})
		}
		v, ch, err = rewritePromptValue(Field(body, "instructions"), f)
		if err != nil {
			return nil, false, fmt.Errorf("instructions: %w", err)
		}
		if ch {
			sets = append(sets, Set{Key: "instructions", Value: v})
		}
	default:
		return body, false, nil
	}
	if len(sets) == 0 {
		return body, false, nil
	}
	out, err = Patch(body, sets...)
	if err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// rewritePromptValue rewrites a JSON string or array of strings; other values are left alone.
func rewritePromptValue(raw []byte, f func(string) string) ([]byte, bool, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return nil, false, nil
	}
	switch t[0] {
	case '"':
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return nil, false, err
		}
		n := f(s)
		if n == s {
			return nil, false, nil
		}
		b, err := json.Marshal(n)
		return b, err == nil, err
	case '[':
		var ss []string
		if json.Unmarshal(t, &ss) != nil {
			return nil, false, nil // token ids: nothing to rewrite
		}
		changed := false
		for i, s := range ss {
			if n := f(s); n != s {
				ss[i], changed = n, true
			}
		}
		if !changed {
			return nil, false, nil
		}
		b, err := json.Marshal(ss)
		return b, err == nil, err
	}
	return nil, false, nil
}

// rewriteMessages rewrites the content of each message object of a JSON array.
func rewriteMessages(raw []byte, f func(string) string) ([]byte, bool, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, false, err
	}
	changed := false
	for i, m := range msgs {
		content := Field(m, "content")
		t := bytes.TrimSpace(content)
		if len(t) == 0 {
			continue
		}
		var nv []byte
		var ch bool
		var err error
		if t[0] == '[' {
			nv, ch, err = rewriteParts(t, f)
		} else {
			nv, ch, err = rewritePromptValue(t, f)
		}
		if err != nil {
			return nil, false, fmt.Errorf("[%d].content: %w", i, err)
		}
		if !ch {
			continue
		}
		pm, err := Patch(m, Set{Key: "content", Value: nv})
		if err != nil {
			return nil, false, fmt.Errorf("[%d]: %w", i, err)
		}
		msgs[i], changed = pm, true
	}
	if !changed {
		return nil, false, nil
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(m)
	}
	b.WriteByte(']')
	return b.Bytes(), true, nil
}

// rewriteParts rewrites the "text" of each content part that has one.
func rewriteParts(raw []byte, f func(string) string) ([]byte, bool, error) {
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, false, err
	}
	changed := false
	for i, p := range parts {
		tv := Field(p, "text")
		nv, ch, err := rewritePromptValue(tv, f)
		if err != nil {
			return nil, false, fmt.Errorf("[%s].text: %w", strconv.Itoa(i), err)
		}
		if !ch || bytes.TrimSpace(tv)[0] != '"' {
			continue
		}
		np, err := Patch(p, Set{Key: "text", Value: nv})
		if err != nil {
			return nil, false, err
		}
		parts[i], changed = np, true
	}
	if !changed {
		return nil, false, nil
	}
	out, err := json.Marshal(parts)
	return out, err == nil, err
}
