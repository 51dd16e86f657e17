package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// sseEvent is one chat completion chunk carrying content, as an SSE event.
func sseEvent(content string) string {
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", content)
}

const (
	roleEvent  = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
	usageEvent = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":12}}\n\n"
	doneEvent  = "data: [DONE]\n\n"
)

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// burstBody is a streamed answer that arrives in reads: each read returns the next part, gap
// later on the clock than the one before, the first gap after the request. A read asked for
// fewer bytes than a part holds takes the rest of it at the next read, at the same time.
type burstBody struct {
	parts []string
	clock *fakeClock
	gap   time.Duration
	rest  string
}

func (b *burstBody) Read(p []byte) (int, error) {
	if b.rest == "" {
		if len(b.parts) == 0 {
			return 0, io.EOF
		}
		b.clock.advance(b.gap)
		b.rest, b.parts = b.parts[0], b.parts[1:]
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func (b *burstBody) Close() error { return nil }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An engine that writes several tokens' events at once (kvroute sim at a fast time scale, an
// engine that flushes per step or per stream interval) delivers them in one read: they count as
// one chunk, one gap apart from the next, not as gaps of 0 (ITL p50 was 0.0 ms against kvroute
// sim --time-scale 0.1).
func TestRun_ITLPerChunkReceived(t *testing.T) {
	const gap = 30 * time.Millisecond
	three := func(i int) string {
		return sseEvent(fmt.Sprintf("a%d", i)) + sseEvent(fmt.Sprintf("b%d", i)) + sseEvent(fmt.Sprintf("c%d", i))
	}
	full := sseEvent("x") + sseEvent("y")
	cases := []struct {
		name    string
		parts   []string
		ttft    time.Duration
		itl     []time.Duration
		outputs int
	}{{
		name:    "three events of a token each per write",
		parts:   []string{three(0), three(1), three(2), three(3) + usageEvent + doneEvent},
		ttft:    gap,
		itl:     []time.Duration{gap, gap, gap},
		outputs: 12,
	}, {
		name:    "one event of three tokens per write",
		parts:   []string{sseEvent("a b c"), sseEvent("d e f"), sseEvent("g h i"), sseEvent("j k l"), usageEvent, doneEvent},
		ttft:    gap,
		itl:     []time.Duration{gap, gap, gap},
		outputs: 12,
	}, {
		name:    "the role event alone first: the first content is the first token",
		parts:   []string{roleEvent, three(0), three(1) + usageEvent + doneEvent},
		ttft:    2 * gap,
		itl:     []time.Duration{gap},
		outputs: 12,
	}, {
		name: "an event completed by the next read arrived with that read",
		// The second event's first half comes with the first event: it is whole, and
		// received, only at the next read.
		parts:   []string{full[:len(full)-20], full[len(full)-20:], sseEvent("z") + doneEvent},
		ttft:    gap,
		itl:     []time.Duration{gap, gap},
		outputs: 3,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				_, _ = io.Copy(io.Discard, r.Body)
				return &http.Response{
					StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: &burstBody{parts: tc.parts, clock: clock, gap: gap}, Request: r,
				}, nil
			})}
			res, err := Run(context.Background(), Config{Target: "http://127.0.0.1:1", Model: "m", Client: client, Now: clock.now}, items(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			rec := res.Records[0]
			if !rec.OK() {
				t.Fatalf("request failed: %s %s", rec.Class, rec.Err)
			}
			if rec.TTFT != tc.ttft {
				t.Errorf("TTFT %v, want %v", rec.TTFT, tc.ttft)
			}
			if diff := cmp.Diff(tc.itl, rec.ITL); diff != "" {
				t.Errorf("inter-token gaps (-want +got):\n%s", diff)
			}
			if rec.OutputTokens != tc.outputs {
				t.Errorf("output tokens %d, want %d", rec.OutputTokens, tc.outputs)
			}
		})
	}
}

// The same over loopback, against a fake engine that writes three tokens' events at once every
// 30 ms: the median gap is about 30 ms (it was 0, two gaps of every three being between events
// of one write).
func TestRun_ITLLoopbackEngineWritingThreeTokensAtOnce(t *testing.T) {
	const (
		writes = 8
		every  = 30 * time.Millisecond
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		tick := time.NewTicker(every) // the engine's step: its pace, not a wait for the client
		defer tick.Stop()
		for i := range writes {
			if i > 0 {
				select {
				case <-tick.C:
				case <-r.Context().Done():
					return
				}
			}
			var b strings.Builder
			for k := range 3 {
				b.WriteString(sseEvent(fmt.Sprintf("t%d.%d", i, k)))
			}
			if i == writes-1 {
				b.WriteString(doneEvent)
			}
			_, _ = io.WriteString(w, b.String())
			fl.Flush()
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m"}, items(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Records[0]
	if !rec.OK() || rec.OutputTokens != 3*writes {
		t.Fatalf("class %q (%s), %d output tokens: want ok, %d", rec.Class, rec.Err, rec.OutputTokens, 3*writes)
	}
	// A client that fell behind reads two writes at once, and measures one gap for them.
	if n := len(rec.ITL); n < writes/2 || n > writes-1 {
		t.Fatalf("%d gaps, want at most one per write after the first (%d), and most of them: %v", n, writes-1, rec.ITL)
	}
	gaps := slices.Clone(rec.ITL)
	slices.Sort(gaps)
	if p50 := gaps[len(gaps)/2]; p50 < every/2 || p50 > 10*every {
		t.Errorf("ITL p50 %v, want about %v (gaps %v)", p50, every, rec.ITL)
	}
}
