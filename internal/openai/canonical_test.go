package openai

import (
	"fmt"
	"strings"
	"testing"
)

// canonicalRequests are requests of every part the canonical text renders.
func canonicalRequests() map[string]*Request {
	conv := &Request{Kind: KindChat}
	for i := range 2000 {
		conv.Messages = append(conv.Messages, Message{Role: "user", Parts: []string{fmt.Sprintf("%d %s", i, strings.Repeat("lorem ipsum ", 700))}})
	}
	return map[string]*Request{
		"empty": {Kind: KindChat},
		"every part": {Kind: KindResponse, Tools: []byte(`[{"type":"function"}]`), Instructions: "be brief",
			Messages: []Message{
				{Role: "system", Parts: []string{"sys"}},
				{Role: "user", Name: "ann", Parts: []string{"a", "b", ""}},
				{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: `{"x":1}`}, {Name: "g"}}},
				{Role: "tool", ToolCallID: "call_1", Parts: []string{"result"}},
			}},
		"prompts":      {Kind: KindCompletion, Prompt: Prompt{Texts: []string{"one", "two", ""}}},
		"tokens":       {Kind: KindCompletion, Prompt: Prompt{Tokens: [][]int64{{1, 2, 3}, {}, {4}}}},
		"conversation": conv,
	}
}

// TestCanonicalLen: canonicalLen is the length AppendCanonical writes, so that the text is
// allocated once, at its size: a conversation of 2,000 messages (16 MB) took 32 allocations
// (102 MB). Not counted under the race detector, whose instrumentation allocates more.
func TestCanonicalLen(t *testing.T) {
	for name, r := range canonicalRequests() {
		text := r.AppendCanonical(nil)
		if n := r.canonicalLen(); n != len(text) {
			t.Errorf("%s: canonicalLen %d, AppendCanonical wrote %d bytes", name, n, len(text))
		}
		if len(text) == 0 || raceEnabled {
			continue
		}
		if allocs := testing.AllocsPerRun(3, func() { r.AppendCanonical(nil) }); allocs != 1 {
			t.Errorf("%s: AppendCanonical(nil) made %v allocations, want 1", name, allocs)
		}
		dst := make([]byte, 0, len(text)+10)
		if allocs := testing.AllocsPerRun(3, func() { r.AppendCanonical(dst) }); allocs != 0 {
			t.Errorf("%s: AppendCanonical into a buffer with room made %v allocations, want none", name, allocs)
		}
	}
}

// BenchmarkAppendCanonical writes the canonical text of a conversation of 2,000 messages (16
// MB) into a buffer of 16 KiB, as the router's pooled one is at first.
func BenchmarkAppendCanonical(b *testing.B) {
	r := canonicalRequests()["conversation"]
	b.SetBytes(int64(len(r.AppendCanonical(nil))))
	b.ReportAllocs()
	for b.Loop() {
		r.AppendCanonical(make([]byte, 0, 16<<10))
	}
}
