package app

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAPIErrorBody: the answers the API server makes itself carry the type and code that the
// proxy gives its own answers of the same status: a connection refused at
// server.max_connections is an overload to retry (service_unavailable_error, overloaded), not
// the client's invalid request, which it was for every status before.
func TestAPIErrorBody(t *testing.T) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	code := func(s string) *string { return &s }
	for _, tc := range []struct {
		status int
		want   body
	}{
		// What h1 answers itself: a malformed head, a head too large, Expect, HTTP/2 without
		// a handler, a connection refused at the cap.
		{http.StatusBadRequest, body{Type: "invalid_request_error"}},
		{http.StatusExpectationFailed, body{Type: "invalid_request_error"}},
		{http.StatusRequestHeaderFieldsTooLarge, body{Type: "invalid_request_error", Code: code("request_too_large")}},
		{http.StatusHTTPVersionNotSupported, body{Type: "server_error"}},
		{http.StatusServiceUnavailable, body{Type: "service_unavailable_error", Code: code("overloaded")}},
		// And what it may come to answer: as the proxy answers them.
		{http.StatusRequestTimeout, body{Type: "invalid_request_error", Code: code("request_timeout")}},
		{http.StatusRequestEntityTooLarge, body{Type: "invalid_request_error", Code: code("request_too_large")}},
		{http.StatusTooManyRequests, body{Type: "rate_limit_error", Code: code("rate_limited")}},
		{http.StatusInternalServerError, body{Type: "server_error"}},
	} {
		ctype, b := apiErrorBody(tc.status, "why")
		var got struct {
			Error body `json:"error"`
		}
		if err := json.Unmarshal(b, &got); err != nil || ctype != "application/json" {
			t.Errorf("%d: %s %q: %v", tc.status, ctype, b, err)
			continue
		}
		tc.want.Message = "why"
		if diff := cmp.Diff(tc.want, got.Error); diff != "" {
			t.Errorf("%d: body (-want +got):\n%s", tc.status, diff)
		}
	}
}
