package openai

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestEventMalformed: what says that a stream is no API stream (a line that is no field, a NUL,
// bytes that are not UTF-8, data that is no JSON object), and what does not (the API's chunks
// and events, [DONE] with white space or not, comments, events without data, the format's
// other fields, a byte order mark before the first, llama.cpp's "error:" event).
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
		{": \xff\n\n", true},
		// llama.cpp's error event is the engine's error, not bytes that are no event stream;
		// an "error:" line that holds no JSON object is.
		{"error: {\"code\":400,\"message\":\"the request exceeds the available context size\"}\n\n", false},
		{"error: boom\n\n", true},
		{"error: {not json\n\n", true},
		{"data: [DONE] \n\n", false},
		{"data: [DONE]\t\r\n\r\n", false},
		{"\xef\xbb\xbfdata: {\"choices\":[]}\n\n", false}, // a byte order mark starts the stream
		{"{\"error\":\"boom\"}\n", true},                  // a whole line, no blank line after it
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

// TestEngineErrorEvent: the error an engine sends in its stream, as llama.cpp's "error:" line or
// as data, is read as such (EngineError), is no keep-alive (Empty), and does not end the stream.
func TestEngineErrorEvent(t *testing.T) {
	const obj = `{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}`
	for _, tc := range []struct {
		in, want string
	}{
		{"error: " + obj + "\n\n", obj},
		{"error:" + obj + " \r\n\r\n", obj},
		{"data: {\"error\": " + obj + "}\n\n", "{\"error\": " + obj + "}"},
		{"data: {\"object\":\"error\",\"message\":\"boom\",\"code\":500}\n\n", "{\"object\":\"error\",\"message\":\"boom\",\"code\":500}"},
		{"data: {\"choices\":[{\"delta\":{\"content\":\"error\"}}]}\n\n", ""},
		{"error: boom\n\n", ""},
		{": error\n\n", ""},
	} {
		ev, err := NewSSEReader(strings.NewReader(tc.in), 1<<20).Next()
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if got := string(ev.EngineError()); got != tc.want {
			t.Errorf("%q: EngineError() = %q, want %q", tc.in, got, tc.want)
		}
		if tc.want != "" && (ev.Empty() || ev.Ends()) {
			t.Errorf("%q: Empty() %v, Ends() %v; want neither", tc.in, ev.Empty(), ev.Ends())
		}
	}
}

// TestSSEByteOrderMark: a byte order mark at the start of a stream is taken off, as the
// event-stream format says, also where it comes in pieces; one later in the stream is not.
func TestSSEByteOrderMark(t *testing.T) {
	const ev = "data: {\"a\":1}\n\n"
	for _, parts := range [][]string{
		{"\xef\xbb\xbf" + ev},
		{"\xef", "\xbb", "\xbf", ev},
		{"\xef\xbb\xbf", ev},
	} {
		r := NewSSEReader(io.MultiReader(readers(parts)...), 1<<20)
		got, err := r.Next()
		if err != nil {
			t.Fatalf("%q: %v", parts, err)
		}
		if string(got.Raw) != ev || got.Malformed() {
			t.Errorf("%q: event %q (malformed %v), want %q", parts, got.Raw, got.Malformed(), ev)
		}
	}
	r := NewSSEReader(strings.NewReader(ev+"\xef\xbb\xbf"+ev), 1<<20)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Next(); err != nil || !got.Malformed() {
		t.Errorf("a byte order mark inside the stream: %q, %v; want a malformed event", got.Raw, err)
	}
	// An "\xef" that is no byte order mark stays.
	got, err := NewSSEReader(io.MultiReader(strings.NewReader("\xef"), strings.NewReader("x\n\n")), 1<<20).Next()
	if err != nil || string(got.Raw) != "\xefx\n\n" {
		t.Errorf("a first byte that begins no byte order mark: %q, %v", got.Raw, err)
	}
}

func readers(parts []string) []io.Reader {
	var rs []io.Reader
	for _, p := range parts {
		rs = append(rs, strings.NewReader(p))
	}
	return rs
}
