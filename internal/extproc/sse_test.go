package extproc

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/openai"
)

// passIf is a takeFunc that passes whole the events pass says to, and omits nothing.
func passIf(pass func(openai.Event) bool) takeFunc {
	return func(ev openai.Event) (bool, int, int) { return pass(ev), 0, 0 }
}

// passAll passes every event whole.
func passAll(openai.Event) (bool, int, int) { return true, 0, 0 }

// TestEventSplitterOmits: a part of an event's data that take omits (the usage member kvroute
// asked for, in a chunk that carries more) is left out of what is passed on, however the
// stream is cut and whatever its line ends; an event whose data is more than one line, or that
// take omits nothing of, passes as it came.
func TestEventSplitterOmits(t *testing.T) {
	zeros := `"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
	chunk := "data: {\"choices\":[{\"text\":\" figur\"}]," + zeros + "}\n\n"
	first := "id: 7\r\ndata: {" + zeros + ",\"choices\":[]}\r\n\r\n"
	multi := "data: {\"choices\":[],\ndata: " + zeros + "}\n\n" // two data lines: not cut
	stream := chunk + first + event1 + multi + chunk
	clean := "data: {\"choices\":[{\"text\":\" figur\"}]}\n\n"
	want := clean + "id: 7\r\ndata: {\"choices\":[]}\r\n\r\n" + event1 + multi + clean
	take := func(ev openai.Event) (bool, int, int) {
		from, to, ok := openai.UsageMember(ev.Data)
		if !ok {
			return true, 0, 0
		}
		return true, from, to
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		var s eventSplitter
		var out []byte
		for rest := stream; len(rest) > 0; {
			n := 1 + rng.IntN(min(len(rest), 30))
			out = s.feed(out, []byte(rest[:n]), n == len(rest), take)
			rest = rest[n:]
		}
		if string(out) != want {
			t.Fatalf("trial %d: got %q, want %q", trial, out, want)
		}
	}
}

// TestEventSplitterAnyCut: however the stream is cut into chunks, the events passed on are the
// same bytes, whole events only, and the ones dropped are dropped whole, whatever their line
// ends.
func TestEventSplitterAnyCut(t *testing.T) {
	crlf := "data: {\"a\":1}\r\n\r\n"
	named := "event: response.completed\ndata: {\"b\":2}\n\n"
	comment := ": ping\n\n"
	drop := "data: {\"drop\":true}\n\n"
	cr := "event: cr\rdata: {\"c\":3}\rid: 4\r\r" // lone "\r" line ends
	dropCR := "data: {\"drop\":2}\r\r"
	stream := event1 + crlf + cr + comment + drop + dropCR + named + cr + doneEvent
	want := event1 + crlf + cr + comment + named + cr + doneEvent
	take := passIf(func(ev openai.Event) bool { return !strings.Contains(string(ev.Data), "drop") })
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
	take := passIf(func(ev openai.Event) bool { seen = append(seen, string(ev.Data)); return true })
	out := s.feed(nil, []byte("data: one\n\ndata: tw"), false, take)
	if string(out) != "data: one\n\n" || len(seen) != 1 {
		t.Fatalf("before the end: %q, events %q", out, seen)
	}
	out = s.feed(out, []byte("o"), true, take)
	if string(out) != "data: one\n\ndata: two" || len(seen) != 2 || seen[1] != "two" {
		t.Errorf("at the end: %q, events %q", out, seen)
	}
}

// TestEventSplitterLoneCR: an event whose lines end in a lone "\r" is passed on as soon as its
// blank line's "\r" has come, though that "\r" ends the chunk: not held for a "\n" that may not
// come (an engine that ends its lines so may send nothing more for a long time). After "\r\n"
// lines, a blank line's "\r" that ends the chunk waits for the next, where its "\n" is.
func TestEventSplitterLoneCR(t *testing.T) {
	var s eventSplitter
	var seen []string
	take := passIf(func(ev openai.Event) bool { seen = append(seen, ev.Name+"|"+string(ev.Data)); return true })
	steps := []struct{ chunk, out string }{
		{"event: e\rdata: a\r", ""}, // the "\r" may be half of a "\r\n": the line is not over
		{"\r", "event: e\rdata: a\r\r"},
		{"data: b\r\rdata: c\r\rdata: d", "data: b\r\rdata: c\r\r"},
		{"\r\r", "data: d\r\r"},
		{"data: e\r\n\r", ""},
		{"\ndata: f\r\n", "data: e\r\n\r\n"},
		{"\r\n", "data: f\r\n\r\n"},
	}
	for _, st := range steps {
		if out := s.feed(nil, []byte(st.chunk), false, take); string(out) != st.out {
			t.Fatalf("after %q: passed on %q, want %q", st.chunk, out, st.out)
		}
	}
	want := []string{"e|a", "|b", "|c", "|d", "|e", "|f"}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("events read (-want +got):\n%s", diff)
	}
	// At the end of the stream a "\r" is a line end: the event is read, its data whole.
	seen = nil
	if out := s.feed(nil, []byte("data: [DONE]\r"), true, take); string(out) != "data: [DONE]\r" {
		t.Errorf("at the end: passed on %q", out)
	}
	if diff := cmp.Diff([]string{"|[DONE]"}, seen); diff != "" {
		t.Errorf("at the end, events read (-want +got):\n%s", diff)
	}
}

// TestEventSplitterNoBlankLines: a stream whose lines never make a blank line (single line
// ends) is not held whole, nor scanned again for every chunk: it is passed on in pieces of at
// most maxEvent, every byte, in time linear in its length.
func TestEventSplitterNoBlankLines(t *testing.T) {
	for _, line := range []string{"data: x\n", "data: x\r\n", "data: x\r"} {
		t.Run(fmt.Sprintf("%q", line), func(t *testing.T) { noBlankLines(t, line) })
	}
}

func noBlankLines(t *testing.T, line string) {
	chunk := []byte(strings.Repeat(line, 2048)) // 16 to 18 KiB
	const chunks = 8 << 20 / (16 << 10)         // 8 MiB or more in all
	feedAll := func(n int) time.Duration {
		var s eventSplitter
		total, held := 0, 0
		start := time.Now()
		for i := range n {
			out := s.feed(nil, chunk, i == n-1, passAll)
			total += len(out)
			held = max(held, len(s.pending))
		}
		took := time.Since(start)
		if total != n*len(chunk) || held > maxEvent+len(chunk) {
			t.Errorf("passed on %d of %d bytes, held up to %d (maxEvent %d)", total, n*len(chunk), held, maxEvent)
		}
		return took
	}
	// Linear time, judged as a ratio measured in the same run (a time bound alone failed on a
	// busy machine under -race): 16 times the bytes take about 16 times as long; rescanning
	// what is held for every chunk made it 106 to 174 times. The fastest of five runs of each;
	// the bound, 64, sits between the two (a loaded machine, load average 14, measured 45 once
	// for linear code).
	small, large := time.Hour, time.Hour
	for range 5 {
		small = min(small, feedAll(chunks/16))
		large = min(large, feedAll(chunks))
	}
	ratio := float64(large) / float64(small)
	t.Logf("%v for a sixteenth, %v for all: %.1f x", small, large, ratio)
	if ratio > 64 {
		t.Errorf("%d MiB without a blank line took %v, %.0f x the time of a sixteenth of it (%v): want about 16 (linear)", chunks*len(chunk)>>20, large, ratio, small)
	}
}

// BenchmarkEventSplitter feeds a 256-token chat stream to the splitter in the chunks a gateway
// passes on: one event a chunk, and 4 KiB chunks that cut events anywhere.
func BenchmarkEventSplitter(b *testing.B) {
	var evs []string
	for range 256 {
		evs = append(evs, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n")
	}
	evs = append(evs, doneEvent)
	whole := strings.Join(evs, "")
	var cut []string
	for rest := whole; len(rest) > 0; {
		n := min(len(rest), 4<<10)
		cut = append(cut, rest[:n])
		rest = rest[n:]
	}
	take := passAll
	for _, bc := range []struct {
		name   string
		chunks []string
	}{{"event", evs}, {"4KiB", cut}} {
		chunks := make([][]byte, len(bc.chunks))
		for i, c := range bc.chunks {
			chunks[i] = []byte(c)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(whole)))
			b.ReportAllocs()
			var s eventSplitter
			out := make([]byte, 0, 64<<10)
			for b.Loop() {
				n := 0
				for i, c := range chunks {
					out = s.feed(out[:0], c, i == len(chunks)-1, take)
					n += len(out)
				}
				if n != len(whole) {
					b.Fatalf("passed on %d of %d bytes", n, len(whole))
				}
			}
		})
	}
}
