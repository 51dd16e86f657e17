package h1

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestEmptyLinesBeforeRequest: up to 4 empty lines (CRLF, or a bare LF) before a request line
// are ignored, as RFC 9112 section 2.2 asks (some clients send a CRLF after a POST's body),
// after any request and before the first, on both servers; more, or a CR alone, get 400 and
// the connection's end.
func TestEmptyLinesBeforeRequest(t *testing.T) {
	var smuggled atomic.Int32
	const (
		post = "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
		get  = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
		last = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	)
	for _, srv := range bothServers(t, guard{body: 2 * time.Second}, echo(&smuggled)) {
		t.Run(srv.name, func(t *testing.T) {
			for _, tc := range []struct {
				name, req string
				want      []int
			}{
				{"CRLF after a POST's body", post + "\r\n" + post + "\r\n" + last, []int{200, 200, 200}},
				{"after a GET", get + "\r\n\r\n" + last, []int{200, 200}},
				{"bare LFs", post + "\n\n" + last, []int{200, 200}},
				{"before the first request", "\r\n" + last, []int{200}},
				{"four", post + strings.Repeat("\r\n", 4) + last, []int{200, 200}},
				{"five", post + strings.Repeat("\r\n", 5) + last, []int{200, 400}},
				{"five after a GET", get + strings.Repeat("\r\n", 5) + last, []int{200, 400}},
				{"a CR alone", post + "\r" + last, []int{200, 400}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					if diff := cmp.Diff(tc.want, responses(t, srv.addr, tc.req)); diff != "" {
						t.Errorf("statuses (-want +got):\n%s", diff)
					}
				})
			}
			t.Run("sent apart", func(t *testing.T) {
				// The CRLF comes alone, after the answer, as the connection waits for its next
				// request: a read of nothing but empty lines.
				c, br := dialBuffered(t, srv.addr)
				for i, s := range []string{post, "\r\n", "\r\n" + get} {
					if _, err := io.WriteString(c, s); err != nil {
						t.Fatal(err)
					}
					if s == "\r\n" {
						continue
					}
					status, _, body, err := readResponse(br)
					if err != nil || status != http.StatusOK {
						t.Fatalf("request %d: %d %q, %v; want 200", i, status, body, err)
					}
				}
			})
		})
	}
}
