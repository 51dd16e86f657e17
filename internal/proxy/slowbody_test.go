package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/tenant"
)

// readSignal tells on read, once, that the handler began to read the request's body.
type readSignal struct {
	io.ReadCloser
	read chan<- struct{}
	told bool
}

func (b *readSignal) Read(p []byte) (int, error) {
	if !b.told {
		b.told = true
		b.read <- struct{}{}
	}
	return b.ReadCloser.Read(p)
}

// TestSlowBodiesPerTenant: a tenant's request bodies being received are bounded (twice its
// max_concurrent, at least 4; a quarter of the connection cap): the QA's 300 slow bodies with
// one valid key held every connection of the API server, 100 of them a tenant whose
// max_concurrent is 2. The bodies past the bound are refused at once, 429 with Retry-After and
// the connection closed, counted under request_bodies; another tenant's requests are served
// meanwhile; once a body has come whole, the tenant's next body is taken again.
func TestSlowBodiesPerTenant(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenants string
		conns   int // Handler.MaxConnections
		bound   int
	}{
		{"max_concurrent 2", "{max_concurrent: 2}", 0, 4},
		{"a quarter of the connections", "{}", 24, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			f := newFixture(t, spec(e.srv.URL, "m"))
			f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, "tenants:\n"+
				"  - {name: slow, api_keys: [\""+tenant.HashKey("sk-slow")+"\"], limits: "+tc.tenants+"}\n"+
				"  - {name: other, api_keys: [\""+tenant.HashKey("sk-other")+"\"], limits: {max_concurrent: 2}}\n")
			f.h.MaxConnections = tc.conns
			read := make(chan struct{}, 16) // the requests beyond the slow ones are not waited on here
			f.inner = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = &readSignal{ReadCloser: r.Body, read: read}
				f.h.ServeHTTP(w, r)
			})
			body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
			conns := make([]net.Conn, tc.bound)
			for i := range conns {
				c, err := net.Dial("tcp", f.srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-slow\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
				select {
				case <-read: // its place taken, its body being read
				case <-time.After(10 * time.Second):
					t.Fatalf("body %d was never read", i+1)
				}
				conns[i] = c
			}
			resp, got := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-slow")
			if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" || !resp.Close ||
				errorCode(got) != "concurrency_limit_exceeded" || !strings.Contains(string(got), "request bodies being received") {
				t.Errorf("a body past the %d being received: %d, Retry-After %q, close %v, %s; want 429 concurrency_limit_exceeded, Retry-After 1, closed",
					tc.bound, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Close, got)
			}
			if n := testutil.ToFloat64(f.h.Metrics.Tenant.Rejections.WithLabelValues("slow", tenant.ReasonBodies)); n != 1 {
				t.Errorf("%v refusals counted under %s, want 1", n, tenant.ReasonBodies)
			}
			if resp, got := f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-other"); resp.StatusCode != http.StatusOK {
				t.Errorf("another tenant meanwhile: %d %s; want 200", resp.StatusCode, got)
			}
			// One body comes whole: its place is given back.
			c := conns[0]
			fmt.Fprint(c, body[10:])
			r, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			f.wait(t)
			if r.StatusCode != http.StatusOK {
				t.Fatalf("the slow body, once whole: %d; want 200", r.StatusCode)
			}
			resp, got = f.post(t, "/v1/chat/completions", body, "Authorization", "Bearer sk-slow")
			if resp.StatusCode != http.StatusOK {
				t.Errorf("the tenant's next body after one came whole: %d %s; want 200", resp.StatusCode, got)
			}
			for _, c := range conns {
				c.Close()
			}
			for range conns[1:] {
				f.wait(t) // the bodies cut short end their requests
			}
		})
	}
}

// TestMaxConnections: the connection cap that bounds a tenant's bodies is the handler's, else
// that of the h1.Server serving the request, else none.
func TestMaxConnections(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	onH1 := r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, &h1.Server{MaxConns: 300}))
	onNetHTTP := r.WithContext(context.WithValue(r.Context(), http.ServerContextKey, &http.Server{}))
	for _, tc := range []struct {
		name  string
		h     *Handler
		r     *http.Request
		conns int
	}{
		{"the handler's", &Handler{MaxConnections: 40}, onH1, 40},
		{"h1's", &Handler{}, onH1, 300},
		{"net/http's: unknown", &Handler{}, onNetHTTP, 0},
		{"no server", &Handler{}, r, 0},
	} {
		if got := tc.h.maxConnections(tc.r); got != tc.conns {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.conns)
		}
	}
}
