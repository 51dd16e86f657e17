package extproc

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"
)

var (
	decisionFor    = flag.Duration("decision", 0, "run TestDecisionOverhead for this long (0: skip)")
	decisionRate   = flag.Int("decision-rate", 1000, "TestDecisionOverhead: requests per second, on each path")
	decisionPhase  = flag.Duration("decision-phase", 500*time.Millisecond, "TestDecisionOverhead: length of each phase in which every request takes one path")
	decisionPolicy = flag.String("decision-policy", "prefix-aware", "TestDecisionOverhead: routing policy")
)

// chat4K is a chat request of about 4 KB: one of 64 system prompts of 3.5 KB, shared by the
// requests of its group, and a question of its own.
func chat4K(i int) []byte {
	sys := strings.Repeat(fmt.Sprintf("You are assistant %d of the fleet and you answer briefly. ", i%64), 70)[:3500]
	return fmt.Appendf(nil, `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d: %s"}]}`,
		sys, i, strings.Repeat("why? ", 80))
}

const answer4K = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"usage":{"prompt_tokens":1000,"completion_tokens":16,"total_tokens":1016,"prompt_tokens_details":{"cached_tokens":880}}}`

// decider makes the same decisions two ways: as `kvroute serve` makes them in its process
// (proxy.Exchange, what the HTTP handler runs between reading a body and forwarding it), and
// as the ext_proc endpoint picker answers Envoy over loopback gRPC.
type decider struct {
	h      *proxy.Handler
	client extprocv3.ExternalProcessorClient
	hdr    http.Header
	bodies [][]byte // made beforehand, so that the load generator's own work stays small
}

// body is the i-th request's body.
func (d *decider) body(i int) []byte { return d.bodies[i%len(d.bodies)] }

func newDecider(tb testing.TB, policyName string) *decider {
	tb.Helper()
	pool := endpoint.NewPool()
	var specs []endpoint.Spec
	for i := range 8 {
		specs = append(specs, endpoint.Spec{Name: fmt.Sprintf("http://10.0.0.%d:8000", i+1), Models: []string{"m"}, Engine: "vllm", KVCapacityTokens: 1 << 20})
	}
	if _, err := pool.Update(specs); err != nil {
		tb.Fatal(err)
	}
	pk, err := policy.New(policyName, nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		tb.Fatal(err)
	}
	lc, err := route.New(route.Config{Picker: pk, Attempts: 3})
	if err != nil {
		tb.Fatal(err)
	}
	h := &proxy.Handler{Pool: pool, Lifecycle: lc, Metrics: metrics.New(prometheus.NewRegistry()), Logger: slog.New(slog.DiscardHandler)}
	s := &Server{Handler: func() *proxy.Handler { return h }, Logger: slog.New(slog.DiscardHandler)}
	d := &decider{h: h, client: serve(tb, s, make(chan error, 1<<16)), hdr: http.Header{"Content-Type": {"application/json"}}}
	for i := range 4096 {
		d.bodies = append(d.bodies, chat4K(i))
	}
	return d
}

// inProcess decides for body in the router's process and returns how long that took; the
// request is then settled with a 200 answer, as the router would.
func (d *decider) inProcess(body []byte) (time.Duration, error) {
	start := time.Now()
	x := d.h.NewExchange("", "bench")
	out := http.Header{}
	if oe := x.Authenticate(d.hdr, out); oe != nil {
		return 0, oe
	}
	kind, _, oe := proxy.Resolve(http.MethodPost, "/v1/chat/completions")
	if oe != nil {
		return 0, oe
	}
	if oe := x.Prepare(context.Background(), kind, body, d.hdr, out, proxy.PrepareOptions{AddUsage: true}); oe != nil {
		return 0, oe
	}
	ep := x.Call().Next()
	_ = x.Body(ep)
	took := time.Since(start)
	x.Answered(http.StatusOK)
	x.Whole([]byte(answer4K))
	x.Settle(http.StatusOK, http.MethodPost, "/v1/chat/completions")
	return took, nil
}

// viaExtProc plays Envoy in FULL_DUPLEX_STREAMED mode: a new stream, the headers and the body,
// until the pick and the body are back (what holds the request in Envoy), which is what it
// returns; then the answer, so that the request is settled as well.
func (d *decider) viaExtProc(body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := d.client.Process(ctx)
	if err != nil {
		return 0, err
	}
	h := reqHeaders("/v1/chat/completions", false, "x-request-id", "")
	h.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: fullDuplex}
	b := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
	untilEOS := func(response bool) error {
		for {
			r, err := c.Recv()
			if err != nil {
				return err
			}
			if ir := r.GetImmediateResponse(); ir != nil {
				return fmt.Errorf("immediate response %d: %s", ir.GetStatus().GetCode(), ir.GetBody())
			}
			br := r.GetRequestBody()
			if response {
				br = r.GetResponseBody()
			}
			if br.GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
				return nil
			}
		}
	}
	for _, m := range []*extprocv3.ProcessingRequest{h, b} {
		if err := c.Send(m); err != nil {
			return 0, err
		}
	}
	if err := untilEOS(false); err != nil {
		return 0, err
	}
	took := time.Since(start)
	if err := c.Send(respHeaders(200, "", false, "content-type", "application/json")); err != nil {
		return 0, err
	}
	if _, err := c.Recv(); err != nil {
		return 0, err
	}
	if err := c.Send(respBody(answer4K, true)); err != nil {
		return 0, err
	}
	if err := untilEOS(true); err != nil {
		return 0, err
	}
	return took, c.CloseSend()
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func mean(d []time.Duration) time.Duration {
	var s time.Duration
	for _, x := range d {
		s += x
	}
	return s / time.Duration(max(len(d), 1))
}

// TestDecisionOverhead measures what a decision costs as `kvroute serve` makes it in its own
// process and as the ext_proc endpoint picker makes it for Envoy, in one run: one open-loop
// schedule sends 4 KB chat bodies at -decision-rate, all of them down one path for a phase of
// -decision-phase, then down the other, in turn, so that both paths see the same rate and the
// machine's drifts fall on both alike. The in-process decision is the Exchange steps the HTTP
// handler runs between having the body and forwarding it (parse, routing keys, tenant gate,
// candidates, admission, the policy's pick); the ext_proc decision is what Envoy waits for:
// a new stream on a shared HTTP/2 connection, the headers and the body sent, the pick and the
// body back. Both settle their request afterwards, outside the time measured. The load
// generator runs in the same process as the picker (as Envoy does not): see docs/kubernetes.md.
//
//	go test ./internal/extproc -run TestDecisionOverhead -decision 10s -v
func TestDecisionOverhead(t *testing.T) {
	if *decisionFor <= 0 {
		t.Skip("run with -decision 10s")
	}
	d := newDecider(t, *decisionPolicy)
	type path struct {
		name   string
		decide func([]byte) (time.Duration, error)
		mu     sync.Mutex
		lat    []time.Duration
		errs   int
		sent   int
	}
	paths := []*path{{name: "in-process (serve)", decide: d.inProcess}, {name: "ext_proc (Envoy)", decide: d.viaExtProc}}
	// Warm both paths (connections, pools, the index) outside the measure.
	for i := range 200 {
		for _, p := range paths {
			if _, err := p.decide(d.body(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// An open-loop schedule: request i leaves at start + i/rate, late ones at once (a busy
	// machine delays the generator, not the rate).
	interval := time.Second / time.Duration(*decisionRate)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4096) // bounds the requests in flight; a full one is a missed tick
	missed := 0
	start := time.Now()
	for i := 0; ; i++ {
		el := time.Duration(i) * interval
		if el >= *decisionFor {
			break
		}
		if d := time.Until(start.Add(el)); d > 0 {
			time.Sleep(d)
		}
		p := paths[int(el / *decisionPhase)%len(paths)]
		select {
		case sem <- struct{}{}:
		default:
			missed++
			continue
		}
		p.sent++
		body := d.body(i)
		wg.Go(func() {
			defer func() { <-sem }()
			took, err := p.decide(body)
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				p.errs++
				return
			}
			p.lat = append(p.lat, took)
		})
	}
	wg.Wait()
	if missed > 0 {
		t.Logf("%d ticks missed: more than %d requests were in flight", missed, cap(sem))
	}
	t.Logf("decision for 4 KB chat bodies at %d requests/s, policy %s, %v in phases of %v, GOMAXPROCS %d",
		*decisionRate, *decisionPolicy, *decisionFor, *decisionPhase, runtime.GOMAXPROCS(0))
	t.Logf("%-20s %8s %8s %8s %8s %8s %8s %8s", "path", "requests", "per s", "errors", "p50 µs", "p90 µs", "p99 µs", "mean µs")
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Nanoseconds())/1000) }
	for _, p := range paths {
		slices.Sort(p.lat)
		perSec := float64(p.sent) / (decisionFor.Seconds() / float64(len(paths))) // each path had its share of the phases
		t.Logf("%-20s %8d %8.0f %8d %8s %8s %8s %8s", p.name, len(p.lat), perSec, p.errs, us(pct(p.lat, 0.5)), us(pct(p.lat, 0.9)), us(pct(p.lat, 0.99)), us(mean(p.lat)))
		if p.errs > 0 || len(p.lat) == 0 {
			t.Errorf("%s: %d errors, %d decisions", p.name, p.errs, len(p.lat))
		}
	}
	in, ext := paths[0].lat, paths[1].lat
	ratio := func(f func([]time.Duration) time.Duration) string {
		return fmt.Sprintf("%.1fx", float64(f(ext))/float64(max(f(in), 1)))
	}
	t.Logf("ratio ext_proc / in-process: p50 %s, p90 %s, p99 %s, mean %s",
		ratio(func(d []time.Duration) time.Duration { return pct(d, 0.5) }),
		ratio(func(d []time.Duration) time.Duration { return pct(d, 0.9) }),
		ratio(func(d []time.Duration) time.Duration { return pct(d, 0.99) }), ratio(mean))
}

// BenchmarkDecision4K is one decision after another on each path (no pacing): the CPU cost
// of a decision in the router's process and through ext_proc.
func BenchmarkDecision4K(b *testing.B) {
	d := newDecider(b, "prefix-aware")
	for _, bc := range []struct {
		name   string
		decide func([]byte) (time.Duration, error)
	}{{"in-process", d.inProcess}, {"ext_proc", d.viaExtProc}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var sum time.Duration
			i := 0
			for b.Loop() {
				took, err := bc.decide(d.body(i))
				if err != nil {
					b.Fatal(err)
				}
				sum += took
				i++
			}
			b.ReportMetric(float64(sum.Nanoseconds())/float64(max(i, 1))/1000, "decision-µs/op")
		})
	}
}

// TestChat4KIsValid: the measured bodies are what they claim, about 4 KB and routable.
func TestChat4KIsValid(t *testing.T) {
	for _, i := range []int{0, 63, 64, 999} {
		b := chat4K(i)
		if len(b) < 3900 || len(b) > 4400 {
			t.Errorf("chat4K(%d) is %d bytes, want about 4 KB", i, len(b))
		}
		if _, err := openai.Parse(openai.KindChat, b); err != nil {
			t.Errorf("chat4K(%d): %v", i, err)
		}
	}
}
