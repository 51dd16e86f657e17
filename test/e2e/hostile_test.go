package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
	"github.com/kvroute/kvroute/internal/tenant"
)

// startHostileRouter runs the built router (`kvroute serve`) with the given API server, a
// 1 MiB body limit, a 1 s body timeout and one tenant (key sk-a), in front of urls.
func startHostileRouter(t *testing.T, bin, httpServer string, urls []string) (api string) {
	t.Helper()
	var y strings.Builder
	y.WriteString("policy: {name: least-request}\nhealth: {interval: 1h}\n")
	y.WriteString("auth: {mode: api_key, secret_env: KVROUTE_E2E_SECRET}\n")
	fmt.Fprintf(&y, "tenants: [{name: a, api_keys: [%q]}]\n", tenant.HashKey("sk-a"))
	y.WriteString("limits: {max_body_bytes: 1048576}\n")
	y.WriteString("server: {body_read_timeout: 1s, read_header_timeout: 5s, shutdown_timeout: 5s}\nendpoints:\n")
	for _, u := range urls {
		fmt.Fprintf(&y, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	file := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(file, []byte(y.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "KVROUTE_E2E_SECRET="+tenantSecret)
	p := startProcess(t, bin, env, func(f []string) (string, bool) {
		if len(f) > 3 && f[2] == "api" {
			return strings.TrimPrefix(f[3], "http://"), true
		}
		return "", false
	}, "serve", "--config", file, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-server", httpServer)
	return p.addr
}

// rawResponses writes req on a new connection and reads the answers until the server closes it
// (5 s at most); it reports the statuses and whether the server closed the connection.
func rawResponses(t *testing.T, addr, req string) (statuses []int, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	go func() { _, _ = io.WriteString(c, req) }()
	br := bufio.NewReader(c)
	for range 10 {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return statuses, errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses = append(statuses, resp.StatusCode)
	}
	return statuses, false
}

// TestHostileClients runs the router binary with each API server and what a hostile client
// does to it: bodies trickled in, a body announced beyond the limit, framings a front proxy may
// read differently (request smuggling), more than one API key.
func TestHostileClients(t *testing.T) {
	bin := kvrouteBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fleet, err := simserver.StartFleet(ctx, simserver.Options{Profile: "instant", Model: model, DefaultMaxTokens: 4}, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	for _, srv := range []string{"builtin", "net/http"} {
		t.Run(srv, func(t *testing.T) {
			api := startHostileRouter(t, bin, srv, fleet.URLs())
			t.Run("trickled bodies", func(t *testing.T) { trickledBodies(t, api) })
			t.Run("announced too large", func(t *testing.T) {
				t0 := time.Now()
				got, closed := rawResponses(t, api, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"+
					"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{\"model\":")
				took := time.Since(t0)
				t.Logf("Content-Length 10000000000, limit 1 MiB: statuses %v, closed %v, after %v", got, closed, took.Round(time.Millisecond))
				if !slices.Equal(got, []int{413}) || !closed || took > time.Second {
					t.Errorf("statuses %v, closed %v, after %v; want 413 and the connection closed within 1 s", got, closed, took)
				}
			})
			t.Run("smuggling", func(t *testing.T) {
				const head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"
				const next = "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n\r\n"
				for _, tc := range []struct{ name, req string }{
					{"length and chunked", head + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next},
					{"space before colon", head + "Content-Length : 69\r\n\r\n" + next},
					{"folded chunked", head + "Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n" + next},
					{"chunked in HTTP/1.0", strings.Replace(head, "HTTP/1.1", "HTTP/1.0", 1) + "Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next},
				} {
					got, closed := rawResponses(t, api, tc.req)
					if !slices.Equal(got, []int{400}) || !closed {
						t.Errorf("%s: statuses %v, closed %v; want 400, then the connection closed", tc.name, got, closed)
					}
				}
			})
			t.Run("duplicate credentials", func(t *testing.T) {
				for _, tc := range []struct {
					name string
					hdr  http.Header
					want int
				}{
					{"two Authorization", http.Header{"Authorization": {"Bearer sk-a", "Bearer sk-other"}}, 400},
					{"two api-key", http.Header{"Api-Key": {"sk-other", "sk-a"}}, 400},
					{"Authorization and another api-key", http.Header{"Authorization": {"Bearer sk-a"}, "Api-Key": {"sk-other"}}, 400},
					{"one key", http.Header{"Authorization": {"Bearer sk-a"}}, 200},
				} {
					req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(chatJSON("hello", "")))
					req.Header = tc.hdr
					req.Header.Set("Content-Type", "application/json")
					resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != tc.want || tc.want == 400 && !strings.Contains(string(b), tenant.CodeMultipleKeys) {
						t.Errorf("%s: %d %s; want %d", tc.name, resp.StatusCode, b, tc.want)
					}
				}
			})
		})
	}
}

// trickledBodies: 100 connections trickling a body a byte every 200 ms are answered 408 and
// closed by the body timeout (1 s), while normal requests are served meanwhile.
func trickledBodies(t *testing.T, api string) {
	const n = 100
	type result struct {
		status int
		closed bool
		after  time.Duration
	}
	results := make(chan result, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		c, err := net.Dial("tcp", api)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer c.Close()
			t0 := time.Now()
			_ = c.SetDeadline(t0.Add(15 * time.Second))
			_, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n"+
				"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
			if err != nil {
				results <- result{}
				return
			}
			go func() { // a byte every 200 ms, 50 at most
				tick := time.NewTicker(200 * time.Millisecond)
				defer tick.Stop()
				for range 50 {
					select {
					case <-stop:
						return
					case <-tick.C:
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}
			}()
			br := bufio.NewReader(c)
			r := result{}
			if resp, err := http.ReadResponse(br, nil); err == nil {
				r.status = resp.StatusCode
				_, _ = io.Copy(io.Discard, resp.Body)
			}
			_, err = io.Copy(io.Discard, br) // until the server closes
			r.closed = !errors.Is(err, os.ErrDeadlineExceeded)
			r.after = time.Since(t0)
			results <- r
		})
	}
	// Normal clients are served meanwhile.
	errs := make(chan error, 20)
	var normal sync.WaitGroup
	for range 20 {
		normal.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+api+"/v1/chat/completions", strings.NewReader(chatJSON("hello", "")))
			req.Header.Set("Authorization", "Bearer sk-a")
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- errors.New(resp.Status)
			}
		})
	}
	normal.Wait()
	normalTook := time.Since(start)
	close(errs)
	for err := range errs {
		t.Errorf("normal request beside %d trickling connections: %v", n, err)
	}
	wg.Wait()
	close(stop)
	close(results)
	var closed, answered408 int
	var times []time.Duration
	for r := range results {
		if r.closed {
			closed++
			times = append(times, r.after)
		}
		if r.status == http.StatusRequestTimeout {
			answered408++
		}
	}
	slices.Sort(times)
	if len(times) > 0 {
		t.Logf("%d of %d trickling connections closed (%d answered 408); time to close: min %v, median %v, max %v; 20 normal requests done in %v",
			closed, n, answered408, times[0].Round(time.Millisecond), times[len(times)/2].Round(time.Millisecond),
			times[len(times)-1].Round(time.Millisecond), normalTook.Round(time.Millisecond))
	}
	if closed != n || answered408 != n {
		t.Errorf("%d of %d trickling connections closed, %d answered 408; want all (body_read_timeout 1s)", closed, n, answered408)
	}
	if len(times) > 0 && times[len(times)-1] > 5*time.Second {
		t.Errorf("the last trickling connection closed after %v; want within 5 s (body_read_timeout 1s)", times[len(times)-1])
	}
}

// TestAnnouncedBodiesMemory: 64 connections announce 16 MiB bodies (the default limit) and
// trickle bytes; the router's memory grows with what it received, not with what was
// announced: peak RSS, and the heap in use, less than 50 MB over their baselines. (The heap is
// checked too because a buffer allocated for the announced length and never written may not
// count in RSS until the garbage collector recycles its pages.)
//
//	go test ./test/e2e -run TestAnnouncedBodiesMemory -v
func TestAnnouncedBodiesMemory(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	const n = 64
	up := newHoldingUpstream(t, 1)
	srv := startServeProcess(t, up.urls...)
	srv.settledGoroutines(t)
	base := srv.memKB(t, "VmRSS")
	baseHeap := heapInuse(t, srv.admin)
	host := strings.TrimPrefix(srv.api, "http://")
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_, _ = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 16<<20)
	}
	// Three seconds of a byte per connection every 100 ms.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for range 30 {
		<-tick.C
		for _, c := range conns {
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte(" "))
		}
	}
	peak := srv.memKB(t, "VmHWM")
	heap := heapInuse(t, srv.admin)
	growth, heapGrowth := float64(peak-base)/1024, (heap-baseHeap)/(1<<20)
	t.Logf("%d connections announcing 16 MiB bodies, 31 bytes sent each: router RSS %.1f MB before, peak %.1f MB: growth %.1f MB; heap in use %.1f -> %.1f MiB",
		n, float64(base)/1024, float64(peak)/1024, growth, baseHeap/(1<<20), heap/(1<<20))
	if growth >= 50 || heapGrowth >= 50 {
		t.Errorf("router peak RSS grew %.1f MB, heap in use %.1f MiB, for %d bytes received; want < 50 each", growth, heapGrowth, n*31)
	}
}

// heapInuse reads go_memstats_heap_inuse_bytes from the router's metrics.
func heapInuse(t *testing.T, admin string) float64 {
	t.Helper()
	var v float64
	if _, err := fmt.Sscan(strings.TrimPrefix(metricLine(metricsText(t, admin), "go_memstats_heap_inuse_bytes"), "go_memstats_heap_inuse_bytes "), &v); err != nil {
		t.Fatalf("go_memstats_heap_inuse_bytes: %v", err)
	}
	return v
}
