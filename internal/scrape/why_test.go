package scrape

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestProber_OnFailedSaysWhy: a failed check tells OnFailed how it failed, for passive health
// to tell an engine not ready (llama.cpp's 503 "Loading model", vLLM's 500 once its engine
// died) or down (its connection refused) from one overloaded past the check's timeout.
func TestProber_OnFailedSaysWhy(t *testing.T) {
	answer := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }
	}
	// hang answers when the client gives up (the check's timeout), not before.
	hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	// gone is an address where nothing listens: a listener opened and closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc // nil: the address gone
		want    CheckFailure
	}{
		{"loading", answer(http.StatusServiceUnavailable), CheckFailure{Status: 503}},
		{"engine dead", answer(http.StatusInternalServerError), CheckFailure{Status: 500}},
		{"no such path", answer(http.StatusNotFound), CheckFailure{Status: 404}},
		{"hung", hang, CheckFailure{Timeout: true}},
		{"refused", nil, CheckFailure{Refused: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := gone
			client := &http.Client{Transport: &http.Transport{}}
			if tc.handler != nil {
				srv := httptest.NewServer(tc.handler)
				defer srv.Close()
				base, client = srv.URL, srv.Client()
			}
			// A health path of its own: a 4xx is not probed for another kind (mismatch).
			pool, ep := onePool(t, endpoint.Spec{Name: base, Engine: "vllm", Models: []string{"m"}, HealthPath: "/health"})
			pr := New(pool, client, Options{HealthTimeout: 200 * time.Millisecond}, nil)
			var told []CheckFailure
			pr.OnFailed = func(e *endpoint.Endpoint, sent time.Time, why CheckFailure) { told = append(told, why) }
			if err := pr.Check(context.Background(), ep); err == nil {
				t.Fatal("the check passed")
			}
			if diff := cmp.Diff([]CheckFailure{tc.want}, told); diff != "" {
				t.Errorf("OnFailed told (-want +got):\n%s", diff)
			}
		})
	}
}
