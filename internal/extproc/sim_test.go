package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/simserver"
)

// simFleet starts n simulated engines serving model "m" on loopback and a picker over them
// with the prefix-aware policy.
func simFleet(t testing.TB, n int) (*fixture, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fleet, err := simserver.StartFleet(ctx, simserver.Options{Profile: "instant", Model: "m", DefaultMaxTokens: 4}, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fleet.Close() })
	urls := fleet.URLs()
	specs := make([]endpoint.Spec, len(urls))
	for i, u := range urls {
		specs[i] = endpoint.Spec{Name: u, Models: []string{"m"}, Engine: "vllm", KVCapacityTokens: 1 << 22}
	}
	pool := endpoint.NewPool()
	if _, err := pool.Update(specs); err != nil {
		t.Fatal(err)
	}
	pk, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	lc, err := route.New(route.Config{Picker: pk, Attempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	h := &proxy.Handler{Pool: pool, Lifecycle: lc, Metrics: metrics.New(reg), Logger: slog.New(slog.DiscardHandler)}
	f := &fixture{pool: pool, h: h, reg: reg, ended: make(chan error, 64)}
	f.srv = &Server{Handler: func() *proxy.Handler { return h }, Logger: slog.New(slog.DiscardHandler)}
	f.client = serve(t, f.srv, f.ended)
	return f, urls
}

// exchange is what the client of one request saw, and what kvroute did with it.
type exchange struct {
	dest   string // the list kvroute gave Envoy
	client string // the answer as the client got it
	cached int    // what the engine reported as cached, -1 when it did not say
}

// viaEnvoy plays Envoy for one request in FULL_DUPLEX_STREAMED mode: ask kvroute, send the
// request it returns to the first endpoint of its list over HTTP, and pass the answer back
// through kvroute chunk by chunk as the engine writes it.
func viaEnvoy(t testing.TB, f *fixture, body string, stream bool) exchange {
	t.Helper()
	e := f.open(t, fullDuplex, fullDuplex)
	e.send(reqHeaders("/v1/chat/completions", false, "x-request-id", ""))
	for i := 0; i < len(body); i += 1000 {
		e.send(reqBody(body[i:min(i+1000, len(body))], i+1000 >= len(body)))
	}
	hr := e.recv()
	ex := exchange{dest: destination(hr), cached: -1}
	if ex.dest == "" {
		t.Fatalf("no destination in %v", hr)
	}
	forwarded, _ := e.streamedBody(false)
	first, _, _ := strings.Cut(ex.dest, ",")
	req, err := http.NewRequest(http.MethodPost, "http://"+first+"/v1/chat/completions", strings.NewReader(forwarded))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hr.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if k := h.GetHeader().GetKey(); k != DestinationKey && k != "content-length" {
			req.Header.Set(k, string(h.GetHeader().GetRawValue()))
		}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	e.send(respHeaders(resp.StatusCode, first, false, "content-type", resp.Header.Get("Content-Type")))
	e.recv()

	// kvroute answers body chunks when it has whole events: read its answers as they come.
	got := make(chan string, 1)
	failed := make(chan error, 1)
	go func() {
		var b strings.Builder
		for {
			r, err := e.c.Recv()
			if err != nil {
				failed <- err
				return
			}
			sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			b.Write(sr.GetBody())
			if sr.GetEndOfStream() {
				got <- b.String()
				return
			}
		}
	}()
	var raw strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			raw.Write(buf[:n])
			e.send(respBody(string(buf[:n]), false))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	e.send(respBody("", true))
	select {
	case ex.client = <-got:
	case err := <-failed:
		t.Fatalf("receiving the answer: %v", err)
	}
	e.close()
	if err := f.streamEnded(t); err != nil {
		t.Fatalf("Process = %v", err)
	}
	if u, ok := openai.FindUsage(lastData(raw.String())); ok {
		ex.cached = u.Cached()
	}
	return ex
}

// lastData is the data of the last event of a stream before [DONE], or the body itself.
func lastData(s string) []byte {
	var last string
	for ev := range strings.SplitSeq(s, "\n\n") {
		if d, ok := strings.CutPrefix(ev, "data: "); ok && d != "[DONE]" {
			last = d
		}
	}
	if last == "" {
		return []byte(s)
	}
	return []byte(last)
}

// TestSimFleetViaEnvoy: simulated engines behind a test playing Envoy, kvroute picking over
// ext_proc: every request of a conversation group goes where its shared prefix is cached (the
// engine says so), the client gets its stream without the usage chunk kvroute asked for, and
// the router's books balance.
func TestSimFleetViaEnvoy(t *testing.T) {
	f, urls := simFleet(t, 3)
	const groups, questions = 4, 4 // 4 groups on 3 engines: no rotation lands a group on one engine by chance
	dests := map[int]string{}
	for q := range questions {
		for g := range groups {
			system := strings.Repeat(fmt.Sprintf("Group %d shares this long system prompt. ", g), 60)
			body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
				q != 2, system, q)
			ex := viaEnvoy(t, f, body, q != 2)
			first, _, _ := strings.Cut(ex.dest, ",")
			if q == 0 {
				dests[g] = first
			} else if first != dests[g] {
				t.Errorf("group %d question %d went to %s, its prefix is on %s", g, q, first, dests[g])
			}
			if q > 0 && ex.cached <= 0 {
				t.Errorf("group %d question %d: the engine reports %d cached tokens, want its shared prefix", g, q, ex.cached)
			}
			if n := strings.Count(ex.dest, ",") + 1; n != len(urls) {
				t.Errorf("%d endpoints in %q, want the %d ranked", n, ex.dest, len(urls))
			}
			if q != 2 {
				if !strings.HasSuffix(ex.client, "data: [DONE]\n\n") || strings.Contains(ex.client, `"usage"`) {
					t.Errorf("group %d question %d: client's stream %q: want it whole, without the usage chunk", g, q, ex.client)
				}
			} else if !strings.Contains(ex.client, `"usage"`) {
				t.Errorf("non-streamed answer %q lacks its usage", ex.client)
			}
		}
	}
	v := metricstest.Values(t, f.reg, "kvroute_")
	total := 0.0
	for _, u := range urls {
		total += v["kvroute_requests_total{endpoint="+u+",model=m,status=200}"]
	}
	if total != groups*questions {
		t.Errorf("requests answered 200: %v, want %d", total, groups*questions)
	}
	if v["kvroute_engine_cached_tokens_total{model=m}"] <= 0 {
		t.Error("no cached tokens learned from the engines")
	}
	for _, ep := range f.pool.All() {
		if ep.InFlight() != 0 || ep.PendingPrefill() != 0 {
			t.Errorf("%s: %d in flight, %d pending prefill", ep.Name, ep.InFlight(), ep.PendingPrefill())
		}
	}
}
