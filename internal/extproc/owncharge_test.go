package extproc

import (
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/testlog"
)

// TestEnvoyOwnAnswerCharge: Envoy's own answer after the pick that no engine had costs the
// tenant nothing, whatever its status; a local reset, which Envoy may make once the engine
// had the request, is charged as before.
func TestEnvoyOwnAnswerCharge(t *testing.T) {
	for _, tc := range []struct {
		status  int
		details string
		charged bool
	}{
		{408, "request_overall_timeout", false}, {413, "request_payload_too_large", false},
		{500, "filter_removed_required_request_headers", false}, {403, "ext_authz_denied", false},
		{503, "no_healthy_upstream", false}, {503, "upstream_reset_before_response_started{local_reset}", false},
		{504, "upstream_per_try_timeout", true},
	} {
		var logs testlog.Buffer
		f := tenantFixture(t, &logs, ep1)
		e, _ := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
		f.answer(t, e, withAttributes(respHeaders(tc.status, "", false, "content-type", "text/plain"),
			map[string]*structpb.Value{"response.code_details": structpb.NewStringValue(tc.details)}), "x")
		l := accessLine(t, &logs)
		if got := l["charged_prompt_tokens"] != 0.0; got != tc.charged {
			t.Errorf("%d %s: charged %v prompt tokens, want charged %v", tc.status, tc.details, l["charged_prompt_tokens"], tc.charged)
		}
	}
}

// TestRedirectCharge: a redirect, the engine's (its URL is not the API's address) or Envoy's
// own (a route's redirect action), costs the tenant nothing, as `kvroute serve` charges an
// engine's redirect nothing (nothing was computed). The prompt's estimate was charged (6
// tokens on a 307).
func TestRedirectCharge(t *testing.T) {
	for _, tc := range []struct {
		name  string
		attrs map[string]*structpb.Value
	}{
		{"engine", nil},
		{"envoy", map[string]*structpb.Value{"response.code_details": structpb.NewStringValue("direct_response")}},
	} {
		for _, status := range []int{301, 307, 308} {
			var logs testlog.Buffer
			f := tenantFixture(t, &logs, ep1)
			e, _ := f.routed(t, plainChat, "authorization", "Bearer sk-acme")
			head := respHeaders(status, "", false, "content-type", "application/json", "location", "http://10.0.0.1:8000/api/v1/chat/completions")
			if tc.attrs != nil {
				head = withAttributes(head, tc.attrs)
			}
			f.answer(t, e, head, jsonAnswer)
			l := accessLine(t, &logs)
			if l["status"] != float64(status) || l["charged_prompt_tokens"] != 0.0 || l["charged_completion_tokens"] != 0.0 {
				t.Errorf("%s's %d: access line status %v, charged %v prompt and %v completion tokens; want %d and nothing charged",
					tc.name, status, l["status"], l["charged_prompt_tokens"], l["charged_completion_tokens"], status)
			}
		}
	}
}
