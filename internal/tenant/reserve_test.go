package tenant

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// reserve: the prompt and, for each sequence, its max_tokens, or without one what the answers
// had, at least MinReservedCompletion; the whole at most the limit.
func TestReserve(t *testing.T) {
	type res struct{ Total, Completion int }
	for _, tc := range []struct {
		name     string
		expected float64 // what the answers had
		limit    int
		d        Demand
		want     res
	}{
		{"max_tokens", 0, 100000, Demand{Prompt: 10, Seqs: 1, MaxTokens: 4000}, res{4010, 4000}},
		{"max_tokens, n 3", 0, 100000, Demand{Prompt: 10, Seqs: 3, MaxTokens: 4000}, res{12010, 12000}},
		{"max_tokens above the answers", 300, 100000, Demand{Prompt: 10, Seqs: 2, MaxTokens: 4000}, res{8010, 8000}},
		{"max_tokens below the answers", 300, 100000, Demand{Prompt: 10, Seqs: 2, MaxTokens: 100}, res{210, 200}},
		{"no max_tokens, no answer", 0, 100000, Demand{Prompt: 10, Seqs: 2}, res{10 + 2*MinReservedCompletion, 2 * MinReservedCompletion}},
		{"no max_tokens, short answers", 300, 100000, Demand{Prompt: 10, Seqs: 1}, res{10 + MinReservedCompletion, MinReservedCompletion}},
		{"no max_tokens, long answers", 2500.2, 100000, Demand{Prompt: 10, Seqs: 1}, res{2511, 2501}},
		{"embeddings", 0, 100000, Demand{Prompt: 10, MaxTokens: 50}, res{10, 0}},
		{"over the limit: the limit", 0, 10000, Demand{Prompt: 3000, Seqs: 128, MaxTokens: 100000}, res{10000, 7000}},
		{"the prompt alone at the limit", 0, 10000, Demand{Prompt: 10000, Seqs: 1, MaxTokens: 5}, res{10000, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &limiter{tok: newBucket(tc.limit, time.Unix(0, 0)), expected: tc.expected}
			var got res
			got.Total, got.Completion = l.reserve(tc.d)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("reserve(%+v) (-want +got):\n%s", tc.d, diff)
			}
		})
	}
}

// learn: the first answer sets the expected completion, a longer one raises it at once, a
// shorter one brings it down by expectDecay of the way.
func TestLearnExpected(t *testing.T) {
	var l limiter
	for _, step := range []struct{ perSeq, want float64 }{
		{300, 300},
		{4000, 4000},
		{100, 4000 - expectDecay*3900},
		{-1, 4000 - expectDecay*3900}, // not an answer
	} {
		l.learn(step.perSeq)
		if l.expected != step.want {
			t.Errorf("after an answer of %v: expected %v, want %v", step.perSeq, l.expected, step.want)
		}
	}
}

// A tenant of 10,000 tokens a minute sending requests of max_tokens 4000: two are admitted on
// their reservations, the third is refused with a Retry-After for the tokens it misses, and
// goes once they have refilled. Requests without max_tokens reserve 1024, or what the
// tenant's answers have had where that is more. The reservation settles at the end: what the
// answer used is charged, the rest given back, any excess a debt. Before, each request
// reserved its prompt alone and all were admitted.
func TestTakeReservesCompletion(t *testing.T) {
	g, clk := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 10000}}]\n", nil)
	id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	if oe != nil {
		t.Fatal(oe)
	}
	take := func(d Demand) (*Ticket, http.Header, string) {
		t.Helper()
		h := http.Header{}
		tk, oe := g.Take(id, d, h)
		if oe != nil {
			return nil, h, *oe.Code + ": " + oe.Message
		}
		return tk, h, ""
	}
	long := Demand{Prompt: 10, Seqs: 1, MaxTokens: 4000}
	first, h, refused := take(long)
	if refused != "" || h.Get("x-ratelimit-remaining-tokens") != "5990" {
		t.Fatalf("first: %q, remaining %s; want admitted, 5990 left", refused, h.Get("x-ratelimit-remaining-tokens"))
	}
	second, h, refused := take(long)
	if refused != "" || h.Get("x-ratelimit-remaining-tokens") != "1980" {
		t.Fatalf("second: %q, remaining %s; want admitted, 1980 left", refused, h.Get("x-ratelimit-remaining-tokens"))
	}
	_, h, refused = take(long)
	// 2030 tokens missing at 10,000 a minute: 12.18 s.
	if !strings.HasPrefix(refused, "rate_limit_exceeded: ") || !strings.Contains(refused, "requested about 4010 (the prompt's 10 and 4000 reserved for the completion") ||
		h.Get("retry-after-ms") != "12180" || h.Get("Retry-After") != "13" {
		t.Fatalf("third: %q, retry-after-ms %s, Retry-After %s; want rate_limit_exceeded, 12180, 13", refused, h.Get("retry-after-ms"), h.Get("Retry-After"))
	}
	clk.Add(13 * time.Second) // 2166.67 tokens back: 4146.67
	third, _, refused := take(long)
	if refused != "" {
		t.Fatalf("third, after its Retry-After: %q", refused)
	}
	// The first answer had 300 tokens: 3700 of its 4010 come back (3836.67 in the bucket). A
	// short answer does not lower what a request of max_tokens 4000 reserves, nor the 1024 of
	// one without.
	first.Learn(300)
	first.End(http.StatusOK, 10, 300)
	if _, _, refused := take(long); !strings.Contains(refused, "requested about 4010") {
		t.Fatalf("after an answer of 300 tokens, with 3836 tokens left: %q, want 4010 refused", refused)
	}
	open := Demand{Prompt: 10, Seqs: 1}
	var tickets []*Ticket
	for i := range 3 {
		tk, _, refused := take(open)
		if refused != "" {
			t.Fatalf("request %d without max_tokens, reserving 1034 of 3836: %q", i, refused)
		}
		tickets = append(tickets, tk)
	}
	if _, h, refused := take(open); !strings.Contains(refused, "requested about 1034 (the prompt's 10 and 1024 reserved") || h.Get("x-ratelimit-remaining-tokens") != "734" {
		t.Errorf("the 4th without max_tokens, reserving 1034 of 734: %q, %s left; want refused, 734 left", refused, h.Get("x-ratelimit-remaining-tokens"))
	}
	// One of them has an answer of 3000 tokens: charged 1976 more than it reserved (a debt),
	// and the next requests without max_tokens reserve 3000. The others, and the second and
	// third, reached no engine: given back.
	tickets[0].Learn(3000)
	tickets[0].End(http.StatusOK, 10, 3000)
	for _, tk := range append(tickets[1:], second, third) {
		tk.End(499, 0, 0)
	}
	// 734.67 - 1976 + 2 x 1034 + 2 x 4010 = 8846.67
	if _, h, refused := take(open); refused != "" || h.Get("x-ratelimit-remaining-tokens") != "5836" {
		t.Errorf("after an answer of 3000 tokens: %q, %s left; want admitted, reserving 3010 of 8846", refused, h.Get("x-ratelimit-remaining-tokens"))
	}
}

// A request whose completion alone may exceed the tenant's minute is not refused for good: it
// reserves the whole limit and goes when the bucket is full. A prompt over the limit still
// can never fit.
func TestTakeOverLimit(t *testing.T) {
	g, clk := newTestGate(t, "tenants: [{name: a, api_keys: [\""+HashKey("k")+"\"], limits: {tokens_per_minute: 1000}}]\n", nil)
	id, _ := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	h := http.Header{}
	tk, oe := g.Take(id, Demand{Prompt: 10, Seqs: 4, MaxTokens: 4000}, h)
	if oe != nil || h.Get("x-ratelimit-remaining-tokens") != "0" {
		t.Fatalf("with a full bucket: %v, %s left; want admitted, 0 left", oe, h.Get("x-ratelimit-remaining-tokens"))
	}
	tk.End(http.StatusOK, 10, 90)
	h = http.Header{}
	if _, oe := g.Take(id, Demand{Prompt: 10, Seqs: 4, MaxTokens: 4000}, h); oe == nil || *oe.Code != "rate_limit_exceeded" || h.Get("x-should-retry") != "" || h.Get("retry-after-ms") != "6000" {
		t.Fatalf("with 900 of 1000 tokens: %v, x-should-retry %q, retry-after-ms %s; want rate_limit_exceeded, retry in 6 s", oe, h.Get("x-should-retry"), h.Get("retry-after-ms"))
	}
	clk.Add(6 * time.Second)
	if _, oe := g.Take(id, Demand{Prompt: 10, Seqs: 4, MaxTokens: 4000}, http.Header{}); oe != nil {
		t.Fatalf("with a full bucket again: %v", oe)
	}
	h = http.Header{}
	if _, oe := g.Take(id, Demand{Prompt: 1001, Seqs: 1, MaxTokens: 1}, h); oe == nil || *oe.Code != "request_too_large" || h.Get("x-should-retry") != "false" {
		t.Errorf("a prompt over the limit: %v, x-should-retry %q; want request_too_large, false", oe, h.Get("x-should-retry"))
	}
}

// What a tenant's answers taught its reservation outlives a reload, as its buckets do.
func TestReloadKeepsExpected(t *testing.T) {
	tenants := "tenants: [{name: a, api_keys: [\"" + HashKey("k") + "\"], limits: {tokens_per_minute: 100000}}]\n"
	g, _ := newTestGate(t, tenants, nil)
	id, _ := g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	open := Demand{Prompt: 10, Seqs: 1}
	tk, _ := g.Take(id, open, http.Header{})
	tk.Learn(2000)
	tk.End(http.StatusOK, 10, 2000)
	if err := g.Reload(testConfig(t, strings.Replace(tenants, "100000", "90000", 1))); err != nil {
		t.Fatal(err)
	}
	id, _ = g.Authenticate(http.Header{"Authorization": {"Bearer k"}})
	h := http.Header{}
	// 97,990 of 100,000 left, 88,191 of 90,000 after the reload, less 2010 now.
	if _, oe := g.Take(id, open, h); oe != nil || h.Get("x-ratelimit-remaining-tokens") != "86181" {
		t.Errorf("after the reload: %v, %s left; want 86181 (2000 reserved for the completion, as learnt)", oe, h.Get("x-ratelimit-remaining-tokens"))
	}
}

// Keep forgets the endpoints not named, and keeps the others' rates and the fleet's.
func TestDecodeRatesKeep(t *testing.T) {
	var r DecodeRates
	for range MinDecodeSamples {
		r.Learn("a", 100, time.Second)
		r.Learn("b", 300, time.Second)
	}
	fleet, _ := r.Rate("c")
	r.Keep([]string{"a", "c"})
	for _, tc := range []struct {
		ep, from string
		rate     float64
	}{{"a", "endpoint", 100}, {"b", "fleet", fleet}} {
		if rate, from := r.Rate(tc.ep); from != tc.from || rate != tc.rate {
			t.Errorf("Rate(%s) = %v from %s, want %v from %s", tc.ep, rate, from, tc.rate, tc.from)
		}
	}
}
