package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testlog"
)

// ollamaLike streams as ollama does (checked against ollama 0.17 in QA): n chunks of " figur";
// on /v1/completions with stream_options.include_usage, every chunk carries a usage of zeros.
// end says how the stream ends: "repeat" ends the chunked body properly after the last chunk,
// with no finish_reason and no [DONE] (ollama's token-repeat limit: a model looping at
// temperature 0); "finish" sends the finish chunk, the usage-only chunk (when asked; its
// completion_tokens n+3, so that it differs from the count of chunks) and [DONE]; "hold"
// waits for the client to go after the last chunk. gone is closed when a held stream's request
// ends.
type ollamaLike struct {
	srv  *httptest.Server
	n    int
	end  string
	gone chan struct{}
}

func newOllamaLike(t *testing.T, n int, end string) *ollamaLike {
	o := &ollamaLike{n: n, end: end, gone: make(chan struct{})}
	o.srv = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *ollamaLike) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, ev := range ollamaEvents(r.URL.Path, o.n, req.StreamOptions.IncludeUsage) {
		_, _ = io.WriteString(w, ev)
		fl.Flush()
	}
	switch o.end {
	case "hold":
		<-r.Context().Done()
		close(o.gone)
	case "finish":
		if r.URL.Path == "/v1/completions" {
			fmt.Fprintf(w, `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}],"model":"m"%s}`+"\n\n", zeroUsage(req.StreamOptions.IncludeUsage))
			if req.StreamOptions.IncludeUsage {
				fmt.Fprintf(w, `data: {"id":"cmpl-1","object":"text_completion","choices":[],"model":"m","usage":{"prompt_tokens":20,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", o.n+3, o.n+23)
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

func zeroUsage(asked bool) string {
	if !asked {
		return ""
	}
	return `,"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}`
}

// ollamaEvents are the content events ollamaLike sends for a request to path.
func ollamaEvents(path string, n int, includeUsage bool) []string {
	var evs []string
	if path == "/v1/responses" {
		evs = append(evs, "event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"usage\":null},\"type\":\"response.created\"}\n\n")
	}
	for range n {
		switch path {
		case "/v1/chat/completions":
			evs = append(evs, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":" figur"},"finish_reason":null}]}`+"\n\n")
		case "/v1/completions":
			evs = append(evs, `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":" figur","index":0,"finish_reason":null}],"model":"m"`+zeroUsage(includeUsage)+"}\n\n")
		default:
			evs = append(evs, "event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\" figur\",\"type\":\"response.output_text.delta\"}\n\n")
		}
	}
	return evs
}

// streamBodies are a streamed request of each API, the client not asking for usage.
var streamBodies = map[string]string{
	"/v1/chat/completions": `{"model":"m","stream":true,"messages":[{"role":"user","content":"repeat after me"}]}`,
	"/v1/completions":      `{"model":"m","stream":true,"prompt":"repeat after me"}`,
	"/v1/responses":        `{"model":"m","stream":true,"input":"repeat after me"}`,
}

// TestStreamEndedWithoutTerminator: an engine that ends its stream on purpose, its body ended
// properly but no terminator sent (ollama at its token-repeat limit), has its stream passed on
// as it ended: no error event, no [DONE] added (a client of that engine reads the body's end as
// the stream's), 200 in metrics and in the access line (with stream_end no_terminator), the
// policy told of a success, no failure towards ejection (six in a row ejected the endpoint
// before), and the tenant charged one completion token per content event, as for a stream
// whose usage did not come.
func TestStreamEndedWithoutTerminator(t *testing.T) {
	const n, streams = 5, 6
	for path, body := range streamBodies {
		t.Run(path, func(t *testing.T) {
			eng := newOllamaLike(t, n, "repeat")
			f := newFixture(t, spec(eng.srv.URL, "m"))
			lc, err := route.New(route.Config{Picker: f.pk, Attempts: 1,
				Health: route.NewOutlier(route.OutlierConfig{Consecutive: 3, MaxEjectedPercent: 100}, nil)})
			if err != nil {
				t.Fatal(err)
			}
			f.h.Lifecycle = lc
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
			var logs testlog.Buffer
			f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			want := strings.Join(ollamaEvents(path, n, false), "") // the client asked no usage: none
			for i := range streams {
				resp, got := f.post(t, path, body, "Authorization", "Bearer sk-1")
				if resp.StatusCode != http.StatusOK || string(got) != want {
					t.Fatalf("stream %d: %d %q, want 200 and the engine's events as they came, nothing added", i, resp.StatusCode, got)
				}
			}
			ep := f.pool.ByName(eng.srv.URL)
			if lc.Health().Ejected(ep, time.Now()) {
				t.Error("the endpoint was ejected for streams its engine ended on purpose")
			}
			if got := testutil.ToFloat64(f.h.Metrics.Requests.WithLabelValues("m", eng.srv.URL, "200")); got != streams {
				t.Errorf("requests_total{status=200} = %v, want %d", got, streams)
			}
			for _, d := range f.pk.done {
				if !d.OK {
					t.Errorf("policy told %+v, want a success", d)
				}
			}
			var lines []string
			for _, l := range logs.JSONLines(t) {
				if l["msg"] == "request" {
					lines = append(lines, fmt.Sprintf("%v %v %v", l["status"], l["stream_end"], l["error_type"]))
				}
			}
			if len(lines) != streams || lines[0] != "200 no_terminator <nil>" || lines[streams-1] != lines[0] {
				t.Errorf("access lines %q, want %d of status 200, stream_end no_terminator, no error_type", lines, streams)
			}
			est := f.pk.reqs[0].PromptTokens
			if prompt, completion, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != streams*est || completion != streams*n {
				t.Errorf("charged prompt %d, completion %d; want %d and %d (the estimate, one per content event)", prompt, completion, streams*est, streams*n)
			}
		})
	}
}

// postStream sends body to path with t1's key and returns the response, its head read, and the
// function that hangs up.
func postStream(t *testing.T, f *fixture, path, body string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk-1")
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, cancel
}

// A completions stream whose engine puts a usage of zeros in every chunk once asked for usage
// (ollama): a tenant that leaves in the middle is charged one completion token per content
// event it was sent (the zeros are no usage: it was charged nothing), and the chunks it got
// carry no usage, as it did not ask for any.
func TestZeroUsageChunksClientLeft(t *testing.T) {
	const n = 20
	eng := newOllamaLike(t, n, "hold")
	f := newFixture(t, spec(eng.srv.URL, "m"))
	f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
	resp, cancel := postStream(t, f, "/v1/completions", streamBodies["/v1/completions"])
	rd := bufio.NewReader(resp.Body)
	for seen := 0; seen < n; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("after %d content events: %v", seen, err)
		}
		if strings.Contains(line, `"usage"`) {
			t.Fatalf("the client, who asked no usage, got %q", line)
		}
		if strings.Contains(line, `"text":" figur"`) {
			seen++
		}
	}
	cancel()
	resp.Body.Close()
	waitClosed(t, eng.gone, "the engine's request was not cancelled after the client left")
	f.wait(t)
	est := f.pk.reqs[0].PromptTokens
	if prompt, completion, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != est || completion != n {
		t.Errorf("charged prompt %d, completion %d; want %d, %d (the estimate, one per content event)", prompt, completion, est, n)
	}
}

// A whole completions stream from an engine that puts zeros in every chunk: the client that
// asked for usage gets the chunks as the engine sent them (zeros included) and the usage
// chunk; the one that did not gets neither, as without the router. Both are charged the usage
// chunk's count, which the metric counts too.
func TestZeroUsageChunksWhole(t *testing.T) {
	const n = 4
	for _, asked := range []bool{true, false} {
		t.Run(fmt.Sprintf("asked=%v", asked), func(t *testing.T) {
			eng := newOllamaLike(t, n, "finish")
			f := newFixture(t, spec(eng.srv.URL, "m"))
			f.h.Gate = chargeGate(t, f.h.Metrics.Tenant)
			body := streamBodies["/v1/completions"]
			if asked {
				body = `{"model":"m","stream":true,"prompt":"repeat after me","stream_options":{"include_usage":true}}`
			}
			_, got := f.post(t, "/v1/completions", body, "Authorization", "Bearer sk-1")
			want := strings.Join(ollamaEvents("/v1/completions", n, asked), "") +
				`data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"","index":0,"finish_reason":"length"}],"model":"m"` + zeroUsage(asked) + "}\n\n"
			if asked {
				want += fmt.Sprintf(`data: {"id":"cmpl-1","object":"text_completion","choices":[],"model":"m","usage":{"prompt_tokens":20,"completion_tokens":%d,"total_tokens":%d}}`+"\n\n", n+3, n+23)
			}
			want += "data: [DONE]\n\n"
			if diff := cmp.Diff(want, string(got)); diff != "" {
				t.Errorf("client's stream (-want +got):\n%s", diff)
			}
			if prompt, completion, _ := charged(t, f.h.Gate, f.h.Metrics.Tenant); prompt != 20 || completion != n+3 {
				t.Errorf("charged prompt %d, completion %d; want the usage chunk's 20, %d", prompt, completion, n+3)
			}
			if got := testutil.ToFloat64(f.h.Metrics.CompletionTokens.WithLabelValues("m")); got != n+3 {
				t.Errorf("completion_tokens_total = %v, want %d", got, n+3)
			}
		})
	}
}
