package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests of this file: no request that reached a server is lost, at the connection cap or
// at shutdown.

// shutdownServer is one of the two servers under test, for the shutdown tests.
type shutdownServer struct {
	name     string
	addr     string
	shutdown func(context.Context) error
	noKeep   func() // SetKeepAlivesEnabled(false)
	conns    func() int
}

// shutdownServers serves h with Server and with NetHTTP on ln (made by listen, once each).
func shutdownServers(t *testing.T, h http.Handler, listen func() net.Listener) []shutdownServer {
	t.Helper()
	s := &Server{ErrorBody: jsonError}
	n := &NetHTTP{ErrorBody: jsonError}
	return []shutdownServer{
		{name: "h1", addr: serveOn(t, s, h, listen()), shutdown: s.Shutdown,
			noKeep: func() { s.SetKeepAlivesEnabled(false) }, conns: func() int { return s.Stats().Conns }},
		{name: "net/http", addr: serveNetHTTPOn(t, n, h, listen()), shutdown: n.Shutdown,
			noKeep: func() { n.SetKeepAlivesEnabled(false) }, conns: func() int { return n.Stats().Conns }},
	}
}

func loopback(t *testing.T) func() net.Listener {
	return func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
}

// readResponse reads one answer from br: its status, whether it closes the connection, its body.
func readResponse(br *bufio.Reader) (status int, closing bool, body string, err error) {
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, false, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Close, string(b), err
}

// TestFreshConnectionNotEvicted: at MaxConns, a connection that has just been accepted and has
// not sent its request yet is not closed to make room for the next one (whose client then
// sees its request fail unanswered, a POST that Go's client does not send again): the
// newcomer is refused with a 503 it can retry, and the first is served. Once it has waited
// freshGrace, it gives way.
func TestFreshConnectionNotEvicted(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	const header = time.Second // freshGrace: 250 ms
	s := &Server{MaxConns: 1, ReadHeaderTimeout: header, ErrorBody: jsonError}
	n := &NetHTTP{Server: &http.Server{ReadHeaderTimeout: header}, MaxConns: 1, ErrorBody: jsonError}
	addrN := startNetHTTP(t, n, h)
	for _, srv := range []struct {
		name  string
		addr  string
		stats func() Stats
	}{{"h1", startServer(t, s, h), s.Stats}, {"net/http", addrN, n.Stats}} {
		t.Run(srv.name, func(t *testing.T) {
			first := dialClient(t, srv.addr)
			eventually(t, "the first connection counted", func() bool { return srv.stats().Conns == 1 })
			second := dialClient(t, srv.addr)
			second.send("POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
			if st, retry, _ := second.answer(); st != http.StatusServiceUnavailable || retry != "1" {
				t.Errorf("the newcomer, with a fresh connection at the cap: status %d, Retry-After %q; want 503, 1", st, retry)
			}
			first.send("POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
			if st, _, b := first.answer(); st != http.StatusOK || b != "ok" {
				t.Errorf("the fresh connection's request, sent after the newcomer came: %d %q, want 200 ok", st, b)
			}
			if st := srv.stats(); st.ConnsEvicted != 0 || st.ConnsRefused != 1 {
				t.Errorf("%d evicted, %d refused; want 0 and 1", st.ConnsEvicted, st.ConnsRefused)
			}
			first.nc.Close()
			eventually(t, "the first connection gone", func() bool { return srv.stats().Conns == 0 })

			// One silent for longer than the grace gives way.
			silent := dialClient(t, srv.addr)
			dialled := time.Now()
			eventually(t, "the silent connection counted", func() bool { return srv.stats().Conns == 1 })
			eventually(t, "the grace over", func() bool { return time.Since(dialled) > freshGrace(header)+10*time.Millisecond })
			third := dialClient(t, srv.addr)
			if st := third.get("/"); st != http.StatusOK {
				t.Errorf("a connection at the cap, the other silent for %v: status %d, want 200", freshGrace(header), st)
			}
			if !silent.closed() {
				t.Error("the connection silent beyond the grace is still open")
			}
			if got := srv.stats().ConnsEvicted; got != 1 {
				t.Errorf("%d evicted, want 1", got)
			}
		})
	}
}

// TestShutdownAnswersNextRequest: a kept-alive connection whose answer's head went out before
// the shutdown (a stream under way) could not be told to close: the request its client sends
// as soon as the answer ends is answered (with Connection: close), not met by the close. Both
// servers closed such a connection right after the answer (and Go's server drops a request it
// reads once its Shutdown has begun).
func TestShutdownAnswersNextRequest(t *testing.T) {
	release := make(chan struct{})
	streaming := make(chan struct{}, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			_, _ = io.WriteString(w, "data: 1\n\n")
			w.(http.Flusher).Flush()
			streaming <- struct{}{}
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	for _, srv := range shutdownServers(t, h, loopback(t)) {
		t.Run(srv.name, func(t *testing.T) {
			c := dialClient(t, srv.addr)
			c.send(get("/stream"))
			resp, err := http.ReadResponse(c.br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Close {
				t.Fatal("the stream's head says Connection: close before the shutdown")
			}
			select {
			case <-streaming:
			case <-time.After(5 * time.Second):
				t.Fatal("the stream did not start")
			}
			// A fresh connection, accepted before the shutdown, whose request comes after it.
			fresh := dialClient(t, srv.addr)
			eventually(t, "both connections counted", func() bool { return srv.conns() == 2 })
			srv.noKeep()
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				shut <- srv.shutdown(ctx)
			}()
			eventually(t, "the listener closed", func() bool {
				c, err := net.DialTimeout("tcp", srv.addr, time.Second)
				if err == nil {
					c.Close()
				}
				return err != nil
			})
			fresh.send(get("/fresh"))
			if st, closing, b, err := readResponse(fresh.br); err != nil || st != http.StatusOK || b != "ok" || !closing {
				t.Errorf("a new connection's request after the shutdown began: %d %q close=%v (%v); want 200 ok, Connection: close", st, b, closing, err)
			}
			release <- struct{}{}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !strings.HasSuffix(string(b), "[DONE]\n\n") {
				t.Fatalf("the stream: %q, %v", b, err)
			}
			c.send(get("/next")) // at once, as a client of back-to-back streams does
			if st, closing, b, err := readResponse(c.br); err != nil || st != http.StatusOK || b != "ok" || !closing {
				t.Errorf("the next request on the stream's connection: %d %q close=%v (%v); want 200 ok, Connection: close", st, b, closing, err)
			}
			if !c.closed() {
				t.Error("the connection is still open after an answer with Connection: close")
			}
			select {
			case err := <-shut:
				if err != nil {
					t.Errorf("Shutdown: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Shutdown did not return")
			}
		})
	}
}

// TestShutdownClosesIdleAfterGrace: during a shutdown, a kept-alive connection that waits for
// its next request is closed idleGrace after its answer, and Shutdown then returns; one idle
// for longer when it began is closed at once.
func TestShutdownClosesIdleAfterGrace(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	for _, srv := range shutdownServers(t, h, loopback(t)) {
		t.Run(srv.name, func(t *testing.T) {
			c := dialClient(t, srv.addr)
			if st := c.get("/"); st != http.StatusOK {
				t.Fatalf("status %d", st)
			}
			answered := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			took := time.Since(answered)
			if !c.closed() {
				t.Error("the idle connection is open after Shutdown")
			}
			if took < idleGrace || took > idleGrace+time.Second {
				t.Errorf("Shutdown returned %v after the last answer; want between %v and %v", took, idleGrace, idleGrace+time.Second)
			}
		})
	}
}

// TestRefusalsLingerUnderFlood: a flood of connections over the cap all wait for their
// request before their 503 (maxLingering): an answer before the request is one Go's client
// fails ("Unsolicited response received on idle HTTP channel").
func TestRefusalsLingerUnderFlood(t *testing.T) {
	const flood = 50
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
	for _, srv := range limitedServers(t, limits{maxConns: 8}, h) {
		t.Run(srv.name, func(t *testing.T) {
			for range 8 {
				busy := dialClient(t, srv.addr)
				busy.send(get("/block"))
				select {
				case <-entered:
				case <-time.After(5 * time.Second):
					t.Fatal("a busy request did not start")
				}
			}
			cs := make([]*client, flood)
			for i := range cs {
				cs[i] = dialClient(t, srv.addr)
			}
			eventually(t, "the flood refused", func() bool { return srv.stats().ConnsRefused == flood })
			// The refusals written at once are on their way by now, give or take microseconds:
			// look for them (without reading) for 50 ms, well before refuseWait, when a
			// lingering refusal has said nothing yet.
			early := 0
			for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
				n := 0
				for _, c := range cs {
					if pending(c.nc) {
						n++
					}
				}
				early = max(early, n)
				<-time.After(5 * time.Millisecond)
			}
			if early != 0 {
				t.Errorf("%d of %d refused connections answered before their request; want none", early, flood)
			}
		})
	}
}

// TestRefusalsLingerWithinBudget: MaxLingering bounds the refusals that wait for their
// request, what a process short of open files can spare (app): of 12 connections refused at a
// cap of 8, 4 linger (MaxLingering 4) and 8 are answered at once, or all 12 (MaxLingering -1);
// each is answered in the end. Before, 64 lingered whatever the files left (maxLingering).
func TestRefusalsLingerWithinBudget(t *testing.T) {
	const flood = 12
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
	for _, budget := range []int{4, -1} {
		wantEarly := flood - max(budget, 0)
		for _, srv := range limitedServers(t, limits{maxConns: 8, maxLingering: budget}, h) {
			t.Run(fmt.Sprintf("%s/budget=%d", srv.name, budget), func(t *testing.T) {
				for range 8 {
					busy := dialClient(t, srv.addr)
					busy.send(get("/block"))
					select {
					case <-entered:
					case <-time.After(5 * time.Second):
						t.Fatal("a busy request did not start")
					}
				}
				cs := make([]*client, flood)
				for i := range cs {
					cs[i] = dialClient(t, srv.addr)
				}
				answered := func() int {
					n := 0
					for _, c := range cs {
						if pending(c.nc) {
							n++
						}
					}
					return n
				}
				eventually(t, "the flood refused", func() bool { return srv.stats().ConnsRefused == flood })
				// Within 200 ms, well before refuseWait: the refusals written at once, and no
				// lingering one.
				early := 0
				for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
					early = max(early, answered())
					<-time.After(5 * time.Millisecond)
				}
				if early != wantEarly {
					t.Errorf("%d of %d refused connections answered before their request; want %d", early, flood, wantEarly)
				}
				eventually(t, "every refusal answered", func() bool { return answered() == flood })
			})
		}
	}
}

// TestMaxLingering: the refusals that may linger: a 32nd of the cap, 64 to 128, within the
// budget a process gives (MaxLingering) when it gives one.
func TestMaxLingering(t *testing.T) {
	for _, tc := range []struct{ maxConns, budget, want int }{
		{8, 0, 64}, {2048, 0, 64}, {3200, 0, 100}, {16384, 0, 128},
		{48, 6, 6}, {8, 2, 2}, {16384, 200, 128}, {16384, 48, 48}, {8, -1, 0},
	} {
		if got := MaxLingering(tc.maxConns, tc.budget); got != tc.want {
			t.Errorf("MaxLingering(%d, %d) = %d, want %d", tc.maxConns, tc.budget, got, tc.want)
		}
	}
}

// TestPendingTLS: pending sees the bytes of a request waiting under a TLS connection, so that
// neither the idle close nor an eviction closes it as its request arrives.
func TestPendingTLS(t *testing.T) {
	ts := httptest.NewUnstartedServer(http.NotFoundHandler())
	ts.StartTLS()
	cfg := &tls.Config{Certificates: ts.TLS.Certificates}
	ts.Close()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		_ = c.(*tls.Conn).Handshake()
		accepted <- c
	}()
	cc, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	var sc net.Conn
	select {
	case sc = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection accepted")
	}
	if sc == nil {
		t.Fatal("accept failed")
	}
	defer sc.Close()
	if pending(sc) {
		t.Fatal("pending before the client sent anything")
	}
	if _, err := io.WriteString(cc, get("/")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the request's record seen waiting", func() bool { return pending(sc) })
}

// TestPartedServesRequestOnItsWay: at MaxConns, an idle kept-alive connection taken to make
// room for a new one stays open for idleGrace: the request its client sends just then (it
// cannot know) is answered, with Connection: close, where before it met the close (EOF or a
// reset: a POST that Go's client does not send again). One whose client sends nothing is
// closed after idleGrace. With no lingering slot to spare (MaxLingering < 0) it is closed at
// once, as before. In each case the newcomer is served.
func TestPartedServesRequestOnItsWay(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	const post = "POST /v1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	for _, tc := range []struct {
		name      string
		lingering int
		send      bool
	}{
		{"request on its way", 0, true},
		{"nothing sent", 0, false},
		{"no lingering slot", -1, true},
	} {
		for _, srv := range limitedServers(t, limits{maxConns: 1, maxLingering: tc.lingering}, h) {
			t.Run(tc.name+"/"+srv.name, func(t *testing.T) {
				old := dialClient(t, srv.addr)
				if st := old.get("/"); st != http.StatusOK {
					t.Fatalf("status %d", st)
				}
				eventually(t, "the first connection idle", func() bool { return srv.idle(old.remote()) })
				taken := time.Now()
				newcomer := dialClient(t, srv.addr)
				eventually(t, "the idle connection taken", func() bool { return srv.stats().ConnsEvicted == 1 })
				switch {
				case !tc.send:
					if !old.closed() {
						t.Error("the connection taken, silent, is still open")
					}
					if took := time.Since(taken); took < idleGrace {
						t.Errorf("the connection taken, silent, closed %v after, want %v at least", took, idleGrace)
					}
				case tc.lingering < 0:
					// Taken without a slot, the connection is not parted from but closed, off
					// the accept goroutine (closeEvicted): the request is sent once the server
					// has closed it. Sent before, it could be served (net/http reads the
					// connection until the close), which is no loss but not what is tested.
					if n := srv.lingering(); n != 0 {
						t.Errorf("%d lingering slots taken, want none", n)
					}
					eventually(t, "the connection taken closed", func() bool { return !srv.open(old.remote()) })
					old.send(post)
					if status, _, _, err := readResponse(old.br); err == nil {
						t.Errorf("with no lingering slot, the request on the connection taken: %d, want it met by the close", status)
					}
				default:
					old.send(post)
					status, closing, body, err := readResponse(old.br)
					if err != nil || status != http.StatusOK || body != "ok" || !closing {
						t.Errorf("the request on the connection taken: %d %q closing %v, %v; want 200 ok, Connection: close", status, body, closing, err)
					}
					if !old.closed() {
						t.Error("the connection taken is still open after its last answer")
					}
				}
				if st := newcomer.get("/"); st != http.StatusOK {
					t.Errorf("the newcomer: status %d, want 200", st)
				}
				if st := srv.stats(); st.Conns != 1 || st.ConnsRefused != 0 {
					t.Errorf("%d open, %d refused; want 1 and 0", st.Conns, st.ConnsRefused)
				}
			})
		}
	}
}

// TestFloodAtTheCap measures the requests lost at MaxConns: 50 of Go's clients, each with a
// connection of its own kept alive, send POSTs to a server capped at 8 connections for 3 s,
// back to back or with pauses of up to 200 ms, and a 503 is sent again at once. A request
// lost is one whose kept-alive connection the server closed as its client sent it (EOF or a
// reset; Go's client does not send a POST again). It takes 13 s, so it runs only with
// KVROUTE_H1_FLOOD=1:
//
//	KVROUTE_H1_FLOOD=1 go test -run TestFloodAtTheCap -v ./internal/h1/
//
// Before kept-alive connections were parted from rather than closed at once (3 runs on a
// 2-core VM), 0.9 to 2.0% of the back-to-back requests were lost with h1 (66 of 7180, 179 of
// 12879, 273 of 13525), 1.6 to 2.2% with net/http, and up to 0.7% of those with pauses; none
// since in the same runs. The race is not gone: it is left to the close of a parted
// connection whose client sends nothing for half a second and then just as it closes. The
// bound asserted, 0.25%, leaves room for it on a loaded machine.
func TestFloodAtTheCap(t *testing.T) {
	if os.Getenv("KVROUTE_H1_FLOOD") == "" {
		t.Skip("a 13 s measurement: set KVROUTE_H1_FLOOD=1 to run it")
	}
	const clients, capConns, span = 50, 8, 3 * time.Second
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	for _, pause := range []time.Duration{0, 200 * time.Millisecond} {
		for _, srv := range limitedServers(t, limits{maxConns: capConns}, h) {
			t.Run(fmt.Sprintf("%s/pause=%v", srv.name, pause), func(t *testing.T) {
				var mu sync.Mutex
				counts := map[string]int{}
				var wg sync.WaitGroup
				end := time.Now().Add(span)
				for i := range clients {
					wg.Go(func() {
						tr := &http.Transport{}
						defer tr.CloseIdleConnections()
						c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
						rng := rand.New(rand.NewPCG(uint64(i), 1))
						for time.Now().Before(end) {
							if pause > 0 {
								<-time.After(time.Duration(rng.Int64N(int64(pause)))) // the client's own pace
							}
							var reused bool
							ctx := httptrace.WithClientTrace(context.Background(),
								&httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
							req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+srv.addr+"/v1", strings.NewReader(`{}`))
							resp, err := c.Do(req)
							k := ""
							switch {
							case err != nil && reused && (errors.Is(err, io.EOF) || isReset(err)):
								k = "lost"
							case err != nil:
								k = err.Error()
							default:
								_, _ = io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
								k = strconv.Itoa(resp.StatusCode)
							}
							mu.Lock()
							counts[k]++
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				st := srv.stats()
				n := 0
				for _, v := range counts {
					n += v
				}
				t.Logf("%d requests: %v; %d connections closed to make room, %d refused", n, counts, st.ConnsEvicted, st.ConnsRefused)
				if lost := counts["lost"]; lost*400 > n {
					t.Errorf("%d of %d requests lost, over 0.25%%", lost, n)
				}
			})
		}
	}
}
