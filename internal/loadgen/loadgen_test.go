package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeServer streams n content chunks and a usage chunk, in the vLLM shape.
func streamOK(w http.ResponseWriter, n, prompt, cached int) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Backend", "sim-1")
	fl := w.(http.Flusher)
	for i := range n {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", prompt, n, cached)
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

func items(n int, gap time.Duration) []Item {
	out := make([]Item, n)
	for i := range out {
		out[i] = Item{At: time.Duration(i) * gap, PromptTokens: 10, MaxTokens: 3, Prompt: func() string { return "hello" }}
	}
	return out
}

func TestRun_MeasuresStream(t *testing.T) {
	var got struct {
		body    requestBody
		auth    string
		session string
		path    string
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.path, got.auth, got.session = r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Session-ID")
		if err := json.NewDecoder(r.Body).Decode(&got.body); err != nil {
			t.Errorf("decode body: %v", err)
		}
		streamOK(w, 4, 1234, 1024)
	}))
	defer srv.Close()

	it := items(1, 0)
	it[0].Session = "conv-7"
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", APIKey: "sk-test", EndpointHeader: "X-Backend", IgnoreEOS: true}, it)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 1 {
		t.Fatalf("got %d records, want 1", len(res.Records))
	}
	rec := res.Records[0]
	if rec.TTFT <= 0 || rec.E2E < rec.TTFT {
		t.Errorf("TTFT %v, E2E %v: want 0 < TTFT <= E2E", rec.TTFT, rec.E2E)
	}
	want := Record{Session: "conv-7", PromptTokens: 1234, CachedTokens: 1024, OutputTokens: 4, Status: 200, Endpoint: "sim-1"}
	gotRec := rec
	gotRec.Scheduled, gotRec.Sent, gotRec.TTFT, gotRec.E2E, gotRec.ITL = 0, 0, 0, 0, nil
	if diff := cmp.Diff(want, gotRec); diff != "" {
		t.Errorf("record (-want +got):\n%s", diff)
	}
	// One gap per chunk after the first: 3 when each event came on its own, fewer when the
	// client read two flushes at once (TestRun_ITLPerChunkReceived).
	if len(rec.ITL) > 3 {
		t.Errorf("got %d inter-token gaps, want at most 3", len(rec.ITL))
	}
	wantBody := requestBody{Model: "m", Messages: []chatMessage{{Role: "user", Content: "hello"}}, MaxTokens: 3, Stream: true,
		StreamOptions: map[string]any{"include_usage": true}, IgnoreEOS: true}
	if diff := cmp.Diff(wantBody, got.body); diff != "" {
		t.Errorf("request body (-want +got):\n%s", diff)
	}
	if got.path != "/v1/chat/completions" || got.auth != "Bearer sk-test" || got.session != "conv-7" {
		t.Errorf("path %q auth %q session %q", got.path, got.auth, got.session)
	}
}

func TestRun_CompletionsAPIAndNoUsage(t *testing.T) {
	var path, prompt string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b requestBody
		_ = json.NewDecoder(r.Body).Decode(&b)
		path, prompt = r.URL.Path, b.Prompt
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: srv.URL + "/v1", Model: "m", API: "completions"}, items(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Records[0]
	if path != "/v1/completions" || prompt != "hello" {
		t.Errorf("path %q prompt %q", path, prompt)
	}
	if rec.CachedTokens != -1 || rec.OutputTokens != 2 || rec.PromptTokens != 10 || !rec.OK() {
		t.Errorf("cached %d output %d prompt %d class %q: want -1, 2, 10 (estimate), ok", rec.CachedTokens, rec.OutputTokens, rec.PromptTokens, rec.Class)
	}
}

func TestRun_NonStreamingAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi there"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m"}, items(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	rec := res.Records[0]
	if !rec.OK() || rec.TTFT <= 0 || rec.TTFT > rec.E2E || rec.PromptTokens != 7 || rec.OutputTokens != 2 || rec.CachedTokens != 4 {
		t.Errorf("record %+v: want OK, 0 < TTFT <= E2E, prompt 7, output 2, cached 4", rec)
	}
}

// An item that asks for its answer whole is sent with "stream": false, no stream_options, and
// Accept: application/json.
func TestRun_WholeItem(t *testing.T) {
	var stream []bool
	var accept []string
	var opts []map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b requestBody
		_ = json.NewDecoder(r.Body).Decode(&b)
		stream, accept, opts = append(stream, b.Stream), append(accept, r.Header.Get("Accept")), append(opts, b.StreamOptions)
		if !b.Stream {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":1}}`)
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	its := items(2, 0)
	its[1].Whole = true
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Concurrency: 1}, its)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range res.Records {
		if !rec.OK() {
			t.Errorf("record %d: %s %s", rec.Index, rec.Class, rec.Err)
		}
	}
	if diff := cmp.Diff([]bool{true, false}, stream); diff != "" {
		t.Errorf("stream sent (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"text/event-stream", "application/json"}, accept); diff != "" {
		t.Errorf("Accept sent (-want +got):\n%s", diff)
	}
	if opts[1] != nil {
		t.Errorf("whole request sent stream_options %v, want none", opts[1])
	}
}

func TestRun_ErrorClasses(t *testing.T) {
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	tests := []struct {
		name    string
		handler http.HandlerFunc
		target  string
		want    string
		reason  string // Record.Err; "" when not checked
	}{
		{name: "overloaded", want: "http_503", reason: "busy", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
		}},
		{name: "rate limited", want: "http_429", reason: "429 Too Many Requests", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusTooManyRequests)
		}},
		{name: "unknown model", want: "http_404", reason: "the model \"m\" does not exist (GET /v1/models lists them)", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"the model \"m\" does not exist (GET /v1/models lists them)","type":"invalid_request_error","code":"model_not_found"}}`, http.StatusNotFound)
		}},
		{name: "vllm's older error", want: "http_400", reason: "The model `m` does not exist.", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"object":"error","message":"The model `+"`m`"+` does not exist.","type":"NotFoundError","code":404}`, http.StatusBadRequest)
		}},
		{name: "error string", want: "http_404", reason: "model 'm' not found", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":"model 'm' not found"}`, http.StatusNotFound)
		}},
		{name: "text body on one line", want: "http_502", reason: "<html> <h1>Bad Gateway</h1> </html>", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "<html>\n  <h1>Bad Gateway</h1>\n</html>", http.StatusBadGateway)
		}},
		{name: "long message cut", want: "http_400", reason: strings.Repeat("é", 197) + "...", handler: func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, `{"error":{"message":"`+strings.Repeat("é", 1000)+`"}}`, http.StatusBadRequest)
		}},
		{name: "refused", want: "connection", target: closedURL},
		{name: "no done", want: "mid_stream", reason: "stream ended without [DONE]", handler: func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		}},
		{name: "error in stream", want: "mid_stream", reason: "engine died", handler: func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: {\"error\":{\"message\":\"engine died\"}}\n\n")
		}},
		{name: "garbage", want: "mid_stream", handler: func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "data: <html>\n\n")
		}},
		{name: "slow", want: "timeout", handler: func(w http.ResponseWriter, r *http.Request) {
			// Reading the body to the end lets the server notice the client hanging up.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := tt.target
			if tt.handler != nil {
				srv := httptest.NewServer(tt.handler)
				defer srv.Close()
				target = srv.URL
			}
			res, err := Run(context.Background(), Config{Target: target, Model: "m", RequestTimeout: 200 * time.Millisecond}, items(1, 0))
			if err != nil {
				t.Fatal(err)
			}
			rec := res.Records[0]
			if got := rec.ErrorLabel(); got != tt.want {
				t.Errorf("class %q (%s), want %q", got, rec.Err, tt.want)
			}
			if tt.reason != "" && rec.Err != tt.reason {
				t.Errorf("Err %q, want %q", rec.Err, tt.reason)
			}
			if n := utf8.RuneCountInString(rec.Err); rec.Err == "" || n > maxReason || strings.Contains(rec.Err, "\n") {
				t.Errorf("Err %q: want a reason on one line of 1 to %d characters, got %d", rec.Err, maxReason, n)
			}
			if rec.OK() {
				t.Error("OK() on a failed request")
			}
		})
	}
}

// FirstErrors keeps, per class, the reason of the first failed request in workload order.
func TestResult_FirstErrors(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch i := n.Add(1); {
		case i == 1:
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
		case i%2 == 0:
			http.Error(w, fmt.Sprintf(`{"error":{"message":"no model %d"}}`, i), http.StatusNotFound)
		default:
			http.Error(w, fmt.Sprintf(`{"error":{"message":"busy %d"}}`, i), http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Concurrency: 1}, items(5, 0))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"http_404": "no model 2", "http_503": "busy 3"}
	if diff := cmp.Diff(want, res.FirstErrors()); diff != "" {
		t.Errorf("FirstErrors (-want +got):\n%s", diff)
	}
	ok := Result{Records: res.Records[:1]}
	if got := ok.FirstErrors(); got != nil {
		t.Errorf("FirstErrors of a run without failures = %v, want nil", got)
	}
}

func TestRun_OpenLoopKeepsSchedule(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { streamOK(w, 1, 1, 0) }))
	defer srv.Close()
	const n, gap = 40, 10 * time.Millisecond
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m"}, items(n, gap))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != n {
		t.Fatalf("got %d records, want %d", len(res.Records), n)
	}
	late := make([]time.Duration, n)
	for i, r := range res.Records {
		if r.Index != i || r.Scheduled != time.Duration(i)*gap {
			t.Fatalf("record %d: index %d scheduled %v", i, r.Index, r.Scheduled)
		}
		if r.Sent < r.Scheduled {
			t.Errorf("request %d sent early: %v before %v", i, r.Sent, r.Scheduled)
		}
		late[i] = r.Sent - r.Scheduled
	}
	slices.Sort(late)
	// The median lateness is the scheduler's own: generous for a loaded 2-core race build
	// (28.8 ms once at a load average over 10). A sender that drifts, or waits for answers,
	// falls behind by more with every request: hundreds of ms by the median here.
	if med := late[n/2]; med > 50*time.Millisecond {
		t.Errorf("median lateness %v, want < 50ms", med)
	}
	if rate := res.SendRate(); rate < 80 || rate > 101 {
		t.Errorf("send rate %.1f/s, want about 100", rate)
	}
}

// concurrencyServer blocks each request until release is closed, tracking the peak in flight.
type concurrencyServer struct {
	cur, peak atomic.Int64
	arrived   chan struct{}
	release   chan struct{}
}

func (c *concurrencyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := c.cur.Add(1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			break
		}
	}
	c.arrived <- struct{}{}
	select {
	case <-c.release:
	case <-r.Context().Done():
	}
	c.cur.Add(-1)
	streamOK(w, 1, 1, 0)
}

func TestRun_ConcurrencyCaps(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"closed loop", Config{Concurrency: 2}},
		{"open loop cap", Config{MaxInFlight: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := &concurrencyServer{arrived: make(chan struct{}, 100), release: make(chan struct{})}
			srv := httptest.NewServer(cs)
			defer srv.Close()
			cfg := tt.cfg
			cfg.Target, cfg.Model = srv.URL, "m"
			limit := max(cfg.Concurrency, cfg.MaxInFlight)
			done := make(chan Result)
			go func() {
				res, err := Run(context.Background(), cfg, items(8, 0))
				if err != nil {
					t.Error(err)
				}
				done <- res
			}()
			// Wait until the cap is reached, then check that nobody else got in.
			for range limit {
				<-cs.arrived
			}
			if got := cs.cur.Load(); got != int64(limit) {
				t.Errorf("in flight %d, want %d", got, limit)
			}
			close(cs.release)
			res := <-done
			if len(res.Records) != 8 {
				t.Errorf("got %d records, want 8", len(res.Records))
			}
			if p := cs.peak.Load(); p > int64(limit) {
				t.Errorf("peak in flight %d, want <= %d", p, limit)
			}
		})
	}
}

func TestRun_DurationBound(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { streamOK(w, 1, 1, 0) }))
	defer srv.Close()
	it := items(10, 10*time.Millisecond) // due at 0, 10, ..., 90 ms
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Duration: 45 * time.Millisecond}, it)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 5 {
		t.Errorf("got %d records, want the 5 due before 45ms", len(res.Records))
	}
}

func TestRun_Cancel(t *testing.T) {
	cs := &concurrencyServer{arrived: make(chan struct{}, 100), release: make(chan struct{})}
	srv := httptest.NewServer(cs)
	defer srv.Close()
	defer close(cs.release)
	ctx, cancel := context.WithCancel(context.Background())
	it := items(3, 0)
	it[2].At = time.Hour
	done := make(chan struct{})
	var res Result
	var err error
	go func() {
		defer close(done)
		res, err = Run(ctx, Config{Target: srv.URL, Model: "m"}, it)
	}()
	<-cs.arrived
	<-cs.arrived
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err %v, want context.Canceled", err)
	}
	if len(res.Records) != 2 {
		t.Fatalf("got %d records, want the 2 sent", len(res.Records))
	}
	for _, r := range res.Records {
		if r.Class != ClassCanceled {
			t.Errorf("record %d class %q, want canceled", r.Index, r.Class)
		}
	}
}

func TestRun_BadConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Target: "ftp:/x", API: "embeddings", Concurrency: -1}, nil)
	if err == nil {
		t.Fatal("no error for a bad config")
	}
	for _, want := range []string{"target:", "model:", "api:", "concurrency:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestProgress_Modes(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { return clock }
	var lines, none, bar strings.Builder
	pl := NewProgress(&lines, ProgressLines, "bench", 4, time.Second, now)
	pn := NewProgress(&none, ProgressNone, "bench", 4, time.Second, now)
	pb := NewProgress(&bar, ProgressBar, "bench", 4, time.Second, now)
	recs := []Record{{}, {Class: ClassTimeout}, {}, {}}
	for i, r := range recs {
		clock = clock.Add(600 * time.Millisecond) // a line every other record
		_ = i
		for _, p := range []*Progress{pl, pn, pb} {
			p.Record(r)
		}
	}
	for _, p := range []*Progress{pl, pn, pb} {
		p.Finish()
	}
	// No pacing and fewer than minRateSamples finished: the ETA is not known yet.
	want := "bench: 2/4 requests, 1 errors, 1.7 req/s, elapsed 1s, eta ?\n" +
		"bench: 4/4 requests, 1 errors, 1.7 req/s, elapsed 2s, eta 0s\n" +
		"bench: 4/4 requests, 1 errors, 1.7 req/s, elapsed 2s, eta 0s\n"
	if diff := cmp.Diff(want, lines.String()); diff != "" {
		t.Errorf("line progress (-want +got):\n%s", diff)
	}
	if none.Len() != 0 {
		t.Errorf("quiet progress printed %q", none.String())
	}
	if s := bar.String(); !strings.Contains(s, "4/4") || !strings.Contains(s, "1 errors") {
		t.Errorf("bar output %q lacks count or errors", s)
	}
}

// At Ctrl-C the requests in flight come back cancelled: they are counted as such, not as
// errors (the demo's last line said "12/12 requests, 5 errors" for a run with none), and the
// run has no time left to estimate.
func TestProgress_Canceled(t *testing.T) {
	clock := time.Unix(0, 0)
	now := func() time.Time { return clock }
	var lines, bar strings.Builder
	pl := NewProgress(&lines, ProgressLines, "demo", 6, time.Hour, now)
	pb := NewProgress(&bar, ProgressBar, "demo", 6, time.Hour, now)
	for _, r := range []Record{{}, {Class: ClassHTTP, Status: 500}, {}, {Class: ClassCanceled}, {Class: ClassCanceled}} {
		clock = clock.Add(time.Second)
		pl.Record(r)
		pb.Record(r)
	}
	pl.Finish()
	pb.Finish()
	if diff := cmp.Diff("demo: 3/6 requests, 1 errors, 2 cancelled, 0.6 req/s, elapsed 5s, eta -\n", lines.String()); diff != "" {
		t.Errorf("line progress (-want +got):\n%s", diff)
	}
	if s := bar.String(); !strings.HasSuffix(s, "\ndemo: 3/6 requests, 1 errors, 2 cancelled, 0.6 req/s, elapsed 5s, eta -\n") {
		t.Errorf("bar output %q does not end with the line of the 3 of 6 done, 2 cancelled", s)
	}
}

func TestStreamReader(t *testing.T) {
	in := ": comment\n\nevent: x\ndata: {\"choices\":[{\"delta\":{\"content\":\"He\"}}]}\n\n" +
		"data:{\"choices\":[{\"delta\":{\"content\":\"llo\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\r\n\r\n" +
		"data: [DONE]\n"
	sr := NewStreamReader(strings.NewReader(in))
	var got []string
	var usage *Usage
	for range 10 {
		c, err := sr.Next()
		if errors.Is(err, ErrDone) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, c.Content)
		if c.Usage != nil {
			usage = c.Usage
		}
	}
	if diff := cmp.Diff([]string{"He", "llo"}, got); diff != "" {
		t.Errorf("contents (-want +got):\n%s", diff)
	}
	if usage == nil || usage.PromptTokens != 5 || usage.CachedTokens() != -1 {
		t.Errorf("usage %+v: want prompt 5, cached unknown", usage)
	}
	if _, err := sr.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after [DONE]: %v, want EOF", err)
	}
}

func FuzzStreamReader(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n")
	f.Add("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n")
	f.Add("data: {\"error\":{}}\n")
	f.Add("data: nope\n")
	f.Fuzz(func(t *testing.T, s string) {
		sr := NewStreamReader(strings.NewReader(s))
		for range len(s) + 2 {
			if _, err := sr.Next(); err != nil {
				return
			}
		}
		t.Fatalf("reader returned more chunks than lines in %q", s)
	})
}

func BenchmarkStreamReader(b *testing.B) {
	var sb strings.Builder
	for range 256 {
		sb.WriteString("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n")
	}
	sb.WriteString("data: [DONE]\n\n")
	in := sb.String()
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		sr := NewStreamReader(strings.NewReader(in))
		for {
			if _, err := sr.Next(); err != nil {
				break
			}
		}
	}
}

// BenchmarkRun_Overhead measures the generator's own floor: TTFT and send lag against a
// loopback server that answers at once, 100 requests at 1 ms spacing per iteration.
func BenchmarkRun_Overhead(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		streamOK(w, 2, 10, 0)
	}))
	defer srv.Close()
	it := items(100, time.Millisecond)
	tr := NewTransport(64)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var ttft, lag []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", Client: client}, it)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res.Records {
			ttft = append(ttft, r.TTFT)
			lag = append(lag, r.Sent-r.Scheduled)
		}
	}
	slices.Sort(ttft)
	slices.Sort(lag)
	b.ReportMetric(float64(ttft[len(ttft)/2])/float64(time.Microsecond), "ttft-p50-µs")
	b.ReportMetric(float64(lag[len(lag)/2])/float64(time.Microsecond), "lag-p50-µs")
	b.ReportMetric(float64(lag[len(lag)*99/100])/float64(time.Microsecond), "lag-p99-µs")
}

// TestRun_ReusesConnections: a stream's connection goes back to the pool after [DONE] even
// when the server's chunked end comes a little later (as a router's does, after its own
// bookkeeping): a client that closed at [DONE] opened a connection per request.
func TestRun_ReusesConnections(t *testing.T) {
	var fresh atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		streamOK(w, 1, 1, 0)
		time.Sleep(2 * time.Millisecond) // the end of the body after [DONE]
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			fresh.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	const n = 20
	res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m"}, items(n, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Records {
		if r.Class != ClassOK {
			t.Fatalf("request %d: %s %s", r.Index, r.Class, r.Err)
		}
	}
	if c := fresh.Load(); c > 3 {
		t.Errorf("%d connections for %d requests one after the other: want them reused", c, n)
	}
}

// TestRun_NoUsageOption: with NoUsage the streamed request names no stream_options at all (a
// router then has to ask for usage itself); without it, it asks for usage.
func TestRun_NoUsageOption(t *testing.T) {
	for _, noUsage := range []bool{false, true} {
		var raw map[string]json.RawMessage
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = json.NewDecoder(r.Body).Decode(&raw)
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
		}))
		res, err := Run(context.Background(), Config{Target: srv.URL, Model: "m", NoUsage: noUsage}, items(1, 0))
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		so, named := raw["stream_options"]
		if named == noUsage || string(raw["stream"]) != "true" || !res.Records[0].OK() {
			t.Errorf("NoUsage %v: stream %s, stream_options %s (named %v), record %+v", noUsage, raw["stream"], so, named, res.Records[0])
		}
	}
}
