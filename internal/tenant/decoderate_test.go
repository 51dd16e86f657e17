package tenant

import (
	"math"
	"testing"
	"time"
)

// The decode rates: the default until an endpoint (or the fleet) has MinDecodeSamples answers
// long enough to tell, then the endpoint's own, else the fleet's; recent answers weigh most.
func TestDecodeRates(t *testing.T) {
	var r DecodeRates
	check := func(ep string, want float64, from string) {
		t.Helper()
		got, src := r.Rate(ep)
		if math.Abs(got-want) > 1e-9 || src != from {
			t.Errorf("Rate(%s) = %v from %s, want %v from %s", ep, got, src, want, from)
		}
	}
	check("a", DefaultDecodeRate, "default")
	r.Learn("a", 1000, 10*time.Second)
	r.Learn("a", minDecodeTokens-1, time.Second) // too short to tell
	r.Learn("a", 500, 5*time.Second)
	check("a", DefaultDecodeRate, "default") // two answers
	r.Learn("a", 100, time.Second)
	check("a", 100, "endpoint")
	check("b", 100, "fleet")
	r.Learn("a", 2000, 10*time.Second) // 200 a second, weighed in at decodeWeight
	w := decodeWeight
	tok := ((1000*(1-w)+500*w)*(1-w)+100*w)*(1-w) + 2000*w
	sec := ((10*(1-w)+5*w)*(1-w)+1*w)*(1-w) + 10*w
	check("a", tok/sec, "endpoint") // 105.3: between 100 and 200, nearer the older answers' weight
	if got, _ := r.Rate("a"); got <= 100 || got >= 200 {
		t.Errorf("Rate(a) = %v after answers of 100 and one of 200 tokens a second", got)
	}
}

// An engine's usage that no engine could have generated (9e18 completion tokens in 3 s) is
// learnt as MaxDecodeRate, and a rate is never above it nor below MinDecodeRate: the charges
// made from it stay within what an engine can do in the time (3e18 a second made the charge of
// a request cut after 5 s overflow to -9.2e18 tokens).
func TestDecodeRatesBounded(t *testing.T) {
	var r DecodeRates
	for range MinDecodeSamples {
		r.Learn("liar", 9e18, 3*time.Second)
	}
	if got, src := r.Rate("liar"); got != MaxDecodeRate || src != "endpoint" {
		t.Errorf("after 9e18 tokens in 3 s: Rate = %v from %s, want %v from endpoint", got, src, float64(MaxDecodeRate))
	}
	if got, _ := r.Rate("other"); got != MaxDecodeRate {
		t.Errorf("the fleet's rate = %v, want %v", got, float64(MaxDecodeRate))
	}
	for _, bad := range []float64{math.Inf(1), math.NaN(), -5} {
		r.Learn("liar", bad, time.Second) // not learnt
	}
	if got, _ := r.Rate("liar"); got != MaxDecodeRate {
		t.Errorf("after Inf, NaN and -5: Rate = %v, want %v", got, float64(MaxDecodeRate))
	}
	var slow DecodeRates
	for range MinDecodeSamples {
		slow.Learn("stalled", 20, time.Hour) // 20 tokens in an hour (the clock jumped)
	}
	if got, _ := slow.Rate("stalled"); got != MinDecodeRate {
		t.Errorf("after 20 tokens an hour: Rate = %v, want %v", got, float64(MinDecodeRate))
	}
}
