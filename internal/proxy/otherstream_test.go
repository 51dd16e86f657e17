package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
)

// TestOtherTypeStreamIgnoresMaxTokens: TestEngineIgnoresMaxTokens, the stream sent under
// text/plain or application/json. Its events were read only at its end, within maxCapture:
// the client got 12.8 MB for a max_tokens of 5, the request was logged 200 and charged
// nothing (R1 review). Now it is cut at the same bound as an event stream, with the same error
// event, and settled the same.
func TestOtherTypeStreamIgnoresMaxTokens(t *testing.T) {
	for _, ct := range []string{"text/plain", "application/json"} {
		t.Run(ct, func(t *testing.T) {
			sent := make(chan int, 1)
			url := engine(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				bw := bufio.NewWriter(w)
				i := 0
				for ; i < 100_000; i++ {
					if _, err := bw.WriteString(overrunChunk(i)); err != nil {
						break
					}
					if i%10 == 9 {
						if bw.Flush() != nil {
							break
						}
						w.(http.Flusher).Flush()
						if r.Context().Err() != nil {
							break
						}
					}
				}
				sent <- i
			}).URL
			f := newFixture(t, spec(url, "m"))
			hl := &healthLog{}
			withLifecycle(t, f, nil, hl)
			logs := jsonLogger(f)
			f.h.Gate = overrunGate(t, f, 0)
			resp, got := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
				"Authorization", "Bearer sk-1")
			n, last := contentEventsIn(got)
			if resp.StatusCode != http.StatusOK || n != 2*5+16 {
				t.Errorf("got %d with %d content events (%d bytes); want 200 and the 26 events within the bound", resp.StatusCode, n, len(got))
			}
			if !strings.HasPrefix(last, "event: error") || !strings.Contains(last, `"code":"upstream_bad_answer"`) || !strings.Contains(last, "ignored max_tokens") {
				t.Errorf("the stream's last event is %q; want an error event upstream_bad_answer saying the engine ignored max_tokens", last)
			}
			select {
			case wrote := <-sent:
				if wrote >= 100_000 {
					t.Errorf("the engine wrote all of its %d chunks: its connection was not closed", wrote)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the engine never saw its client go")
			}
			line := lastAccess(t, logs)
			if line["status"] != float64(502) || line["error_code"] != "upstream_bad_answer" || line["charged_completion_tokens"] != float64(5) {
				t.Errorf("access line: status %v, error_code %v, charged_completion_tokens %v; want 502, upstream_bad_answer, 5",
					line["status"], line["error_code"], line["charged_completion_tokens"])
			}
			if failed, _ := hl.told(); !slices.Equal(failed, []route.Failure{route.FailStatus}) {
				t.Errorf("the endpoint was told %v; want one %v (a bad answer)", failed, route.FailStatus)
			}
		})
	}
}

// TestOtherTypeStreamChargedPastCapture: a stream under text/plain longer than maxCapture, with
// no usage, is charged its content events, as an event stream is: its events were read only
// from the first maxCapture bytes at its end, and past them not at all (charged 0).
func TestOtherTypeStreamChargedPastCapture(t *testing.T) {
	const events = 5000
	pad := strings.Repeat("a", 1000)
	url := engine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		bw := bufio.NewWriter(w)
		for i := range events {
			fmt.Fprintf(bw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s%d\"}}]}\n\n", pad, i)
		}
		_, _ = bw.WriteString("data: [DONE]\n\n")
		_ = bw.Flush()
	}).URL
	f := newFixture(t, spec(url, "m"))
	logs := jsonLogger(f)
	f.h.Gate = overrunGate(t, f, 0)
	resp, got := f.post(t, "/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":6000,"messages":[{"role":"user","content":"x"}]}`,
		"Authorization", "Bearer sk-1")
	if resp.StatusCode != http.StatusOK || len(got) <= maxCapture || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) {
		t.Fatalf("got %d with %d bytes; want 200 and the whole stream, over %d bytes", resp.StatusCode, len(got), maxCapture)
	}
	line := lastAccess(t, logs)
	if line["status"] != float64(200) || line["completion_tokens"] != float64(events) || line["charged_completion_tokens"] != float64(events) {
		t.Errorf("access line: status %v, completion_tokens %v, charged_completion_tokens %v; want 200, %d, %d",
			line["status"], line["completion_tokens"], line["charged_completion_tokens"], events, events)
	}
}

// TestOtherStreamReads: otherStream reads the events of what it passes on whatever the chunks
// it comes in (a byte at a time) and its line ends, hands every byte on unchanged, and cuts
// where the content events pass the bound: before the event past it with an SSE error event,
// or, where that event began in a chunk already handed on, with an error.
func TestOtherStreamReads(t *testing.T) {
	chunk := func(i int, eol string) string {
		return strings.ReplaceAll(overrunChunk(i), "\n", eol)
	}
	stream := func(n int, eol string) string {
		var b strings.Builder
		b.WriteString("\n" + eol) // blank lines before the first event
		for i := range n {
			b.WriteString(chunk(i, eol))
			if i == 2 {
				b.WriteString(": keep-alive" + eol + eol)
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		name      string
		body      string
		oneByte   bool
		maxTokens int // 0: no bound
		events    int // content events counted
		complete  bool
		want      string // what the client gets; "" for body
		wantErr   error
	}{
		{name: "lf", body: stream(10, "\n") + "data: [DONE]\n\n", events: 10, complete: true},
		{name: "crlf bytewise", body: stream(10, "\r\n") + "data: [DONE]\r\n\r\n", oneByte: true, events: 10, complete: true},
		{name: "cr bytewise", body: stream(10, "\r") + "data: [DONE]", oneByte: true, events: 10, complete: true},
		{name: "last event without its blank line", body: stream(3, "\n") + "data: {\"choices\":[{\"delta\":{\"content\":\"z\"}}]}", events: 3},
		{name: "a JSON answer", body: `{"id":"x","choices":[{"message":{"content":"data: a"}}]}`, events: 0},
		{name: "within the bound", body: stream(26, "\n") + "data: [DONE]\n\n", maxTokens: 5, events: 26, complete: true},
		{name: "cut", body: stream(40, "\n"), maxTokens: 5, events: 26, want: stream(26, "\n")},
		{name: "cut bytewise", body: stream(40, "\n"), oneByte: true, maxTokens: 5, events: 26, wantErr: errOverrun},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &Handler{Logger: slog.New(slog.DiscardHandler)}
			c := &call{h: h, rid: "r1", req: &openai.Request{MaxTokens: tc.maxTokens}, stream: true, seqs: 1, choices: 1}
			var src io.Reader = strings.NewReader(tc.body)
			if tc.oneByte {
				src = iotest.OneByteReader(src)
			}
			s := newOtherStream(io.NopCloser(src), c)
			got, err := io.ReadAll(s)
			_ = s.Close()
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("read error %v, want %v", err, tc.wantErr)
			}
			want := tc.want
			if want == "" && tc.wantErr == nil {
				want = tc.body
			}
			if tc.want != "" {
				// The events within the bound, then the error event.
				if !strings.HasPrefix(string(got), want) || !strings.Contains(string(got[len(want):]), "event: error") {
					t.Errorf("got %q;\nwant %q and an error event", got, want)
				}
			} else if tc.wantErr == nil && string(got) != want {
				t.Errorf("got %q;\nwant %q", got, want)
			}
			if c.contentEvents != tc.events || c.complete != tc.complete || c.overran != (tc.want != "" || tc.wantErr != nil) {
				t.Errorf("content events %d, complete %v, overran %v; want %d, %v, %v", c.contentEvents, c.complete, c.overran,
					tc.events, tc.complete, tc.want != "" || tc.wantErr != nil)
			}
		})
	}
}

// TestOtherStreamEventTooLarge: an event over maxEvent cuts the stream (stream_event_too_large),
// as an event stream's reader does, whether its blank line came or not; the events before it
// are handed on.
func TestOtherStreamEventTooLarge(t *testing.T) {
	big := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("a", maxEvent) + "\"}}]}"
	for _, tail := range []string{"\n\n" + overrunChunk(1), "\n"} {
		h := &Handler{Logger: slog.New(slog.DiscardHandler)}
		c := &call{h: h, rid: "r1", req: &openai.Request{}, stream: true}
		body := overrunChunk(0) + big + tail
		s := newOtherStream(io.NopCloser(strings.NewReader(body)), c)
		got, err := io.ReadAll(s)
		_ = s.Close()
		if !errors.Is(err, errEventTooLarge) || !strings.HasPrefix(string(got), overrunChunk(0)) || len(got) > len(body)-len(tail)-1 {
			t.Errorf("read %d bytes, %v; want the first event, not all of the large one, then %v", len(got), err, errEventTooLarge)
		}
		if !c.cut || c.errType != "stream_event_too_large" || c.contentEvents != 1 {
			t.Errorf("cut %v, error_type %q, %d content events; want a cut stream_event_too_large after 1", c.cut, c.errType, c.contentEvents)
		}
	}
}

// chunkedReader hands out its bytes in chunks of the sizes given, in turn.
type chunkedReader struct {
	b     []byte
	sizes []int
	i     int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.b), r.sizes[r.i%len(r.sizes)])
	r.i++
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// TestOtherStreamAsWhole: read in chunks of any sizes, a stream's events count as takeEvents
// counts them read whole at its end (the content events, the usage, the terminator), whatever
// its line ends, comments and blank lines, and it is handed on unchanged.
func TestOtherStreamAsWhole(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	parts := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}",
		": keep-alive", "event: response.output_text.delta\ndata: {\"delta\":\"x\"}",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}", "data: {\"choices\":[{\"text\":\"b\"}]}\ndata: {}",
	}
	eols := []string{"\n", "\r\n", "\r"}
	for i := range 300 {
		eol := eols[i%len(eols)]
		var b strings.Builder
		for range rnd.IntN(40) {
			b.WriteString(strings.ReplaceAll(parts[rnd.IntN(len(parts))], "\n", eol) + eol + eol)
			if rnd.IntN(8) == 0 {
				b.WriteString(eol) // a blank line more
			}
		}
		switch rnd.IntN(3) {
		case 0:
			b.WriteString("data: [DONE]" + eol + eol)
		case 1:
			b.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"cut") // a part of an event
		}
		body := "data: {\"choices\":[{\"delta\":{\"content\":\"first\"}}]}" + eol + eol + b.String()
		want := &call{h: &Handler{Logger: slog.New(slog.DiscardHandler)}, req: &openai.Request{}, stream: true}
		want.takeEvents([]byte(body))
		sizes := make([]int, 1+rnd.IntN(5))
		for j := range sizes {
			sizes[j] = 1 + rnd.IntN(300)
		}
		c := &call{h: want.h, req: &openai.Request{}, stream: true}
		s := newOtherStream(io.NopCloser(&chunkedReader{b: []byte(body), sizes: sizes}), c)
		got, err := io.ReadAll(s)
		_ = s.Close()
		if err != nil || string(got) != body {
			t.Fatalf("case %d (chunks %v): read %q, %v; want the stream unchanged", i, sizes, got, err)
		}
		if c.contentEvents != want.contentEvents || c.complete != want.complete || c.usage != want.usage {
			t.Fatalf("case %d (chunks %v, %q): %d content events, complete %v, usage %+v; read whole: %d, %v, %+v", i, sizes, eol,
				c.contentEvents, c.complete, c.usage, want.contentEvents, want.complete, want.usage)
		}
	}
}
