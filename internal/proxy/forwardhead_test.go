package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestForwardedHeadBounded: a request whose header fields the router would forward are more
// than maxForwardedFields or maxForwardedBytes is answered 431 and reaches no engine; before,
// the QA's 900 KB header and 10,004 headers reached the engine intact (uvicorn's h11 refuses
// a head past 16 KiB, hyper and Envoy past 100 fields). A head within the bounds is served,
// and the fields the router drops or replaces are not counted.
func TestForwardedHeadBounded(t *testing.T) {
	many := func(n int) []string {
		var h []string
		for i := range n {
			h = append(h, "X-Custom-"+strconv.Itoa(i), "v")
		}
		return h
	}
	for _, tc := range []struct {
		name string
		hdr  []string
		want int
	}{
		{"fields at the bound", many(maxForwardedFields - 1), http.StatusOK}, // and User-Agent
		{"one field more", many(maxForwardedFields), http.StatusRequestHeaderFieldsTooLarge},
		{"10,004 fields", many(10_004), http.StatusRequestHeaderFieldsTooLarge},
		{"a field of 16 KiB", []string{"X-Big", strings.Repeat("a", maxForwardedBytes)}, http.StatusRequestHeaderFieldsTooLarge},
		{"a field of 15 KiB", []string{"X-Big", strings.Repeat("a", 15<<10)}, http.StatusOK},
		{"forwarding fields, dropped", []string{"X-Forwarded-For", strings.Repeat("1.2.3.4, ", 2000)}, http.StatusOK},
		// Fields the Connection field names are removed before the engine (removeHopByHop):
		// not counted either.
		{"fields named in Connection, dropped", append(many(100), "Connection", connectionNaming(100)), http.StatusOK},
		{"a field of 16 KiB named in Connection", []string{"X-Big", strings.Repeat("a", maxForwardedBytes), "Connection", "keep-alive, x-big"}, http.StatusOK},
		{"fields beyond those named in Connection", append(many(maxForwardedFields+10), "Connection", connectionNaming(5)), http.StatusRequestHeaderFieldsTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			f := newFixture(t, spec(e.srv.URL, "m"))
			resp, body := f.post(t, "/v1/chat/completions", chatBody, tc.hdr...)
			if resp.StatusCode != tc.want {
				t.Fatalf("got %d %.300s; want %d", resp.StatusCode, body, tc.want)
			}
			if tc.want == http.StatusOK {
				return
			}
			if errorCode(body) != "request_header_fields_too_large" || !resp.Close {
				t.Errorf("got %s (close %v); want request_header_fields_too_large, the connection closed", body, resp.Close)
			}
			if n := len(e.received()); n != 0 {
				t.Errorf("the engine received %d requests, want none", n)
			}
		})
	}
}

// connectionNaming is a Connection field naming the first n fields of many (lower-case, as a
// client may write them).
func connectionNaming(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "x-custom-" + strconv.Itoa(i)
	}
	return strings.Join(names, ", ")
}
