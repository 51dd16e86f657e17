package app

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/h1"
)

// TestMaxConnsFor: the default connection cap keeps a quarter of the open files (at most 256)
// and takes half of the rest, 1 to maxConnsCeiling; an unknown limit gives the ceiling.
func TestMaxConnsFor(t *testing.T) {
	for nofile, want := range map[uint64]int{300: 112, 1024: 384, 4096: 1920, 65536: 16384, 1 << 20: 16384, 0: 16384, 2: 1, 1: 1} {
		if got := maxConnsFor(nofile); got != want {
			t.Errorf("maxConnsFor(%d) = %d, want %d", nofile, got, want)
		}
	}
}

// TestResolveLimits: server:'s limits as the API server gets them: given values as they are;
// unset, the connection cap from the open-file limit and the body bytes from GOMEMLIMIT (a
// quarter, at most 256 MiB, never below limits.max_body_bytes).
func TestResolveLimits(t *testing.T) {
	for _, tc := range []struct {
		server   string
		nofile   uint64
		memLimit int64
		want     apiLimits
	}{
		{"{}", 1024, math.MaxInt64, apiLimits{maxConns: 384, connsFrom: "RLIMIT_NOFILE 1024", pending: 256 << 20, bodyStall: 10 * time.Second, adminConns: 64,
			lingering: 48, adminLingering: 16}},
		{"{}", 0, 400 << 20, apiLimits{maxConns: 16384, connsFrom: "no open-file limit known", pending: 100 << 20, bodyStall: 10 * time.Second, adminConns: 64}},
		{"{}", 300, 32 << 20, apiLimits{maxConns: 112, connsFrom: "RLIMIT_NOFILE 300", pending: 16 << 20, bodyStall: 10 * time.Second, adminConns: 18,
			lingering: 15, adminLingering: 6}},
		{"{max_connections: 50, max_pending_body_bytes: 33554432, body_stall_timeout: 2s, admin_max_connections: 5}", 300, 32 << 20,
			apiLimits{maxConns: 50, connsFrom: "config", pending: 32 << 20, bodyStall: 2 * time.Second, adminConns: 5,
				lingering: 118, adminLingering: 40}},
	} {
		cfg, err := config.Parse([]byte("server: " + tc.server + "\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		got := resolveLimits(cfg, tc.nofile, tc.memLimit)
		tc.want.memoryLimit = tc.memLimit
		if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(apiLimits{})); diff != "" {
			t.Errorf("server %s, nofile %d, GOMEMLIMIT %d (-want +got):\n%s", tc.server, tc.nofile, tc.memLimit, diff)
		}
	}
}

// TestAdminConnsFor: the admin listener's default cap is a quarter of what maxConnsFor keeps
// aside, 4 to config.DefaultAdminMaxConnections; an unknown limit gives the default.
func TestAdminConnsFor(t *testing.T) {
	for nofile, want := range map[uint64]int{0: 64, 16: 4, 128: 8, 300: 18, 1024: 64, 1 << 20: 64} {
		if got := adminConnsFor(nofile); got != want {
			t.Errorf("adminConnsFor(%d) = %d, want %d", nofile, got, want)
		}
	}
}

// TestLingerBudgets: the refusals that may linger at the two listeners (each an open file)
// take no more than the files the caps leave, half of what maxConnsFor keeps aside staying for
// the rest: at a limit of 128 files, 6 and 2 of the 8 left (48 clients, 48 engine
// connections, 8 admin connections, 16 kept), where h1's own bound let 64 linger at each and
// took 128 files; at the limits of most hosts, h1's own bound (64 to 128, and 64).
func TestLingerBudgets(t *testing.T) {
	for _, tc := range []struct {
		nofile                 uint64
		maxConns, adminConns   int
		wantAPI, wantAdmin     int
		lingerAPI, lingerAdmin int // h1.MaxLingering of each
	}{
		{nofile: 128, wantAPI: 6, wantAdmin: 2, lingerAPI: 6, lingerAdmin: 2},
		{nofile: 300, wantAPI: 15, wantAdmin: 6, lingerAPI: 15, lingerAdmin: 6},
		{nofile: 1024, wantAPI: 48, wantAdmin: 16, lingerAPI: 48, lingerAdmin: 16},
		{nofile: 16, wantAPI: -1, wantAdmin: -1, lingerAPI: 0, lingerAdmin: 0},
		{nofile: 1 << 20, wantAPI: 761712, wantAdmin: 253904, lingerAPI: 128, lingerAdmin: 64},
		{nofile: math.MaxUint64, wantAPI: 786432, wantAdmin: 262144, lingerAPI: 128, lingerAdmin: 64},
		{nofile: 0, wantAPI: 0, wantAdmin: 0, lingerAPI: 128, lingerAdmin: 64},
		{nofile: 300, maxConns: 50, adminConns: 5, wantAPI: 118, wantAdmin: 40, lingerAPI: 64, lingerAdmin: 40},
		{nofile: 128, maxConns: 100, adminConns: 8, wantAPI: -1, wantAdmin: -1, lingerAPI: 0, lingerAdmin: 0},
	} {
		maxConns, adminConns := tc.maxConns, tc.adminConns
		if maxConns == 0 {
			maxConns, adminConns = maxConnsFor(tc.nofile), adminConnsFor(tc.nofile)
		}
		api, admin := lingerBudgets(tc.nofile, maxConns, adminConns)
		if api != tc.wantAPI || admin != tc.wantAdmin {
			t.Errorf("lingerBudgets(%d, %d, %d) = %d, %d; want %d, %d", tc.nofile, maxConns, adminConns, api, admin, tc.wantAPI, tc.wantAdmin)
		}
		la, lb := h1.MaxLingering(maxConns, api), h1.MaxLingering(adminConns, admin)
		if la != tc.lingerAPI || lb != tc.lingerAdmin {
			t.Errorf("nofile %d: %d and %d refusals linger; want %d and %d", tc.nofile, la, lb, tc.lingerAPI, tc.lingerAdmin)
		}
		if tc.nofile == 0 {
			continue
		}
		n := int(min(tc.nofile, 1<<40))
		left := max(n-min(n/4, 256)/2-2*maxConns-adminConns, 0)
		if la+lb > left {
			t.Errorf("nofile %d (caps %d and %d): %d + %d refusals may linger, beyond the %d files left", tc.nofile, maxConns, adminConns, la, lb, left)
		}
	}
}

// TestServeLimits: the API server `kvroute serve` runs, either kind, closes the longest-idle
// connection at server.max_connections for a new one, ends the connection of a request answered
// 401, and exports its counts on the admin listener.
func TestServeLimits(t *testing.T) {
	for _, httpServer := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(httpServer, func(t *testing.T) { testServeLimits(t, httpServer) })
	}
}

func testServeLimits(t *testing.T, httpServer string) {
	e := newFakeEngine(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	// "foo" is the key of acme.
	extra := fmt.Sprintf(`auth: {mode: api_key, secret_file: %q}
tenants:
  - name: acme
    api_keys: [sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae]
`, secret)
	cfg := routerConfig(t, extra, e.srv.URL)
	cfg.Server.HTTPServer = httpServer
	cfg.Server.MaxConnections = 2
	cfg.Server.MaxPendingBodyBytes = 64 << 20
	apiLn, adminLn := serveLoopback(t, cfg)

	type conn struct {
		nc net.Conn
		br *bufio.Reader
	}
	dial := func() conn {
		nc, err := net.Dial("tcp", apiLn.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		return conn{nc, bufio.NewReader(nc)}
	}
	models := func(c conn, key string) *http.Response {
		t.Helper()
		auth := ""
		if key != "" {
			auth = "Authorization: Bearer " + key + "\r\n"
		}
		if _, err := io.WriteString(c.nc, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"+auth+"\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	closed := func(c conn) bool {
		_, err := c.br.ReadByte()
		return err == io.EOF || err != nil && strings.Contains(err.Error(), "reset")
	}

	// A 401 ends its connection.
	c := dial()
	if resp := models(c, ""); resp.StatusCode != http.StatusUnauthorized || !closed(c) {
		t.Errorf("without a key: %d (Connection: close %v), the connection still open; want 401 and closed", resp.StatusCode, resp.Close)
	}
	// The server counts it until its goroutine has closed it, a moment after the client saw
	// the close: counted still, it made the cap close one of the next two before its request.
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err := http.Get("http://" + adminLn.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "kvroute_server_connections 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the closed connection is still counted after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Two kept-alive connections, then a third: the first one, idle longest, is closed for it.
	a, b := dial(), dial()
	for _, c := range []conn{a, b} {
		if resp := models(c, "foo"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		<-time.After(20 * time.Millisecond) // turned idle one after the other
	}
	if resp := models(dial(), "foo"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the third connection: status %d", resp.StatusCode)
	}
	if !closed(a) {
		t.Error("the longest-idle connection is still open")
	}
	if resp := models(b, "foo"); resp.StatusCode != http.StatusOK {
		t.Errorf("the other idle connection: status %d, want 200", resp.StatusCode)
	}
	resp, err := http.Get("http://" + adminLn.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"kvroute_server_connections 2", "kvroute_server_max_connections 2",
		`kvroute_server_connections_dropped_total{reason="idle_closed"} 1`, `kvroute_server_connections_dropped_total{reason="refused"} 0`,
		"kvroute_server_pending_body_bytes 0", "kvroute_server_max_pending_body_bytes 6.7108864e+07", "kvroute_server_body_refusals_total 0",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestServeAdminConnectionCap: the admin listener has a connection cap of its own
// (server.admin_max_connections), apart from the API listener's (server.max_connections),
// both ways:
//
//  1. a flood of connections to the admin listener that send nothing leaves at most the cap
//     open (those over it refused; the ones held give way to a new connection once they have
//     waited a second, h1's grace for a request on its way), and the API and a new /metrics
//     connection still answer;
//  2. the API listener at its cap, every connection with a request in flight and a new one
//     refused, leaves /metrics and /readyz answering.
//
// Before, the admin listener held every connection opened to it: under a low open-file limit
// they took the files the API listener needed to accept.
func TestServeAdminConnectionCap(t *testing.T) {
	arrived, release := make(chan struct{}, 16), make(chan struct{})
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			return // health checks
		}
		_, _ = io.Copy(io.Discard, req.Body)
		arrived <- struct{}{}
		select {
		case <-release:
		case <-req.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(eng.Close)
	cfg := routerConfig(t, "", eng.URL)
	cfg.Server.MaxConnections = 3
	cfg.Server.AdminMaxConnections = 4
	noDelay := config.Duration(0)
	cfg.Server.DrainDelay = &noDelay // /readyz is asked: no wait at the end
	// Connections that send nothing are closed by the cap, not by this timeout.
	cfg.Server.ReadHeaderTimeout = config.Duration(time.Minute)
	s := serve(t, cfg, nil)
	t.Cleanup(func() { close(release) }) // before Serve's cleanup drains the requests held
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	fetch := func(url string) (int, string) {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// 1. 20 admin connections that send nothing: 16 refused, 4 held.
	floodStart := time.Now()
	var flood []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.admin, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		flood = append(flood, c)
	}
	closedConns := make([]bool, len(flood))
	countClosed := func() int {
		n := 0
		for i, c := range flood {
			if !closedConns[i] {
				_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
				var b [512]byte // a refusal's 503, then its end
				_, err := c.Read(b[:])
				closedConns[i] = err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
			}
			if closedConns[i] {
				n++
			}
		}
		return n
	}
	waitUntil(t, "16 of 20 idle admin connections closed at admin_max_connections 4", func() bool { return countClosed() >= 16 })
	// The 4 held give way once they have waited a second (a younger one's request may be on
	// its way): a new /metrics connection then closes one.
	waitUntil(t, "the held connections past their grace", func() bool { return time.Since(floodStart) > 1100*time.Millisecond })
	if code, body := fetch(s.api + "/v1/models"); code != http.StatusOK {
		t.Errorf("the API during the admin flood: %d %s", code, body)
	}
	code, body := fetch(s.admin + "/metrics")
	if code != http.StatusOK || !strings.Contains(body, "kvroute_admin_max_connections 4\n") {
		t.Errorf("/metrics during the admin flood: %d, want 200 with kvroute_admin_max_connections 4", code)
	}
	evicted := -1 // absent
	if m := regexp.MustCompile(`kvroute_admin_connections_dropped_total\{reason="idle_closed"\} (\d+)\n`).FindStringSubmatch(body); m != nil {
		evicted, _ = strconv.Atoi(m[1])
	}
	refused := -1
	if m := regexp.MustCompile(`kvroute_admin_connections_dropped_total\{reason="refused"\} (\d+)\n`).FindStringSubmatch(body); m != nil {
		refused, _ = strconv.Atoi(m[1])
	}
	if evicted < 1 || refused < 16 {
		t.Errorf("/metrics: kvroute_admin_connections_dropped_total idle_closed %d, refused %d (-1: absent); want 1 and 16 at least", evicted, refused)
	}
	for _, c := range flood {
		c.Close()
	}

	// 2. The API at its cap with 3 requests in flight; a 4th connection is refused.
	type result struct {
		code int
		err  error
	}
	results := make(chan result, 4)
	for range 3 {
		go func() {
			resp, err := client.Post(s.api+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
			if err != nil {
				results <- result{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results <- result{code: resp.StatusCode}
		}()
	}
	for i := range 3 {
		select {
		case <-arrived:
		case r := <-results:
			t.Fatalf("request %d ended before the engine held it: %+v", i, r)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 3 requests reached the engine within 10s", i)
		}
	}
	// Refused: a 503, or a reset, which h1 may send instead when it closes the connection with
	// the request unread; counted either way (below).
	if resp, err := client.Get(s.api + "/v1/models"); err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("a 4th API connection with 3 requests in flight at max_connections 3: %d, want 503", resp.StatusCode)
		}
		// An overload to retry, as the proxy's own 503s say it (it said invalid_request_error).
		if rerr == nil && (!strings.Contains(string(b), `"type":"service_unavailable_error"`) || !strings.Contains(string(b), `"code":"overloaded"`)) {
			t.Errorf("the 503 at max_connections: body %s, want type service_unavailable_error, code overloaded", b)
		}
	}
	if code, body := fetch(s.admin + "/metrics"); code != http.StatusOK || !strings.Contains(body, `kvroute_server_connections_dropped_total{reason="refused"} 1`) {
		t.Errorf("/metrics with the API at its cap: %d, want 200 with one API connection refused", code)
	}
	if code, body := fetch(s.admin + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with the API at its cap: %d %s", code, body)
	}
}

// TestServeRefusalsCounted: what the API server, either kind, refuses before the router sees
// it is exported by reason in kvroute_server_request_refusals_total, every reason at 0 from
// the start (and the admin listener's in kvroute_admin_request_refusals_total): HTTP/2's
// preface, a request line that does not parse, a head too large, a head too slow. Before,
// none of them showed in /metrics, nor in the access log.
func TestServeRefusalsCounted(t *testing.T) {
	for _, httpServer := range []string{config.HTTPServerBuiltin, config.HTTPServerNetHTTP} {
		t.Run(httpServer, func(t *testing.T) { testServeRefusals(t, httpServer) })
	}
}

func testServeRefusals(t *testing.T, httpServer string) {
	e := newFakeEngine(t)
	cfg := routerConfig(t, "", e.srv.URL)
	cfg.Server.HTTPServer = httpServer
	// Long enough for the 1 MiB head below to arrive under the race detector on a loaded machine.
	cfg.Server.ReadHeaderTimeout = config.Duration(2 * time.Second)
	apiLn, adminLn := serveLoopback(t, cfg)
	scrape := func() string {
		t.Helper()
		resp, err := http.Get("http://" + adminLn.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	refusals := func(body, name string) map[string]string {
		out := map[string]string{}
		for _, l := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(l, name+`{reason="`); ok {
				reason, v, _ := strings.Cut(rest, `"} `)
				out[reason] = v
			}
		}
		return out
	}
	zero := map[string]string{}
	for _, r := range h1.Refusals {
		zero[r.String()] = "0"
	}
	body := scrape()
	if diff := cmp.Diff(zero, refusals(body, "kvroute_server_request_refusals_total")); diff != "" {
		t.Errorf("API refusals at start (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(zero, refusals(body, "kvroute_admin_request_refusals_total")); diff != "" {
		t.Errorf("admin refusals at start (-want +got):\n%s", diff)
	}

	sent := []string{
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"NOT A REQUEST LINE\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 1<<20+8192) + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ", // and nothing more
	}
	done := make(chan struct{}, len(sent))
	for _, req := range sent { // at once: the slow head waits for the timeout
		go func() {
			defer func() { done <- struct{}{} }()
			nc, err := net.Dial("tcp", apiLn.Addr().String())
			if err != nil {
				t.Error(err)
				return
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			wrote := make(chan struct{})
			go func() { defer close(wrote); _, _ = io.WriteString(nc, req) }() // a large head is not read whole
			if _, err := io.Copy(io.Discard, nc); err != nil && !strings.Contains(err.Error(), "reset") {
				t.Errorf("%.20q: the server did not close the connection: %v", req, err)
			}
			nc.Close()
			<-wrote
		}()
	}
	for range sent {
		<-done
	}
	want := maps.Clone(zero)
	for _, r := range []string{"http2_preface", "malformed", "head_too_large", "head_timeout"} {
		want[r] = "1"
	}
	// The last is counted on the server's goroutine, maybe after the client saw the close.
	for deadline := time.Now().Add(5 * time.Second); ; {
		got := refusals(scrape(), "kvroute_server_request_refusals_total")
		if cmp.Equal(want, got) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("API refusals (-want +got):\n%s", cmp.Diff(want, got))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serveLoopback builds a router of cfg and serves it on loopback listeners of its own until
// the test ends (then it waits for Serve to return, 15 s at most).
func serveLoopback(t *testing.T, cfg *config.Config) (api, admin net.Listener) {
	t.Helper()
	r, err := NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	api, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		api.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- r.Serve(ctx, api, admin) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(15 * time.Second):
			t.Error("Serve did not return")
		}
	})
	return api, admin
}
