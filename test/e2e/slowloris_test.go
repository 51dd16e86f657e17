package e2e

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

// TestSlowHeaders: 200 connections that never finish their headers neither stop normal
// requests nor stay open past server.read_header_timeout.
func TestSlowHeaders(t *testing.T) {
	const idle = 200
	s := startTenantStack(t, 1, simserver.Options{Profile: "instant"},
		"server: {read_header_timeout: 1s, shutdown_timeout: 5s}\n"+tenantYAML(nil, "a=sk-a"), nil)
	host := strings.TrimPrefix(s.api, "http://")
	conns := make([]net.Conn, 0, idle)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	start := time.Now()
	for range idle {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
		if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: "+host+"\r\nAuthorization: Bearer sk-a\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// Normal clients are served meanwhile.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, s.api+"/v1/chat/completions", strings.NewReader(chatJSON("hello", "")))
			req.Header.Set("Authorization", "Bearer sk-a")
			c := &http.Client{Timeout: 5 * time.Second}
			resp, err := c.Do(req)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs <- errors.New(resp.Status)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("normal request beside %d slow connections: %v", idle, err)
	}
	// Every slow connection is closed by the server soon after the header timeout.
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(start.Add(10 * time.Second))
		_, err := io.Copy(io.Discard, c) // returns at EOF (or a reset) when the server closes
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
	}
	if closed != idle {
		t.Errorf("%d of %d slow connections were closed within 10 s; want all (read_header_timeout 1s)", closed, idle)
	}
	t.Logf("%d slow connections closed after %v", closed, time.Since(start).Round(time.Millisecond))
}
