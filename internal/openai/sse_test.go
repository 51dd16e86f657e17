package openai

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

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
		ev.Raw = bytes.Clone(ev.Raw)
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
	if !evs[3].IsDone() {
		t.Error("[DONE] not recognised")
	}
}

func TestSSEReaderTruncatedAndTooLong(t *testing.T) {
	evs, err := readAll(t, strings.NewReader("data: a\n\ndata: part"), 0)
	if err != nil || len(evs) != 2 || string(evs[1].Data) != "part" {
		t.Errorf("truncated stream: %d events, err %v", len(evs), err)
	}
	_, err = readAll(t, strings.NewReader("data: "+strings.Repeat("x", 10000)+"\n\n"), 4096)
	if !errors.Is(err, ErrSSELineTooLong) {
		t.Errorf("long line: err = %v, want ErrSSELineTooLong", err)
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
