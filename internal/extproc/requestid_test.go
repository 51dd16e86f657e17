package extproc

import (
	"net/http"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/testlog"
)

// TestRequestIDsWithTenants: with tenants the request's id is the router's, as `kvroute serve`
// makes it (docs/security.md, "Request ids"): the engine gets it as its x-request-id and the
// access line logs it as request_id, while the client's own id (rid-1, which another tenant
// may send as well) goes back to the client in the answer, routed or refused, and to the access
// line as client_request_id.
func TestRequestIDsWithTenants(t *testing.T) {
	t.Run("routed", func(t *testing.T) {
		var logs testlog.Buffer
		f := tenantFixture(t, &logs, ep1)
		e, r := f.routed(t, streamChat, "authorization", "Bearer sk-acme")
		set := mutation(r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		if !slices.Contains(set, "x-request-id: "+routerID) || slices.Contains(set, "x-request-id: rid-1") {
			t.Errorf("request header mutation %v: want the engine to get x-request-id %s, the router's, not the client's rid-1", set, routerID)
		}
		head := mutation(e.head("text/event-stream").GetResponseHeaders().GetResponse().GetHeaderMutation())
		if !slices.Contains(head, "x-request-id: rid-1") {
			t.Errorf("response header mutation %v: want the client's own x-request-id, rid-1, back", head)
		}
		e.send(respBody(event1+doneEvent, true))
		e.streamedBody(true)
		e.close()
		f.streamEnded(t)
		l := accessLine(t, &logs)
		if l["request_id"] != routerID || l["client_request_id"] != "rid-1" || l["status"] != 200.0 {
			t.Errorf("access line: request_id %v, client_request_id %v, status %v; want %s, rid-1, 200",
				l["request_id"], l["client_request_id"], l["status"], routerID)
		}
	})
	t.Run("refused", func(t *testing.T) {
		var logs testlog.Buffer
		f := tenantFixture(t, &logs, ep1)
		e := f.open(t, fullDuplex, fullDuplex)
		e.send(reqHeaders("/v1/chat/completions", false, "authorization", "Bearer sk-nobody"))
		status, _, hdr := e.immediate()
		if status != http.StatusUnauthorized || !slices.Contains(hdr, "x-request-id: rid-1") {
			t.Errorf("immediate answer %d with headers %v: want 401 with the client's x-request-id, rid-1", status, hdr)
		}
		e.close()
		f.streamEnded(t)
		l := accessLine(t, &logs)
		if l["request_id"] != routerID || l["client_request_id"] != "rid-1" {
			t.Errorf("access line: request_id %v, client_request_id %v; want %s and rid-1", l["request_id"], l["client_request_id"], routerID)
		}
	})
}
