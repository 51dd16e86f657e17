package extproc

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// TestEventSplitterAnyCut: however the stream is cut into chunks, the events passed on are the
// same bytes, whole events only, and the one dropped is dropped whole.
func TestEventSplitterAnyCut(t *testing.T) {
	crlf := "data: {\"a\":1}\r\n\r\n"
	named := "event: response.completed\ndata: {\"b\":2}\n\n"
	comment := ": ping\n\n"
	drop := "data: {\"drop\":true}\n\n"
	stream := event1 + crlf + comment + drop + named + doneEvent
	want := event1 + crlf + comment + named + doneEvent
	take := func(ev openai.Event) bool { return !strings.Contains(string(ev.Data), "drop") }
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		var s eventSplitter
		var out []byte
		var cuts []int
		for rest := stream; len(rest) > 0; {
			n := 1 + rng.IntN(min(len(rest), 40))
			if trial == 0 {
				n = 1 // byte by byte
			}
			cuts = append(cuts, n)
			out = s.feed(out, []byte(rest[:n]), n == len(rest), take)
			rest = rest[n:]
		}
		if string(out) != want {
			t.Fatalf("cut into %v: got %q, want %q", cuts, out, want)
		}
	}
}

// TestEventSplitterEnd: at the end of the stream a partial event is read and passed as it is.
func TestEventSplitterEnd(t *testing.T) {
	var s eventSplitter
	var seen []string
	take := func(ev openai.Event) bool { seen = append(seen, string(ev.Data)); return true }
	out := s.feed(nil, []byte("data: one\n\ndata: tw"), false, take)
	if string(out) != "data: one\n\n" || len(seen) != 1 {
		t.Fatalf("before the end: %q, events %q", out, seen)
	}
	out = s.feed(out, []byte("o"), true, take)
	if string(out) != "data: one\n\ndata: two" || len(seen) != 2 || seen[1] != "two" {
		t.Errorf("at the end: %q, events %q", out, seen)
	}
}

// TestEventSplitterNoBlankLines: a stream whose lines never make a blank line (single line
// ends) is not held whole, nor scanned again for every chunk: it is passed on in pieces of at
// most maxEvent, every byte, in time linear in its length.
func TestEventSplitterNoBlankLines(t *testing.T) {
	line := "data: x\n"
	chunk := []byte(strings.Repeat(line, 2048)) // 16 KiB
	const chunks = 8 << 20 / (16 << 10)         // 8 MiB in all
	var s eventSplitter
	total, held := 0, 0
	start := time.Now()
	for i := range chunks {
		out := s.feed(nil, chunk, i == chunks-1, func(openai.Event) bool { return true })
		total += len(out)
		held = max(held, len(s.pending))
	}
	if total != chunks*len(chunk) || held > maxEvent+len(chunk) {
		t.Errorf("passed on %d of %d bytes, held up to %d (maxEvent %d)", total, chunks*len(chunk), held, maxEvent)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("8 MiB without a blank line took %v (it took 2.6 s when every chunk rescanned what was held)", took)
	}
}
