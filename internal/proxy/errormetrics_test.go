package proxy

import (
	"io"
	"net/http"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
)

// TestRequestErrorsMetric: the failures kvroute_requests_total counts under one status (a 502
// for a stream's bad event, its cut, its error event, an unreadable answer, a lost connection;
// the router's 503s) are told apart in kvroute_request_errors_total by the access line's
// error_type and error_code, one count per request; an engine's own error type is "other".
func TestRequestErrorsMetric(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handle    func(w http.ResponseWriter, r *http.Request) // nil: the endpoint is unhealthy
		body      string
		status    int    // what kvroute_requests_total counts
		onNone    bool   // counted with endpoint none
		typ, code string // the series at 1
	}{
		{"bad event", sseHandler(goodEvent, "data: {not json\n\n", "data: [DONE]\n\n"), streamBody, 502, false, "stream_bad_event", "upstream_bad_answer"},
		{"stream cut", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, goodEvent)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks: no end of the chunked body
		}, streamBody, 502, false, "stream_cut", ""},
		{"error event", sseHandler(goodEvent, llamaErrLine, "data: [DONE]\n\n"), streamBody, 502, false, "stream_error", ""},
		{"bad answer", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "<html>not an answer</html>")
		}, chatBody, 502, false, "upstream_error", "upstream_bad_answer"},
		{"lost connection", func(w http.ResponseWriter, r *http.Request) {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
		}, chatBody, 502, false, "upstream_error", "upstream_connection_lost"},
		{"engine's own error", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"object":"error","message":"bad","type":"BadRequestError","code":400}`)
		}, chatBody, 400, false, "other", ""},
		{"no healthy endpoint", nil, chatBody, 503, true, "service_unavailable_error", "no_healthy_endpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			handle := tc.handle
			if handle == nil {
				handle = func(http.ResponseWriter, *http.Request) { t.Error("the unhealthy endpoint was sent a request") }
			}
			eng := engine(t, handle)
			f := newFixture(t, spec(eng.URL, "m"))
			if tc.handle == nil {
				f.pool.ByName(eng.URL).SetHealthy(false)
			}
			f.post(t, "/v1/chat/completions", tc.body)
			ep := eng.URL
			if tc.onNone {
				ep = "none"
			}
			counted := func(prefix string) map[string]float64 {
				out := map[string]float64{}
				for k, v := range metricstest.Values(t, f.reg, prefix) {
					if v != 0 {
						out[k] = v
					}
				}
				return out
			}
			want := map[string]float64{
				"kvroute_request_errors_total{endpoint=" + ep + ",error_code=" + tc.code + ",error_type=" + tc.typ + ",model=m}": 1,
			}
			if diff := cmp.Diff(want, counted("kvroute_request_errors_total")); diff != "" {
				t.Errorf("request errors (-want +got):\n%s", diff)
			}
			want = map[string]float64{"kvroute_requests_total{endpoint=" + ep + ",model=m,status=" + strconv.Itoa(tc.status) + "}": 1}
			if diff := cmp.Diff(want, counted("kvroute_requests_total")); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

// sseHandler answers with a text/event-stream body of events, flushed after each.
func sseHandler(events ...string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
	}
}
