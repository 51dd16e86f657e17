package extproc

import (
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/metrics/metricstest"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestBadEventStream: an event that is no event of the API in an engine's stream (data that is
// no JSON object, bytes that are no event stream, a NUL) is settled as `kvroute serve` settles
// it (proxy's TestBadStreamAfterFirstByte): a 502 stream_bad_event, error_code
// upstream_bad_answer, on the access line and in kvroute_requests_total, a failure of the
// endpoint, the policy told it failed. Where kvroute writes the body, the bad event and what
// follows are not passed on, and the client's stream ends with serve's error event; elsewhere
// the body passes as it came. The content events before it are charged. It passed as a clean
// 200.
func TestBadEventStream(t *testing.T) {
	for _, bad := range []struct{ name, ev string }{
		{"not json", "data: {not json\n\n"},
		{"html", "<html><body>502 Bad Gateway</body></html>\n\n"},
		{"nul in data", "data: {\"choices\":[{\"delta\":{\"content\":\"a\x00\"}}]}\n\n"},
	} {
		for _, mode := range []filterv3.ProcessingMode_BodySendMode{fullDuplex, streamed, bufferedPartial} {
			t.Run(bad.name+"/"+mode.String(), func(t *testing.T) {
				var logs testlog.Buffer
				f := tenantFixture(t, &logs, ep1)
				e := f.answering(t, mode, "authorization", "Bearer sk-acme")
				chunks := []string{event1 + bad.ev + event1, doneEvent}
				got := e.answer(mode, chunks, true)
				if canRewrite(mode) {
					const prefix = event1 + "event: error\ndata: "
					if !strings.HasPrefix(got, prefix) || !strings.Contains(got[len(prefix):], `"code":"upstream_bad_answer"`) ||
						!strings.Contains(got[len(prefix):], "no event of the API") || strings.Contains(got, "[DONE]") {
						t.Errorf("client's stream = %q, want the event before the bad one, then serve's error event", got)
					}
				} else if want := strings.Join(chunks, ""); got != want {
					t.Errorf("client's stream = %q, want it as it came, %q", got, want)
				}
				e.close()
				f.streamEnded(t)
				if diff := cmp.Diff([]string{ep1 + " stream_cut"}, f.health.failures()); diff != "" {
					t.Errorf("failures (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]string{"routed " + ep1, "first " + ep1, "done " + ep1 + " ok=false cached=false"}, f.pk.events()); diff != "" {
					t.Errorf("policy events (-want +got):\n%s", diff)
				}
				v := metricstest.Values(t, f.reg, "kvroute_requests_total")
				if got := v["kvroute_requests_total{endpoint="+ep1+",model=m,status=502}"]; got != 1 {
					t.Errorf("requests_total 502 on %s = %v, want 1 (%v)", ep1, got, v)
				}
				l := accessLine(t, &logs)
				if l["status"] != 502.0 || l["error_type"] != "stream_bad_event" || l["error_code"] != "upstream_bad_answer" {
					t.Errorf("access line: status %v, error_type %v, error_code %v; want 502, stream_bad_event, upstream_bad_answer",
						l["status"], l["error_type"], l["error_code"])
				}
				if l["charged_completion_tokens"] != 1.0 {
					t.Errorf("charged %v completion tokens, want 1 (the content event before the bad one)", l["charged_completion_tokens"])
				}
				if !strings.Contains(logs.String(), `"msg":"stream cut: the engine sent an event that is no event of the API`) {
					t.Errorf("no warning for the bad event: %s", logs.String())
				}
			})
		}
	}
}
