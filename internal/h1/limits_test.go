package h1

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/testcert"
)

// limits are the settings of this file's tests, given to both servers.
type limits struct {
	bodyTimeout, bodyStall time.Duration
	rate, pending          int64
	maxConns, maxLingering int
	close401               bool
}

// limitedServer is one of the two servers under test, with what the tests look at inside it.
type limitedServer struct {
	name  string
	addr  string
	stats func() Stats
	// idle reports whether the connection from the client address remote waits for a
	// request, kept alive.
	idle func(remote string) bool
	// waiting is the number of body reads waiting for room in the budget.
	waiting func() int
	// open reports whether the server still has the connection from the client address
	// remote: it forgets one after closing it.
	open func(remote string) bool
	// lingering is the number of lingering slots taken (refusals, connections parted from).
	lingering func() int32
}

// limitedServers serves h with Server and with NetHTTP, both set to lim.
func limitedServers(t *testing.T, lim limits, h http.Handler) []limitedServer {
	t.Helper()
	s := &Server{BodyReadTimeout: lim.bodyTimeout, BodyMinRate: lim.rate, BodyStallTimeout: lim.bodyStall,
		MaxPendingBodyBytes: lim.pending, MaxConns: lim.maxConns, MaxLingering: lim.maxLingering, CloseUnauthorized: lim.close401,
		ErrorBody: jsonError}
	n := &NetHTTP{BodyReadTimeout: lim.bodyTimeout, BodyMinRate: lim.rate, BodyStallTimeout: lim.bodyStall,
		MaxPendingBodyBytes: lim.pending, MaxConns: lim.maxConns, MaxLingering: lim.maxLingering, CloseUnauthorized: lim.close401,
		ErrorBody: jsonError}
	waiting := func(b *budget) func() int {
		return func() int {
			if b == nil {
				return 0
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiters)
		}
	}
	hs := limitedServer{name: "h1", addr: startServer(t, s, h), stats: s.Stats,
		idle: func(remote string) bool {
			c := s.connOf(remote)
			return c != nil && c.state.Load() == stateIdle
		},
	}
	hs.waiting = func() int { return waiting(s.budget)() }
	hs.open = func(remote string) bool { return s.connOf(remote) != nil }
	hs.lingering = s.refusals.lingering.Load
	ns := limitedServer{name: "net/http", addr: startNetHTTP(t, n, h), stats: n.Stats,
		idle: func(remote string) bool {
			n.table.mu.Lock()
			defer n.table.mu.Unlock()
			for c, x := range n.table.conns {
				if c.RemoteAddr().String() == remote {
					return x.state == http.StateIdle
				}
			}
			return false
		},
	}
	ns.waiting = func() int { return waiting(n.budget)() }
	ns.open = func(remote string) bool { return n.connOf(remote) != nil }
	ns.lingering = n.refusals.lingering.Load
	return []limitedServer{hs, ns}
}

// eventually polls cond every 5 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		<-time.After(5 * time.Millisecond)
	}
	t.Fatalf("%s: not after 5 s", what)
}

// client is a raw connection to a server under test, with a 5 s deadline, closed at the end of
// the test.
type client struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func dialClient(t *testing.T, addr string) *client {
	t.Helper()
	nc, br := dialBuffered(t, addr)
	return &client{t: t, nc: nc, br: br}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s); err != nil {
		c.t.Fatalf("writing: %v", err)
	}
}

// answer reads a response: its status, Retry-After and body; status 0 when none came.
func (c *client) answer() (status int, retry, body string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// get sends a GET for path and reads its answer's status.
func (c *client) get(path string) int {
	c.t.Helper()
	c.send("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")
	status, _, _ := c.answer()
	return status
}

// closed reports whether the server has closed the connection (reads it to its end).
func (c *client) closed() bool {
	_, err := c.br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

func (c *client) remote() string { return c.nc.LocalAddr().String() }

// TestMaxConnsClosesIdleFirst: at MaxConns, a new connection closes the longest-idle kept-alive
// connection and is served; when every connection is busy, a new one is answered 503 with
// Retry-After and closed, and the busy ones are served to their end.
func TestMaxConnsClosesIdleFirst(t *testing.T) {
	block := make(chan struct{})
	entered := make(chan struct{}, 8)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			entered <- struct{}{}
			select {
			case <-block:
			case <-time.After(5 * time.Second):
			}
		}
		_, _ = io.WriteString(w, "ok")
	})
	for _, srv := range limitedServers(t, limits{maxConns: 3}, h) {
		t.Run(srv.name, func(t *testing.T) {
			var cs []*client
			for i := range 3 {
				c := dialClient(t, srv.addr)
				if s := c.get("/"); s != http.StatusOK {
					t.Fatalf("connection %d: status %d", i, s)
				}
				eventually(t, fmt.Sprintf("connection %d idle", i), func() bool { return srv.idle(c.remote()) })
				cs = append(cs, c)
			}
			c4 := dialClient(t, srv.addr)
			if s := c4.get("/"); s != http.StatusOK {
				t.Fatalf("the connection over the cap: status %d, want 200 (an idle one closed for it)", s)
			}
			if !cs[0].closed() {
				t.Error("the longest-idle connection is still open")
			}
			for i, c := range cs[1:] {
				if s := c.get("/"); s != http.StatusOK {
					t.Errorf("connection %d (idle, not the longest): status %d, want 200", i+1, s)
				}
			}
			// Every connection busy: the next one is refused.
			busy := []*client{cs[1], cs[2], c4}
			for _, c := range busy {
				c.send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
			}
			for range busy {
				select {
				case <-entered:
				case <-time.After(5 * time.Second):
					t.Fatal("the blocking requests did not start")
				}
			}
			c5 := dialClient(t, srv.addr)
			status, retry, _ := c5.answer()
			if status != http.StatusServiceUnavailable || retry != "1" || !c5.closed() {
				t.Errorf("a connection with every other one busy: status %d, Retry-After %q; want 503, 1 and closed", status, retry)
			}
			for range busy {
				select {
				case block <- struct{}{}:
				case <-time.After(5 * time.Second):
					t.Fatal("the blocking requests ended on their own")
				}
			}
			for i, c := range busy {
				if s, _, b := c.answer(); s != http.StatusOK || b != "ok" {
					t.Errorf("busy connection %d: %d %q, want 200 ok", i, s, b)
				}
			}
			st := srv.stats()
			if diff := cmp.Diff(Stats{Conns: 3, ConnsEvicted: 1, ConnsRefused: 1}, st); diff != "" {
				t.Errorf("stats (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOldestOrder: the connections closed to make room are the idle ones before those that
// have sent nothing yet, each kind oldest first, as many as asked.
func TestOldestOrder(t *testing.T) {
	o := oldest[string]{n: 3}
	for _, c := range []struct {
		name  string
		fresh bool
		since int64
	}{{"new-1", true, 1}, {"idle-5", false, 5}, {"idle-9", false, 9}, {"new-0", true, 0}, {"idle-7", false, 7}, {"idle-8", false, 8}} {
		o.offer(c.name, c.fresh, c.since)
	}
	var got []string
	for _, k := range o.keep {
		got = append(got, k.c)
	}
	if diff := cmp.Diff([]string{"idle-5", "idle-7", "idle-8"}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	o = oldest[string]{n: 2}
	o.offer("new-3", true, 3)
	o.offer("idle-9", false, 9)
	o.offer("new-1", true, 1)
	got = got[:0]
	for _, k := range o.keep {
		got = append(got, k.c)
	}
	if diff := cmp.Diff([]string{"idle-9", "new-1"}, got); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
}

// TestEvictionSkipsArrivingRequest: a kept-alive connection whose next request is already in
// the socket is not closed to make room: the new connection is refused instead.
func TestEvictionSkipsArrivingRequest(t *testing.T) {
	s := &Server{MaxConns: 1, ErrorBody: jsonError}
	s.idleHook = func() { <-time.After(300 * time.Millisecond) } // idle, but slow to read its next request
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	c := dialClient(t, addr)
	if st := c.get("/"); st != http.StatusOK {
		t.Fatalf("status %d", st)
	}
	eventually(t, "idle", func() bool {
		x := s.connOf(c.remote())
		return x != nil && x.state.Load() == stateIdle
	})
	c.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
	eventually(t, "the request in the socket", func() bool { return pending(s.connOf(c.remote()).rwc) })
	c2 := dialClient(t, addr)
	if st, _, _ := c2.answer(); st != http.StatusServiceUnavailable {
		t.Errorf("new connection: status %d, want 503", st)
	}
	if st, _, b := c.answer(); st != http.StatusOK || b != "ok" {
		t.Errorf("the arriving request: %d %q, want 200 ok", st, b)
	}
}

// TestUnauthorizedCloses: a 401 ends its connection (Connection: close); other answers keep it.
func TestUnauthorizedCloses(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/401" {
			http.Error(w, "no key", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	for _, srv := range limitedServers(t, limits{close401: true}, h) {
		t.Run(srv.name, func(t *testing.T) {
			c := dialClient(t, srv.addr)
			if s := c.get("/"); s != http.StatusOK {
				t.Fatalf("status %d", s)
			}
			if s := c.get("/"); s != http.StatusOK {
				t.Fatalf("a second request on the connection: status %d", s)
			}
			c.send("GET /401 HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || !resp.Close || !c.closed() {
				t.Errorf("status %d, Connection: close %v; want 401 and the connection closed", resp.StatusCode, resp.Close)
			}
			// With a body the handler did not read, still coming: a client that writes its
			// whole request before it reads (as most do) reads its 401 rather than a reset.
			for range 3 {
				c := dialClient(t, srv.addr)
				c.send("POST /401 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + strings.Repeat("a", 1_000_000))
				status, _, _ := c.answer()
				if status != http.StatusUnauthorized || !c.closed() {
					t.Fatalf("a 401 before the body's end: status %d; want 401, then the connection closed", status)
				}
			}
		})
	}
}

// bodyHandler reads the body and answers its length; a read that timed out gets 408, one
// refused for the budget 503, another error 400. With ?pause, it stops reading for 600 ms
// after the first 10 KB.
func bodyHandler(w http.ResponseWriter, r *http.Request) {
	var n int64
	var err error
	if r.URL.RawQuery == "pause" {
		n, err = io.CopyN(io.Discard, r.Body, 10_000)
		<-time.After(600 * time.Millisecond)
	}
	if err == nil {
		var m int64
		m, err = io.Copy(io.Discard, r.Body)
		n += m
	}
	switch {
	case errors.Is(err, ErrBodyReadTimeout):
		http.Error(w, "too slow", http.StatusRequestTimeout)
	case errors.Is(err, ErrBodyMemory):
		http.Error(w, "busy", http.StatusServiceUnavailable)
	case err != nil:
		http.Error(w, err.Error(), http.StatusBadRequest)
	default:
		_, _ = fmt.Fprintf(w, "ok %d", n)
	}
}

// writeSlowly writes n bytes in pieces of size every gap, in the background, until the test
// ends or a write fails; at most 1000 pieces.
func writeSlowly(t *testing.T, c net.Conn, n, size int, gap time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		piece := strings.Repeat("b", size)
		for i := 0; i < 1000 && n > 0; i++ {
			select {
			case <-stop:
				return
			case <-time.After(gap):
			}
			k := min(n, size)
			if _, err := io.WriteString(c, piece[:k]); err != nil {
				return
			}
			n -= k
		}
	}()
}

// TestBodyStall: a body that sends a large part at once and then stops, or trickles, is cut
// once BodyStallTimeout passes without progress, however much time its bytes earned under
// BodyReadTimeout and BodyMinRate; a body sent at a fair pace for longer than the stall bound,
// and one whose handler stops reading it for longer, are read whole.
func TestBodyStall(t *testing.T) {
	const stall = 300 * time.Millisecond
	// 60 KB at once earn 5 s + 6 s under the rate: only the stall bound cuts them sooner.
	lim := limits{bodyTimeout: 5 * time.Second, rate: 10_000, bodyStall: stall}
	for _, srv := range limitedServers(t, lim, http.HandlerFunc(bodyHandler)) {
		t.Run(srv.name, func(t *testing.T) {
			burst := "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("a", 60_000)
			for _, tc := range []struct {
				name   string
				then   func(c net.Conn)
				status int
			}{
				{"burst then stall", func(net.Conn) {}, http.StatusRequestTimeout},
				// A byte every 50 ms: less than a second's worth of the rate per stall.
				{"burst then trickle", func(c net.Conn) { writeSlowly(t, c, 40_000, 1, 50*time.Millisecond) }, http.StatusRequestTimeout},
			} {
				t.Run(tc.name, func(t *testing.T) {
					c := dialClient(t, srv.addr)
					t0 := time.Now()
					c.send(burst)
					tc.then(c.nc)
					status, _, _ := c.answer()
					took := time.Since(t0)
					if status != tc.status || !c.closed() {
						t.Errorf("status %d; want %d and the connection closed", status, tc.status)
					}
					if took < stall*7/8 || took > stall+time.Second {
						t.Errorf("answered after %v; want %v to %v", took, stall*7/8, stall+time.Second)
					}
				})
			}
			t.Run("fair pace", func(t *testing.T) {
				// 100 KB at 100 KB/s: 10 KB (the rate's second) every 100 ms, for a second.
				c := dialClient(t, srv.addr)
				c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
				writeSlowly(t, c.nc, 100_000, 5_000, 50*time.Millisecond)
				if status, _, b := c.answer(); status != http.StatusOK || b != "ok 100000" {
					t.Errorf("got %d %q; want 200 ok 100000", status, b)
				}
			})
			t.Run("handler away", func(t *testing.T) {
				c := dialClient(t, srv.addr)
				c.send("POST /?pause HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\n" + strings.Repeat("a", 50_000))
				if status, _, b := c.answer(); status != http.StatusOK || b != "ok 50000" {
					t.Errorf("got %d %q; want 200 ok 50000", status, b)
				}
			})
		})
	}
}

// TestBodyBudget: with the bytes of the bodies being received at MaxPendingBodyBytes, a new
// body waits for room: it is read once another body ends within a second, and refused (503,
// Retry-After: 1, connection closed) when none does; the bytes are given back at each body's
// end.
func TestBodyBudget(t *testing.T) {
	const budget = 300_000
	for _, srv := range limitedServers(t, limits{pending: budget}, http.HandlerFunc(bodyHandler)) {
		t.Run(srv.name, func(t *testing.T) {
			body := strings.Repeat("a", 200_000)
			head := "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"
			a := dialClient(t, srv.addr)
			a.send(head + body[:100_000])
			eventually(t, "the first body held", func() bool { return srv.stats().BodyBytes == 200_000 })

			b := dialClient(t, srv.addr)
			t0 := time.Now()
			go func() { _, _ = io.WriteString(b.nc, head+body) }()
			status, retry, _ := b.answer()
			if status != http.StatusServiceUnavailable || retry != "1" || !b.closed() {
				t.Errorf("a body beyond the budget: status %d, Retry-After %q; want 503, 1 and the connection closed", status, retry)
			}
			if d := time.Since(t0); d < budgetWait*7/8 || d > budgetWait+2*time.Second {
				t.Errorf("refused after %v; want about %v (the wait for room)", d, budgetWait)
			}

			c := dialClient(t, srv.addr)
			go func() { _, _ = io.WriteString(c.nc, head+body) }()
			eventually(t, "the third body waiting", func() bool { return srv.waiting() == 1 })
			a.send(body[100_000:])
			if status, _, got := a.answer(); status != http.StatusOK || got != "ok 200000" {
				t.Errorf("the first body: %d %q; want 200 ok 200000", status, got)
			}
			if status, _, got := c.answer(); status != http.StatusOK || got != "ok 200000" {
				t.Errorf("the body that waited for room: %d %q; want 200 ok 200000", status, got)
			}
			st := srv.stats()
			if st.BodyBytes != 0 || st.BodiesRefused != 1 {
				t.Errorf("body bytes %d, refused %d; want 0 and 1", st.BodyBytes, st.BodiesRefused)
			}
		})
	}
}

// TestBudget: grants in order of arrival, waits bounded, a request larger than the whole budget
// served alone.
func TestBudget(t *testing.T) {
	b := newBudget(100)
	if !b.acquire(60, 0) || !b.acquire(40, 0) {
		t.Fatal("the budget's room refused")
	}
	if b.acquire(1, 10*time.Millisecond) {
		t.Fatal("a byte beyond the budget granted")
	}
	var wg sync.WaitGroup
	got := make(chan int64, 2)
	for _, n := range []int64{50, 20} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.acquire(n, 5*time.Second) {
				got <- n
			}
		}()
		eventually(t, "waiting", func() bool {
			b.mu.Lock()
			defer b.mu.Unlock()
			return len(b.waiters) >= 1 && b.waiters[len(b.waiters)-1].n == n
		})
	}
	b.release(40) // 40 free: the first waiter (50) does not fit, and the second waits behind it
	select {
	case n := <-got:
		t.Fatalf("%d granted out of turn", n)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(60)
	wg.Wait()
	if b.held() != 70 {
		t.Errorf("held %d, want 70", b.held())
	}
	b.release(70)
	if !b.acquire(500, 0) { // alone: larger than the budget, granted
		t.Error("a request larger than the budget refused with the budget empty")
	}
	if b.refused.Load() != 1 {
		t.Errorf("refused %d, want 1", b.refused.Load())
	}
}

// TestHeadAtLimit: a head that reaches the limit is answered 431 whatever byte the limit falls
// on, and a head the parser refuses is answered 400 without any of its lines (which may carry
// a credential).
func TestHeadAtLimit(t *testing.T) {
	s := &Server{MaxHeaderBytes: 4096, ErrorBody: jsonError}
	addr := startServer(t, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	limit := 4096 + 4096 // what the server reads of a head
	for n := limit - 24; n <= limit+24; n++ {
		start := "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-P0: "
		pad := n - len(start) - len("\r\n\r\n")
		got := rawExchange(t, addr, start+strings.Repeat("a", pad)+"\r\n\r\n")
		status, _, _ := strings.Cut(got, "\r\n")
		if status != "HTTP/1.1 200 OK" && status != "HTTP/1.1 431 Request Header Fields Too Large" {
			t.Errorf("a head of %d bytes: %q; want 200 or 431", n, status)
		}
		if strings.Contains(got, "aaaaaaaa") {
			t.Errorf("a head of %d bytes: the answer (%d bytes) quotes the request", n, len(got))
		}
	}
	got := rawExchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\nAuthorization Bearer sk-secret-1234\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 400 ") || strings.Contains(got, "sk-secret") {
		t.Errorf("a header line without a colon: %q; want 400 without the line", got)
	}
	if !strings.Contains(got, "malformed MIME header") {
		t.Errorf("a header line without a colon: %q; want the parser's reason", got)
	}
}

// TestBodyHoldGrowth: what a body holds of the budget: its whole announced length at once when
// that is at most 1 MiB, else steps of 256 KiB ahead of its bytes (an announced 16 MiB with a
// byte sent holds 256 KiB), never more than the announced length; given back whole.
func TestBodyHoldGrowth(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length int64
		reads  [][2]int64 // bytes read before, next read's buffer
		want   []int64    // held after each
	}{
		{"short", 200_000, [][2]int64{{0, 512}, {512, 100_000}}, []int64{200_000, 200_000}},
		{"1 MiB", 1 << 20, [][2]int64{{0, 512}}, []int64{1 << 20}},
		{"long", 16 << 20, [][2]int64{{0, 32 << 10}, {200 << 10, 64 << 10}, {300 << 10, 1 << 20}, {(16 << 20) - 10, 64 << 10}},
			[]int64{256 << 10, 512 << 10, (300 << 10) + (1 << 20), 16 << 20}},
		{"chunked", -1, [][2]int64{{0, 100}, {256 << 10, 1}}, []int64{256 << 10, 512 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBudget(64 << 20)
			h := bodyHold{b: b, length: tc.length}
			var got []int64
			for _, r := range tc.reads {
				if !h.cover(r[0], int(r[1])) {
					t.Fatal("refused")
				}
				got = append(got, b.held())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("held (-want +got):\n%s", diff)
			}
			h.drop()
			if b.held() != 0 {
				t.Errorf("held %d after drop, want 0", b.held())
			}
		})
	}
}

// TestBodyHoldAfterPanic: a handler that panics while its body is held gives the bytes back.
func TestBodyHoldAfterPanic(t *testing.T) {
	read := make(chan struct{}, 2)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = r.Body.Read(make([]byte, 10))
		read <- struct{}{}
		panic(http.ErrAbortHandler)
	})
	for _, srv := range limitedServers(t, limits{pending: 1 << 20}, h) {
		t.Run(srv.name, func(t *testing.T) {
			c := dialClient(t, srv.addr)
			c.send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc")
			select {
			case <-read:
			case <-time.After(5 * time.Second):
				t.Fatal("the handler did not read the body")
			}
			eventually(t, "the body's bytes given back", func() bool { return srv.stats().BodyBytes == 0 })
		})
	}
}

// TestRefusalNotReset: clients that connect to a server at MaxConns (every connection busy)
// get the 503, every time, whether they send their request's head and its body apart (a raw
// client: the server must not close the connection with the head unread, which makes the
// kernel reset it, and the body's write fails) or are Go's client (which takes an answer that
// comes before its request is on its way for a broken connection).
func TestRefusalNotReset(t *testing.T) {
	const tries = 30
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
	})
	body := strings.Repeat("x", 2048)
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2048\r\n\r\n"
	// raw sends the head, then the body a moment later, then reads the answer.
	raw := func(addr string) (string, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, head); err != nil {
			return "", err
		}
		time.Sleep(5 * time.Millisecond)
		if _, err := io.WriteString(c, body); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return resp.Status, nil
	}
	goClient := func(addr string) (string, error) {
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return resp.Status, nil
	}
	for _, srv := range limitedServers(t, limits{maxConns: 1}, h) {
		t.Run(srv.name, func(t *testing.T) {
			busy := dialClient(t, srv.addr)
			busy.send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
			select {
			case <-entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the busy request did not start")
			}
			for _, cl := range []struct {
				name string
				do   func(string) (string, error)
			}{{"raw", raw}, {"go", goClient}} {
				got := map[string]int{}
				for range tries {
					switch status, err := cl.do(srv.addr); {
					case err == nil && status == "503 Service Unavailable":
						got["503"]++
					case isReset(err):
						got["reset"]++
					case errors.Is(err, syscall.EPIPE):
						got["broken pipe"]++
					case err != nil && strings.Contains(err.Error(), "readLoopPeekFailLocked"):
						got["answer before the request"]++ // Go's client: "Unsolicited response"
					case err != nil:
						got[err.Error()]++
					default:
						got[status]++
					}
				}
				if got["503"] != tries {
					t.Errorf("%s client, %d tries: %v; want a 503 every time", cl.name, tries, got)
				}
			}
		})
	}
}

// TestRefusalsLingerApart: a refused connection lingers on a goroutine of its own, not on the
// accept loop: with connections that send nothing lingering (refuseWait each), a client that
// sends its request is answered at once, not after them.
func TestRefusalsLingerApart(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
	})
	const silent = 3 // under maxLingering's least
	for _, srv := range limitedServers(t, limits{maxConns: 1}, h) {
		t.Run(srv.name, func(t *testing.T) {
			busy := dialClient(t, srv.addr)
			busy.send("GET /block HTTP/1.1\r\nHost: x\r\n\r\n")
			select {
			case <-entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the busy request did not start")
			}
			start := time.Now()
			for range silent {
				dialClient(t, srv.addr) // sends nothing: its refusal waits refuseWait for it
			}
			c := dialClient(t, srv.addr)
			c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			status, _, _ := c.answer()
			// On the accept loop, each silent refusal would have held it refuseWait and more.
			if took := time.Since(start); status != http.StatusServiceUnavailable || took >= refuseWait {
				t.Errorf("a request behind %d silent refused connections: %d after %v; want 503 before %v", silent, status, took, refuseWait)
			}
			if got := srv.stats().ConnsRefused; got != silent+1 {
				t.Errorf("%d connections refused, want %d", got, silent+1)
			}
		})
	}
}

// TestEvictionClosesApart: the connections closed to make room at MaxConns are closed off the
// accept loop: with the waiting connection's Close held (as a TLS connection's close_notify
// may be, by a client that does not read), the new connection is served at once, not after
// it. (With no lingering slot, MaxLingering -1, the kept-alive connection is closed at once,
// not parted from: TestPartedServesRequestOnItsWay.)
func TestEvictionClosesApart(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	servers := []struct {
		name  string
		start func(t *testing.T, ln net.Listener) (addr string, stats func() Stats, idle func(remote string) bool)
	}{
		{"h1", func(t *testing.T, ln net.Listener) (string, func() Stats, func(string) bool) {
			s := &Server{MaxConns: 1, MaxLingering: -1}
			return serveOn(t, s, h, ln), s.Stats, func(remote string) bool {
				c := s.connOf(remote)
				return c != nil && c.state.Load() == stateIdle
			}
		}},
		{"net/http", func(t *testing.T, ln net.Listener) (string, func() Stats, func(string) bool) {
			s := &NetHTTP{MaxConns: 1, MaxLingering: -1}
			return serveNetHTTPOn(t, s, h, ln), s.Stats, func(remote string) bool {
				s.table.mu.Lock()
				defer s.table.mu.Unlock()
				for c, x := range s.table.conns {
					if c.RemoteAddr().String() == remote {
						return x.state == http.StateIdle
					}
				}
				return false
			}
		}},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			release, closing := make(chan struct{}), make(chan struct{}, 1)
			addr, stats, idle := srv.start(t, slowCloseListener{Listener: ln, release: release, closing: closing})
			free := sync.OnceFunc(func() { close(release) })
			defer free() // before the server's cleanup closes what is left

			waiting := dialClient(t, addr) // kept alive, idle (a new one is left alone for a while)
			if st := waiting.get("/"); st != http.StatusOK {
				t.Fatalf("status %d", st)
			}
			eventually(t, "the first connection idle", func() bool { return idle(waiting.remote()) })
			c := dialClient(t, addr)
			_ = c.nc.SetDeadline(time.Now().Add(2 * time.Second))
			start := time.Now()
			status := c.get("/")
			took := time.Since(start)
			select {
			case <-closing:
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting connection was not closed to make room")
			}
			if status != http.StatusOK {
				t.Errorf("the new connection, while the one closed for it is still closing: status %d after %v; want 200", status, took)
			}
			free()
			if !waiting.closed() {
				t.Error("the connection closed to make room is still open")
			}
			if got := stats().ConnsEvicted; got != 1 {
				t.Errorf("%d connections evicted, want 1", got)
			}
		})
	}
}

// slowCloseListener hands out connections whose first Close waits for release (10 s at most)
// before closing, and says on closing (if it has room) that one began.
type slowCloseListener struct {
	net.Listener
	release <-chan struct{}
	closing chan<- struct{}
}

func (l slowCloseListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &slowCloseConn{Conn: c, l: l}, nil
}

type slowCloseConn struct {
	net.Conn
	l    slowCloseListener
	once sync.Once
}

func (c *slowCloseConn) Close() error {
	c.once.Do(func() {
		select {
		case c.l.closing <- struct{}{}:
		default:
		}
		select {
		case <-c.l.release:
		case <-time.After(10 * time.Second):
		}
	})
	return c.Conn.Close()
}

// TestRefusalTLS: a TLS connection refused at MaxConns gets its handshake and then its 503
// (Retry-After: 1), as a plain one does, where before it was closed before its handshake
// (the client saw EOF); on HTTP/2 (NetHTTP offers it), a GOAWAY that refuses its streams
// (last stream 0, REFUSED_STREAM). Beyond the lingering bound (none here: MaxLingering -1),
// a TLS connection is still closed without a word: its client's handshake fails.
func TestRefusalTLS(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
	})
	certFile, keyFile := testcert.NewCA(t, "refusal").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	listen := func(protos ...string) net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: protos})
	}
	dial := func(addr string, protos ...string) (*tls.Conn, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{InsecureSkipVerify: true, NextProtos: protos})
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return c, nil
	}
	for _, lingering := range []int{0, -1} {
		servers := []struct {
			name string
			addr string
			h2   bool
		}{
			{"h1", serveOn(t, &Server{MaxConns: 1, MaxLingering: lingering}, h, listen("http/1.1")), false},
			{"net/http", serveNetHTTPOn(t, &NetHTTP{MaxConns: 1, MaxLingering: lingering}, h, listen("h2", "http/1.1")), true},
		}
		for _, srv := range servers {
			t.Run(fmt.Sprintf("%s/lingering=%d", srv.name, lingering), func(t *testing.T) {
				busy, err := dial(srv.addr, "http/1.1")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.WriteString(busy, get("/block")); err != nil {
					t.Fatal(err)
				}
				select {
				case <-entered:
				case <-time.After(5 * time.Second):
					t.Fatal("the busy request did not start")
				}
				c, err := dial(srv.addr, "http/1.1")
				if lingering < 0 {
					if err == nil {
						t.Errorf("with no lingering slot, the refused TLS connection's handshake succeeded")
					}
					return
				}
				if err != nil {
					t.Fatalf("the refused connection's handshake: %v", err)
				}
				if _, err := io.WriteString(c, "POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
					t.Fatal(err)
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("the refused connection's answer: %v", err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !resp.Close {
					t.Errorf("the refused TLS connection: %s, Retry-After %q, close %v; want 503, 1, true",
						resp.Status, resp.Header.Get("Retry-After"), resp.Close)
				}
				if !srv.h2 {
					return
				}
				c2, err := dial(srv.addr, "h2")
				if err != nil {
					t.Fatalf("the refused HTTP/2 connection's handshake: %v", err)
				}
				if p := c2.ConnectionState().NegotiatedProtocol; p != "h2" {
					t.Fatalf("negotiated %q, want h2", p)
				}
				if _, err := io.WriteString(c2, h2Preface); err != nil {
					t.Fatal(err)
				}
				var frames []string
				for range 2 {
					var head [9]byte
					if _, err := io.ReadFull(c2, head[:]); err != nil {
						t.Fatalf("after %v: %v", frames, err)
					}
					payload := make([]byte, int(head[0])<<16|int(head[1])<<8|int(head[2]))
					if _, err := io.ReadFull(c2, payload); err != nil {
						t.Fatal(err)
					}
					switch head[3] {
					case 0x4:
						frames = append(frames, fmt.Sprintf("SETTINGS len %d", len(payload)))
					case 0x7:
						frames = append(frames, fmt.Sprintf("GOAWAY last %d code %d", binary.BigEndian.Uint32(payload)&(1<<31-1),
							binary.BigEndian.Uint32(payload[4:])))
					default:
						frames = append(frames, fmt.Sprintf("type %d", head[3]))
					}
				}
				if diff := cmp.Diff([]string{"SETTINGS len 0", "GOAWAY last 0 code 7"}, frames); diff != "" {
					t.Errorf("the refused HTTP/2 connection's frames (-want +got):\n%s", diff)
				}
			})
		}
	}
}
