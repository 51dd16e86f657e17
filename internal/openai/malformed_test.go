package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEventMalformed: what says that a stream is no API stream (a line that is no field, a NUL,
// bytes that are not UTF-8, data that is no JSON object), and what does not (the API's chunks
// and events, [DONE], comments, events without data, the format's other fields).
func TestEventMalformed(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"data: {\"choices\":[{\"delta\":{\"content\":\"héllo\"}}]}\n\n", false},
		{"data: [DONE]\n\n", false},
		{": ping\n\n", false},
		{"event: response.output_text.delta\ndata: {\"delta\":\"a\"}\n\n", false},
		{"event: ping\n\n", false},
		{"id: 7\nretry: 1000\ndata: {\"a\":\ndata: 1}\n\n", false},
		{"data:{}\r\n\r\n", false},
		{"data: {not json\n\n", true},
		{"data: hello\n\n", true},
		{"data: [1, 2]\n\n", true},
		{"data: {\"a\":\"\x00\"}\n\n", true},
		{"data: {\"a\":\"\xff\xfe\"}\n\n", true},
		{"\x00\x00\x00\n\n", true},
		{"<html><body>502</body></html>\n\n", true},
		{"error: {\"message\":\"boom\"}\n\n", true},
		{": \xff\n\n", true},
	} {
		s := NewSSEReader(strings.NewReader(tc.in), 1<<20)
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got := ev.Malformed(); got != tc.want {
			t.Errorf("%q: Malformed() = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// BenchmarkEventMalformed is the check the proxy makes of every event of a stream (Malformed),
// beside what parsing the event's data whole would cost (json.Valid), for a chat chunk of 250
// bytes (a token's) and one of 4 KiB (a tool call's arguments, reasoning).
func BenchmarkEventMalformed(b *testing.B) {
	for _, size := range []int{250, 4 << 10} {
		pad := strings.Repeat("x", size-len(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":""}}]}`+"\n\n"))
		in := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + pad + `"}}]}` + "\n\n"
		ev, err := NewSSEReader(strings.NewReader(in), 1<<20).Next()
		if err != nil {
			b.Fatal(err)
		}
		name := map[int]string{250: "chunk=250B", 4 << 10: "chunk=4KiB"}[size]
		b.Run(name+"/Malformed", func(b *testing.B) {
			b.SetBytes(int64(len(ev.Raw)))
			for b.Loop() {
				if ev.Malformed() {
					b.Fatal("malformed")
				}
			}
		})
		b.Run(name+"/json.Valid", func(b *testing.B) {
			b.SetBytes(int64(len(ev.Raw)))
			for b.Loop() {
				if !json.Valid(ev.Data) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
