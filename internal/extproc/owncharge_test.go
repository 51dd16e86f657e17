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
