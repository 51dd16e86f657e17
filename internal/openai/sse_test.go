package openai

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
)

func readAll(t *testing.T, r io.Reader, maxEvent int) ([]Event, error) {
	t.Helper()
	s := NewSSEReader(r, maxEvent)
	var out []Event
	for range 10000 {
		ev, err := s.Next()
		if err != nil {
			if err == io.EOF {
				return out, nil
			}
			return out, err
		}
		ev.Raw, ev.Data = bytes.Clone(ev.Raw), bytes.Clone(ev.Data) // valid until the next call only
		out = append(out, ev)
	}
	t.Fatal("too many events")
	return nil, nil
}

func TestSSEReader(t *testing.T) {
	in := "data: {\"a\":1}\n\n: ping\n\nevent: response.done\r\ndata: x\r\ndata: y\r\nid: 7\r\n\r\ndata: [DONE]\n\n"
	evs, err := readAll(t, iotest.OneByteReader(strings.NewReader(in)), 0)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct{ Name, Data, ID, Raw string }
	var got []ev
	var raw strings.Builder
	for _, e := range evs {
		got = append(got, ev{e.Name, string(e.Data), e.ID, string(e.Raw)})
		raw.Write(e.Raw)
	}
	want := []ev{
		{"", `{"a":1}`, "", "data: {\"a\":1}\n\n"},
		{"", "", "", ": ping\n\n"},
		{"response.done", "x\ny", "7", "event: response.done\r\ndata: x\r\ndata: y\r\nid: 7\r\n\r\n"},
		{"", "[DONE]", "", "data: [DONE]\n\n"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if raw.String() != in {
		t.Errorf("raw bytes do not reassemble the stream")
	}
	if !evs[3].IsDone() || !evs[3].Ends() {
		t.Error("[DONE] not recognised")
	}
	for _, ev := range []Event{{Name: "response.completed"}, {Name: "response.incomplete"}, {Name: "response.failed"}} {
		if !ev.Ends() {
			t.Errorf("%s does not end its stream", ev.Name)
		}
	}
	if evs[2].Ends() || evs[0].Ends() {
		t.Error("an event mid-stream taken for the end")
	}
}

// TestSSEReaderLineEnds: lines may end in "\n", "\r\n" or a lone "\r" (WHATWG HTML, "Parsing an
// event stream"), mixed in one stream; the events' bytes reassemble the stream.
func TestSSEReaderLineEnds(t *testing.T) {
	type ev struct {
		Name, Data, ID, Raw string
		Cut                 bool
	}
	for _, tc := range []struct {
		in      string
		want    []ev
		oneByte []ev // read a byte at a time, where it differs
	}{
		{"data: a\r\rdata: b\r\r", []ev{{Data: "a", Raw: "data: a\r\r"}, {Data: "b", Raw: "data: b\r\r"}}, nil},
		{"event: e\rdata: 1\rdata: 2\rid: 3\r\r", []ev{{Name: "e", Data: "1\n2", ID: "3", Raw: "event: e\rdata: 1\rdata: 2\rid: 3\r\r"}}, nil},
		{": ping\r\rdata: [DONE]\r\r", []ev{{Raw: ": ping\r\r"}, {Data: "[DONE]", Raw: "data: [DONE]\r\r"}}, nil},
		// Blank lines before an event stay in its Raw, whatever their line ends.
		{"\r\n\r\rdata: a\r\r", []ev{{Data: "a", Raw: "\r\n\r\rdata: a\r\r"}}, nil},
		// A "\r" right before a "\n" is one line end; one before a "\r" is a line end of its own.
		// Read a byte at a time, b's blank line ends at its "\r" (the line before ended in a lone
		// "\r"): the "\n" after it is a blank line before an event that never comes.
		{"data: a\r\n\rdata: b\r\r\n", []ev{{Data: "a", Raw: "data: a\r\n\r"}, {Data: "b", Raw: "data: b\r\r\n"}},
			[]ev{{Data: "a", Raw: "data: a\r\n\r"}, {Data: "b", Raw: "data: b\r\r"}}},
		{"data: a\n\r\ndata: b\r\n\n", []ev{{Data: "a", Raw: "data: a\n\r\n"}, {Data: "b", Raw: "data: b\r\n\n"}}, nil},
		// A "\r" in a value ends the line: "data: a\rb" is the data "a", then a field "b".
		{"data: a\rb\r\r", []ev{{Data: "a", Raw: "data: a\rb\r\r"}}, nil},
		// At the end of the stream a "\r" ends its line.
		{"data: a\r", []ev{{Data: "a", Raw: "data: a\r", Cut: true}}, nil},
		{"data: a\r\r", []ev{{Data: "a", Raw: "data: a\r\r"}}, nil},
		{"data: a\r\n\r", []ev{{Data: "a", Raw: "data: a\r\n\r"}}, nil},
	} {
		for _, oneByte := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tc.in)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			evs, err := readAll(t, r, 0)
			if err != nil {
				t.Fatalf("%q: %v", tc.in, err)
			}
			var got []ev
			for _, e := range evs {
				got = append(got, ev{e.Name, string(e.Data), e.ID, string(e.Raw), e.Cut})
			}
			want := tc.want
			if oneByte && tc.oneByte != nil {
				want = tc.oneByte
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%q, one byte a read %v (-want +got):\n%s", tc.in, oneByte, diff)
			}
		}
	}
}

// TestSSEReaderLoneCRDoesNotWait: an event whose lines end in a lone "\r" is returned as soon as
// its blank line's "\r" has come, though the "\r" is the last byte so far and the stream says
// nothing more: it is not held for a "\n" that may follow. After "\r\n" lines the byte after
// the blank line's "\r" is waited for, so that its "\n" stays in the event.
func TestSSEReaderLoneCRDoesNotWait(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	s := NewSSEReader(pr, 0)
	type result struct {
		raw string
		err error
	}
	got := make(chan result, 1)
	next := func() {
		ev, err := s.Next()
		got <- result{string(ev.Raw), err}
	}
	write := func(p string) {
		t.Helper()
		if _, err := pw.Write([]byte(p)); err != nil { // returns once the reader has taken it all
			t.Fatal(err)
		}
	}
	wait := func(want string) {
		t.Helper()
		select {
		case r := <-got:
			if r.err != nil || r.raw != want {
				t.Fatalf("Next: %q, %v; want %q", r.raw, r.err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Next did not return %q: it waits for a byte after the \\r", want)
		}
	}
	go next()
	write("data: a\rdata: b\r")
	write("\r")
	wait("data: a\rdata: b\r\r")

	go next()
	write("data: c\r\n\r")
	// Written from another goroutine: a reader that returned early reads it no more (the
	// deferred Close ends the write), and the event it returned lacks the "\n".
	go func() { _, _ = pw.Write([]byte("\n")) }()
	wait("data: c\r\n\r\n")
	pw.Close()
	if _, err := s.Next(); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
}

func TestSSEReaderTruncatedAndTooLong(t *testing.T) {
	evs, err := readAll(t, strings.NewReader("data: a\n\ndata: part"), 0)
	if err != nil || len(evs) != 2 || string(evs[1].Data) != "part" {
		t.Errorf("truncated stream: %d events, err %v", len(evs), err)
	}
	for _, end := range []string{"\n\n", "\r\r", ""} {
		_, err = readAll(t, strings.NewReader("data: "+strings.Repeat("x", 10000)+end), 4096)
		if !errors.Is(err, ErrSSELineTooLong) {
			t.Errorf("long line ending %q: err = %v, want ErrSSELineTooLong", end, err)
		}
	}
	// Lines that end in a lone "\r" but never make a blank line are an event that grows too long.
	_, err = readAll(t, strings.NewReader(strings.Repeat("data: x\r", 1000)), 4096)
	if !errors.Is(err, ErrSSELineTooLong) {
		t.Errorf("no blank line: err = %v, want ErrSSELineTooLong", err)
	}
}

func TestWriteEvent(t *testing.T) {
	var b bytes.Buffer
	if err := WriteEvent(&b, "e", []byte("1\n2")); err != nil {
		t.Fatal(err)
	}
	if err := WriteDone(&b); err != nil {
		t.Fatal(err)
	}
	want := "event: e\ndata: 1\ndata: 2\n\ndata: [DONE]\n\n"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestSSEReaderBuffersShared: Data is a window on the reader's buffers, capped so that a
// caller's append cannot write into Raw, and the same reader serves another stream after Reset.
func TestSSEReaderBuffersShared(t *testing.T) {
	s := NewSSEReader(strings.NewReader("data: abc\nid: 1\n\n"), 0)
	ev, err := s.Next()
	if err != nil {
		t.Fatal(err)
	}
	raw := string(ev.Raw)
	_ = append(ev.Data, "XYZ"...)
	if string(ev.Raw) != raw || string(ev.Data) != "abc" || ev.ID != "1" {
		t.Errorf("after an append to Data: raw %q (was %q), data %q", ev.Raw, raw, ev.Data)
	}
	s.Reset(strings.NewReader("event: e\ndata: x\ndata: yz\n\ndata: w\n\n"))
	got := []string{}
	for range 10 {
		ev, err := s.Next()
		if err != nil {
			break
		}
		got = append(got, ev.Name+"|"+string(ev.Data))
	}
	if diff := cmp.Diff([]string{"e|x\nyz", "|w"}, got); diff != "" {
		t.Errorf("after Reset (-want +got):\n%s", diff)
	}
	if n := testing.AllocsPerRun(10, func() {
		s.Reset(strings.NewReader("event: e\ndata: x\ndata: yz\nid: 2\n\n"))
		if _, err := s.Next(); err != nil {
			t.Fatal(err)
		}
	}); n > 2 { // the strings.Reader and its interface conversion; the event itself: none
		t.Errorf("%v allocations per event, want the event to allocate nothing", n)
	}
}

// BenchmarkSSEReader reads a 256-chunk chat stream (with the usage chunk and [DONE]), a
// Responses-style stream with event names, and a multi-line data event; after the first
// event the common path allocates nothing.
func BenchmarkSSEReader(b *testing.B) {
	var chat strings.Builder
	for range 256 {
		chat.WriteString("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n")
	}
	chat.WriteString("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":256}}\n\ndata: [DONE]\n\n")
	var resp strings.Builder
	for range 256 {
		resp.WriteString("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"tok \"}\n\n")
	}
	var multi strings.Builder
	for range 256 {
		multi.WriteString("data: {\"a\":\ndata: 1}\nid: 7\n\n")
	}
	for _, bc := range []struct{ name, in string }{{"chat", chat.String()}, {"responses", resp.String()}, {"multiline", multi.String()}} {
		b.Run(bc.name, func(b *testing.B) {
			r := strings.NewReader(bc.in)
			s := NewSSEReader(r, 1<<20)
			b.SetBytes(int64(len(bc.in)))
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(bc.in)
				s.Reset(r)
				n := 0
				for {
					ev, err := s.Next()
					if err != nil {
						break
					}
					n += len(ev.Data)
				}
				if n == 0 {
					b.Fatal("no data read")
				}
			}
		})
	}
}

// HasEvent says true exactly when a whole event is buffered, so that Next returns without
// reading the stream (a proxy that asked would otherwise hold the events it has to pass on).
func TestSSEReaderHasEvent(t *testing.T) {
	for _, tc := range []struct {
		in   string // what the stream holds, read into the buffer at once
		want []bool // HasEvent before each Next, until the buffer is empty
	}{
		{"data: a\n\ndata: b\n\n", []bool{true, true}},
		{"data: a\n\ndata: b\n", []bool{true, false}},
		{"data: a\r\n\r\ndata: b\r\n\r\n", []bool{true, true}},
		{"data: a\n\n\n\ndata: b", []bool{true, false}}, // blank lines alone are no event
		{"\n\ndata: a\n\n", []bool{true}},
		{": ping\n\ndata: [DONE]\n\n", []bool{true, true}},
		{"data: a", []bool{false}},
		{"data: a\r\rdata: b\r\r", []bool{true, true}}, // lone "\r" line ends
		{"data: a\r\rdata: b\r", []bool{true, false}},  // b's "\r" may be half of "\r\n"
		{"data: a\r\n\r", []bool{false}},               // after "\r\n" lines, so may the blank line's
		{"data: a\n\rdata: b\r\r", []bool{true, true}}, // mixed: a "\r" followed by a byte is whole
		{"\r\r\rdata: a\r\r\r\n", []bool{true, false}}, // blank lines before, then after the event
		{"data: a\r\n\r\ndata: b\r\n\r", []bool{true, false}},
	} {
		r := NewSSEReader(strings.NewReader(tc.in), 0)
		// Fill the buffer: the first read takes what the stream holds.
		if err := r.fill(); err != nil {
			t.Fatal(err)
		}
		var got []bool
		for range 10 {
			if r.rd == r.wr {
				break
			}
			got = append(got, r.HasEvent())
			if !got[len(got)-1] {
				break // Next would read on (and meet EOF): nothing more to check
			}
			if _, err := r.Next(); err != nil {
				t.Fatalf("%q: Next after HasEvent: %v", tc.in, err)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.in, diff)
		}
	}
}

// HasEvent never reads: on a stream that has nothing buffered it answers at once.
func TestSSEReaderHasEventDoesNotRead(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	r := NewSSEReader(pr, 0)
	if r.HasEvent() {
		t.Fatal("HasEvent on an empty stream")
	}
}

// twoReads hands out a stream in two reads, split at k, and counts the reads it answered.
type twoReads struct {
	parts [2]string
	reads int
}

func (r *twoReads) Read(p []byte) (int, error) {
	for r.reads < 2 {
		part := r.parts[r.reads]
		r.reads++
		if len(part) > 0 {
			n := copy(p, part)
			if n < len(part) { // p too small: keep the rest for the next read
				r.reads--
				r.parts[r.reads] = part[n:]
			}
			return n, nil
		}
	}
	return 0, io.EOF
}

// TestSSEReaderSplitAtEveryOffset: a stream that arrives in two reads, split at every byte
// offset (inside a field name, a value, a "\r\n", between two lone "\r", the blank line), gives the same events as
// the stream read at once, and whenever HasEvent reports an event buffered, Next returns it
// without reading.
func TestSSEReaderSplitAtEveryOffset(t *testing.T) {
	in := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
		": ping\r\n\r\n" +
		"event: response.output_text.delta\r\ndata: x\r\ndata: y\r\nid: 7\r\n\r\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n" +
		"event: cr\rdata: lone\rdata: ends\rid: 8\r\r" +
		"\r: ping\r\r" +
		"data: [DONE]\n\n"
	want, err := readAll(t, strings.NewReader(in), 0)
	if err != nil || len(want) != 7 {
		t.Fatalf("whole stream: %d events, err %v", len(want), err)
	}
	buffered := 0 // events HasEvent found buffered, over all splits
	for k := 0; k <= len(in); k++ {
		src := &twoReads{parts: [2]string{in[:k], in[k:]}}
		s := NewSSEReader(src, 0)
		var got []Event
		for range 100 {
			readsBefore := src.reads
			has := s.HasEvent()
			ev, err := s.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("split at %d: %v", k, err)
			}
			if has {
				buffered++
				if src.reads != readsBefore {
					t.Fatalf("split at %d: HasEvent said an event was buffered, but Next read", k)
				}
			}
			ev.Raw, ev.Data = bytes.Clone(ev.Raw), bytes.Clone(ev.Data)
			got = append(got, ev)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("split at %d (-whole +split):\n%s", k, diff)
		}
	}
	if buffered == 0 {
		t.Error("HasEvent never found an event buffered: the check above checked nothing")
	}
}
