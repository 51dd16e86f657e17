package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// guard holds the protections both servers get in these tests.
type guard struct {
	body  time.Duration
	rate  int64
	stall time.Duration
}

func jsonError(status int, msg string) (string, []byte) {
	return "application/json", fmt.Appendf(nil, `{"error":{"message":%q}}`, msg)
}

// startNetHTTP serves h with a NetHTTP on a loopback port, closed at the end of the test.
func startNetHTTP(t *testing.T, s *NetHTTP, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveNetHTTPOn(t, s, h, ln)
}

// serveNetHTTPOn serves h with a NetHTTP on ln, closed at the end of the test.
func serveNetHTTPOn(t *testing.T, s *NetHTTP, h http.Handler, ln net.Listener) string {
	t.Helper()
	if s.Server == nil {
		s.Server = &http.Server{}
	}
	s.Server.Handler = h
	s.Server.ErrorLog = newTestLogger(new(strings.Builder), new(sync.Mutex))
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		// Shutdown waits for connection goroutines that Close leaves behind (after a refusal
		// Go's server lingers 500 ms before closing).
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
		}
	})
	return ln.Addr().String()
}

// bothServers serves h with this package's Server and with NetHTTP, with the same protections,
// and returns their addresses by name.
func bothServers(t *testing.T, g guard, h http.Handler) []namedAddr {
	t.Helper()
	s := &Server{BodyReadTimeout: g.body, BodyMinRate: g.rate, WriteStallTimeout: g.stall, ErrorBody: jsonError}
	n := &NetHTTP{BodyReadTimeout: g.body, BodyMinRate: g.rate, WriteStallTimeout: g.stall, ErrorBody: jsonError}
	return []namedAddr{{"h1", startServer(t, s, h)}, {"net/http", startNetHTTP(t, n, h)}}
}

type namedAddr struct{ name, addr string }

// echo reads the body and answers its length; a body read that timed out gets 408, another
// read error 400. A request for /smuggled is counted: none may run.
func echo(smuggled *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/smuggled" {
			smuggled.Add(1)
		}
		b, err := io.ReadAll(r.Body)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			http.Error(w, err.Error(), http.StatusRequestTimeout)
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			_, _ = fmt.Fprintf(w, "ok %d", len(b))
		}
	}
}

// responses sends req on a new connection and returns the statuses of the answers the server
// sent before closing it (rawExchange fails the test when it does not close it).
func responses(t *testing.T, addr, req string) []int {
	t.Helper()
	br := bufio.NewReader(strings.NewReader(rawExchange(t, addr, req)))
	var statuses []int
	for range 10 {
		if _, err := br.Peek(1); err != nil {
			return statuses // the end: the server closed the connection
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Errorf("after %v: %v", statuses, err)
			return statuses
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		statuses = append(statuses, resp.StatusCode)
	}
	return statuses
}

// TestSmugglingRefused: framings that a proxy in front may read differently from Go's parser
// get 400 and the end of the connection, on both servers, and what they would smuggle never
// runs; requests framed properly, pipelined, are all served on one connection.
func TestSmugglingRefused(t *testing.T) {
	var smuggled atomic.Int32
	servers := bothServers(t, guard{body: 2 * time.Second}, echo(&smuggled))
	const next = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, tc := range []struct {
		name, req string
		want      []int // statuses before the connection closes
	}{
		{"length then chunked", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next, []int{400}},
		{"chunked then length", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n" + next, []int{400}},
		{"space before colon, length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 36\r\n\r\n" + next, []int{400}},
		{"space before colon, chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + next, []int{400}},
		{"space before colon, other", "GET / HTTP/1.1\r\nHost: x\r\nX-Note : 1\r\n\r\n" + next, []int{400}},
		{"folded chunked", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + next, []int{400}},
		{"folded other", "GET / HTTP/1.1\r\nHost: x\r\nX-Note: 1\r\n\t2\r\n\r\n" + next, []int{400}},
		// The same, with a body that never ends: refused and closed at once, not held open
		// while Go's server waits to read the rest of the body.
		{"length then chunked, unfinished", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nabcde", []int{400}},
		{"folded, body unfinished", "POST / HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\nContent-Length: 1000\r\n\r\nabc", []int{400}},
		{"chunked in HTTP/1.0", "POST / HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next, []int{400}},
		{"lengths differ", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab" + next, []int{400}},
		{"length not a number", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\na" + next, []int{400}},
		{"chunk size not hex", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n" + next, []int{400}},
		{"chunk longer than its size", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n0\r\n\r\n" + next, []int{400}},
		{"well framed, pipelined", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" +
			"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Sum: 1\r\n\r\n" +
			"GET / HTTP/1.1\r\nHost: x\r\nX-Empty:\r\n\r\n" +
			"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", []int{200, 200, 200, 200}},
	} {
		for _, srv := range servers {
			t.Run(tc.name+"/"+srv.name, func(t *testing.T) {
				if got := responses(t, srv.addr, tc.req); !slices.Equal(got, tc.want) {
					t.Errorf("statuses %v before the connection closed; want %v", got, tc.want)
				}
			})
		}
	}
	if n := smuggled.Load(); n != 0 {
		t.Errorf("%d smuggled requests ran", n)
	}
}

// TestBodyTimeout: a body trickled a byte at a time is cut at the body timeout, the handler's
// read failing at once (it answers 408) and the connection closing; a large body sent at a fair
// pace outlasts the timeout, since every BodyMinRate bytes earn a second; and a handler that
// starts reading late costs the client nothing.
func TestBodyTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	readErr := make(chan time.Duration, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/late" {
			<-time.After(2 * timeout) // busy elsewhere (say, waiting for admission)
		}
		t0 := time.Now()
		b, err := io.ReadAll(r.Body)
		if err != nil {
			readErr <- time.Since(t0)
			if !errors.Is(err, ErrBodyReadTimeout) {
				t.Errorf("body read error %v, want ErrBodyReadTimeout", err)
			}
			http.Error(w, "too slow", http.StatusRequestTimeout)
			return
		}
		_, _ = fmt.Fprintf(w, "ok %d", len(b))
	})
	for _, srv := range bothServers(t, guard{body: timeout, rate: 10_000}, h) {
		t.Run(srv.name, func(t *testing.T) {
			t.Run("trickle", func(t *testing.T) {
				c, err := net.Dial("tcp", srv.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				t0 := time.Now()
				_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\na")
				stop := make(chan struct{})
				defer close(stop)
				go func() { // a byte every 50 ms, until the test ends (at most 100)
					tick := time.NewTicker(50 * time.Millisecond)
					defer tick.Stop()
					for range 100 {
						select {
						case <-stop:
							return
						case <-tick.C:
							if _, err := c.Write([]byte("a")); err != nil {
								return
							}
						}
					}
				}()
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("no answer to a trickled body: %v", err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_, err = br.ReadByte()
				took := time.Since(t0)
				if resp.StatusCode != http.StatusRequestTimeout || !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("status %d, then %v; want 408 and the connection closed", resp.StatusCode, err)
				}
				if took < timeout || took > timeout+time.Second {
					t.Errorf("closed after %v; want %v to %v", took, timeout, timeout+time.Second)
				}
				select {
				case d := <-readErr:
					if d < timeout || d > timeout+time.Second {
						t.Errorf("the handler's read failed after %v; want %v to %v", d, timeout, timeout+time.Second)
					}
				default:
					t.Error("the handler's read did not fail")
				}
			})
			t.Run("fair pace", func(t *testing.T) {
				// 20 KB/s for a second: the timeout grows by 2 s meanwhile.
				pr, pw := io.Pipe()
				go func() {
					chunk := strings.Repeat("b", 1000)
					for range 20 {
						<-time.After(50 * time.Millisecond)
						if _, err := io.WriteString(pw, chunk); err != nil {
							return
						}
					}
					pw.Close()
				}()
				req, _ := http.NewRequest(http.MethodPost, "http://"+srv.addr+"/", pr)
				req.ContentLength = 20_000
				resp, err := newClient(t).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "ok 20000" {
					t.Errorf("got %d %q; want 200 ok 20000", resp.StatusCode, b)
				}
			})
			t.Run("late reader", func(t *testing.T) {
				resp, err := newClient(t).Post("http://"+srv.addr+"/late", "text/plain", strings.NewReader("abc"))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(b) != "ok 3" {
					t.Errorf("got %d %q; want 200 ok 3", resp.StatusCode, b)
				}
			})
		})
	}
}

// TestWriteStall: a client that stops reading a long answer has its connection closed after
// the stall timeout, and the handler's writes fail (its goroutine ends); a stream read as it
// comes, longer than the timeout, is not cut.
func TestWriteStall(t *testing.T) {
	const stall = 300 * time.Millisecond
	handlerErr := make(chan error, 1)
	const sized = 4 << 20
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.URL.Path == "/sized" {
			w.Header().Set("Content-Length", strconv.Itoa(sized))
			_, _ = w.Write(make([]byte, sized))
			return
		}
		if r.URL.Path == "/stream" {
			for i := range 30 {
				<-time.After(stall / 6)
				if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
					handlerErr <- err
					return
				}
				if err := rc.Flush(); err != nil {
					handlerErr <- err
					return
				}
			}
			handlerErr <- nil
			return
		}
		chunk := make([]byte, 64<<10)
		for range 4096 { // 256 MiB: far more than the socket buffers hold
			if _, err := w.Write(chunk); err != nil {
				handlerErr <- err
				return
			}
		}
		handlerErr <- errors.New("every write succeeded")
	})
	for _, srv := range bothServers(t, guard{stall: stall}, h) {
		t.Run(srv.name, func(t *testing.T) {
			t.Run("reader stops", func(t *testing.T) {
				c, err := net.Dial("tcp", srv.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				t0 := time.Now()
				_, _ = io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
				select { // the client reads nothing
				case err := <-handlerErr:
					if err == nil || err.Error() == "every write succeeded" {
						t.Fatalf("handler: %v; want a write error", err)
					}
					if d := time.Since(t0); d > stall+3*time.Second {
						t.Errorf("the handler's write failed after %v; want within %v of the stall", d, stall)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the handler still writes to a client that stopped reading 10 s ago")
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err = io.Copy(io.Discard, c)
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded):
					t.Error("the connection was not closed")
				case !isReset(err):
					// Closed gracefully, the answer's unsent rest would wait in the server's
					// kernel for a client that does not read (FIN-WAIT-1).
					t.Errorf("reading after the stall: %v; want a reset (an abortive close)", err)
				}
			})
			t.Run("close after the answer", func(t *testing.T) {
				// A close that follows a whole answer stays graceful: all of the body, then EOF.
				c, br := dialBuffered(t, srv.addr)
				_, _ = io.WriteString(c, "GET /sized HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				n, err := io.Copy(io.Discard, resp.Body)
				if err != nil || n != sized {
					t.Errorf("body: %d bytes, %v; want %d", n, err, sized)
				}
				if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
					t.Errorf("after the answer: %q, %v; want EOF (a graceful close)", rest, err)
				}
			})
			t.Run("reader keeps up", func(t *testing.T) {
				resp, err := newClient(t).Get("http://" + srv.addr + "/stream")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err := <-handlerErr; err != nil || strings.Count(string(b), "data: ") != 30 {
					t.Errorf("handler: %v; client got %d of 30 events", err, strings.Count(string(b), "data: "))
				}
			})
		})
	}
}

// TestAnnouncedBodyTooLarge: a handler that refuses a body for its announced length, without
// reading it, gets its answer to the client at once, and the connection is closed rather than
// drained.
func TestAnnouncedBodyTooLarge(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1<<20 {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
	})
	for _, srv := range bothServers(t, guard{body: 30 * time.Second, stall: 30 * time.Second}, h) {
		t.Run(srv.name, func(t *testing.T) {
			t0 := time.Now()
			got := responses(t, srv.addr, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n0123456789")
			if d := time.Since(t0); !slices.Equal(got, []int{413}) || d > time.Second {
				t.Errorf("statuses %v, connection closed after %v; want 413 and closed within 1 s", got, d)
			}
		})
	}
}
