package tenant

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// capped is a tenant of 10,000 tokens a minute whose answers are at most cap tokens.
func capped(cap string) string {
	return "tenants: [{name: a, api_keys: [\"" + HashKey("k") + "\"], limits: {tokens_per_minute: 10000, max_output_tokens: " + cap + "}}]\n"
}

// With max_output_tokens, a request that sets no max_tokens reserves the cap for each sequence
// (not a learnt length of at least MinReservedCompletion); one that asks for more than the cap,
// or for less than 1, is refused with 400 naming the field, without taking anything from the
// limits, and counted among the refusals as max_output_tokens. A reload applies a new cap to
// the requests that authenticate after it.
func TestTakeOutputCap(t *testing.T) {
	g, _, reg := newMeteredGate(t, capped("500"), Options{})
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	if oe != nil {
		t.Fatal(oe)
	}
	if id.MaxOutputTokens != 500 {
		t.Fatalf("identity's MaxOutputTokens %d, want 500", id.MaxOutputTokens)
	}
	type answer struct {
		Status               int
		Param, Code, Message string
		Remaining            string
	}
	take := func(id *Identity, d Demand) answer {
		t.Helper()
		h := http.Header{}
		tk, oe := g.Take(id, d, h)
		if oe != nil {
			a := answer{Status: oe.Status, Message: oe.Message, Remaining: h.Get("x-ratelimit-remaining-tokens")}
			if oe.Param != nil {
				a.Param = *oe.Param
			}
			if oe.Code != nil {
				a.Code = *oe.Code
			}
			return a
		}
		tk.End(499, 0, 0) // reached no engine: the reservation comes back
		return answer{Status: http.StatusOK, Remaining: h.Get("x-ratelimit-remaining-tokens")}
	}
	for _, tc := range []struct {
		name string
		d    Demand
		want answer
	}{
		{"no max_tokens: the cap reserved", Demand{Prompt: 10, Seqs: 1}, answer{Status: 200, Remaining: "9490"}},
		{"no max_tokens, 3 sequences", Demand{Prompt: 10, Seqs: 3}, answer{Status: 200, Remaining: "8490"}},
		{"the cap asked", Demand{Prompt: 10, Seqs: 1, MaxTokens: 500, MaxTokensField: "max_tokens"}, answer{Status: 200, Remaining: "9490"}},
		{"under the cap", Demand{Prompt: 10, Seqs: 1, MaxTokens: 100, MaxTokensField: "max_completion_tokens"}, answer{Status: 200, Remaining: "9890"}},
		{"embeddings: no cap", Demand{Prompt: 10}, answer{Status: 200, Remaining: "9990"}},
		{"above the cap", Demand{Prompt: 10, Seqs: 1, MaxTokens: 501, MaxTokensField: "max_completion_tokens"}, answer{Status: 400, Param: "max_completion_tokens", Code: "integer_above_max_value",
			Message: "max_completion_tokens is 501, more than this API key may ask for: at most 500 tokens per answer (limits.max_output_tokens); ask for 500 or fewer, or leave max_completion_tokens out to be cut at 500"}},
		{"above the cap, no field said", Demand{Prompt: 10, Seqs: 1, MaxTokens: 4000}, answer{Status: 400, Param: "max_tokens", Code: "integer_above_max_value",
			Message: "max_tokens is 4000, more than this API key may ask for: at most 500 tokens per answer (limits.max_output_tokens); ask for 500 or fewer, or leave max_tokens out to be cut at 500"}},
		{"below 1", Demand{Prompt: 10, Seqs: 1, MaxTokens: -1, MaxTokensField: "max_tokens"}, answer{Status: 400, Param: "max_tokens", Code: "integer_below_min_value",
			Message: "max_tokens is -1: ask for 1 to 500 tokens per answer (this API key's limits.max_output_tokens), or leave max_tokens out to be cut at 500"}},
	} {
		if diff := cmp.Diff(tc.want, take(id, tc.d)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
	got := tenantSeries(t, reg)
	if got[`kvroute_tenant_rejections_total{reason=max_output_tokens,tenant=a}`] != 3 {
		t.Errorf("series %v: want 3 rejections for max_output_tokens", got)
	}
	if _, ok := got[`kvroute_tenant_requests_total{status=400,tenant=a}`]; ok {
		t.Errorf("a refusal for the cap counted under its status by Take: %v (the proxy's Count does)", got)
	}

	// A reload lowers the cap: the next requests are held to it; without it, none is.
	if err := g.Reload(testConfig(t, capped("200"))); err != nil {
		t.Fatal(err)
	}
	id2, _ := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	if a := take(id2, Demand{Prompt: 10, Seqs: 1, MaxTokens: 300, MaxTokensField: "max_tokens"}); a.Status != 400 || id2.MaxOutputTokens != 200 {
		t.Errorf("after the reload to 200: max_tokens 300 answered %d, identity's cap %d; want 400 and 200", a.Status, id2.MaxOutputTokens)
	}
	if a := take(id2, Demand{Prompt: 10, Seqs: 1}); a.Remaining != "9790" {
		t.Errorf("after the reload to 200: no max_tokens left %s, want 9790 (200 reserved)", a.Remaining)
	}
	if err := g.Reload(testConfig(t, capped("0"))); err != nil {
		t.Fatal(err)
	}
	id3, _ := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	if a := take(id3, Demand{Prompt: 10, Seqs: 1, MaxTokens: 4000, MaxTokensField: "max_tokens"}); a.Status != 200 || a.Remaining != "5990" {
		t.Errorf("without a cap: max_tokens 4000 answered %d, %s left; want 200, 5990", a.Status, a.Remaining)
	}
	if a := take(id3, Demand{Prompt: 10, Seqs: 1}); a.Remaining != "8966" {
		t.Errorf("without a cap: no max_tokens left %s, want 8966 (MinReservedCompletion)", a.Remaining)
	}
}

// kvroute_tenant_in_flight and kvroute_tenant_queued follow the tenant's requests admitted and
// waiting for admission, step by step, read 0 once they have all ended, and read right again
// after a reload that removed the tenant and added it back while its requests were in flight.
func TestTenantLoadGauges(t *testing.T) {
	pool := endpoint.NewPool()
	if _, err := pool.Update([]endpoint.Spec{{Name: "http://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	eps := pool.All()
	two := "tenants: [{name: a, api_keys: [\"" + HashKey("k") + "\"]}, {name: b, api_keys: [\"" + HashKey("kb") + "\"]}]\n" +
		"overload: {max_waiting_per_endpoint: 4, max_wait: 1h, queue_size: 8}\n"
	g, _, reg := newMeteredGate(t, two, Options{Poll: time.Millisecond})
	a, _ := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	gauges := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for k, v := range allTenantSeries(t, reg) {
			if strings.HasPrefix(k, "kvroute_tenant_in_flight{") || strings.HasPrefix(k, "kvroute_tenant_queued{") {
				out[k] = v
			}
		}
		return out
	}
	want := func(step string, inA, queuedA float64) {
		t.Helper()
		w := map[string]float64{
			"kvroute_tenant_in_flight{tenant=a}": inA, "kvroute_tenant_queued{tenant=a}": queuedA,
			"kvroute_tenant_in_flight{tenant=b}": 0, "kvroute_tenant_queued{tenant=b}": 0,
		}
		if diff := cmp.Diff(w, gauges()); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step, diff)
		}
	}
	want("at start", 0, 0)
	var tickets []*Ticket
	for range 3 {
		tk, oe := g.Take(a, Demand{Prompt: 1, Seqs: 1}, http.Header{})
		if oe != nil {
			t.Fatal(oe)
		}
		tickets = append(tickets, tk)
	}
	want("3 taken", 3, 0)

	// Two wait for admission while the endpoint is saturated.
	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 10})
	done := make(chan error, 2)
	for range 2 {
		go func() {
			release, err := g.Admit(context.Background(), a, eps)
			if release != nil {
				release()
			}
			done <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.Waiting() != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	want("2 waiting", 3, 2)

	// Removed and added back while they are in flight and waiting: its series come back at
	// its counts, not at 0.
	if err := g.Reload(testConfig(t, "tenants: [{name: b, api_keys: [\""+HashKey("kb")+"\"]}]\noverload: {max_waiting_per_endpoint: 4, max_wait: 1h, queue_size: 8}\n")); err != nil {
		t.Fatal(err)
	}
	if err := g.Reload(testConfig(t, two)); err != nil {
		t.Fatal(err)
	}
	want("after a reload without a and one with it", 3, 2)

	eps[0].SetSnapshot(&endpoint.Snapshot{At: time.Now(), Waiting: 0})
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("admitted with an error: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("not admitted after the endpoint freed up")
		}
	}
	for _, tk := range tickets {
		tk.End(http.StatusOK, 1, 1)
	}
	want("all ended", 0, 0)
}
