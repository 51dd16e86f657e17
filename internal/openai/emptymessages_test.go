package openai

import (
	"errors"
	"testing"
)

// A chat request whose messages are an empty array is refused, naming the field, as OpenAI's
// API refuses it: it was passed on, and an engine answered a prompt of nothing with 200.
func TestParseChatEmptyMessages(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","messages":[]}`,
		`{"model":"m","messages":[ ],"stream":true}`,
		`{"messages":[],"model":"m","max_tokens":4}`,
	} {
		_, err := Parse(KindChat, []byte(body))
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Param == nil || *e.Param != "messages" {
			t.Errorf("%s: %v, want a 400 naming messages", body, err)
		}
	}
	if _, err := Parse(KindChat, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Errorf("one message: %v", err)
	}
}
