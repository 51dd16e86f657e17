package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	streamsHeap = flag.String("streams-heap", "", "save the router's heap profile to this file when every stream is open")
	streamsN    = flag.Int("streams", 0, "concurrent streams in TestConcurrentStreams (0: 2000, or 200 with -short or -race)")
)

// TestConcurrentStreams holds many streams open through a `kvroute serve` process at once,
// measures the growth of that process's peak resident memory (VmHWM) over its resident
// memory before the streams, then ends them all and checks that the router and the engines
// let go of every request and that the router's goroutine count returns to its baseline
// (this process's goroutines are checked by goleak in TestMain).
//
//	go test ./test/e2e -run TestConcurrentStreams -v            # 2000 streams
func TestConcurrentStreams(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	n := *streamsN
	if n == 0 {
		n = 2000
		if testing.Short() || raceEnabled {
			n = 200
		}
	}
	// A light upstream that holds each stream open, sending an event a second, so that the
	// router's cost is what is measured (the simulator's engine loop would dominate a small
	// machine long before 2,000 streams).
	up := newHoldingUpstream(t, 4)
	srv := startServeProcess(t, up.urls...)

	tr := &http.Transport{MaxIdleConnsPerHost: n, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	// The baseline is taken once the router has settled: its first health checks and scrapes
	// open keep-alive connections (two goroutines each) a moment after it starts.
	baseG := srv.settledGoroutines(t)
	baseRSS := srv.memKB(t, "VmRSS")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opened, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"stream %d"}]}`, model, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.api+"/v1/chat/completions", strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				failed.Add(1)
				return
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
				failed.Add(1)
				return
			}
			opened.Add(1)
			_, _ = io.Copy(io.Discard, br) // until the client cancels
		})
	}
	deadline := time.Now().Add(120 * time.Second)
	for opened.Load()+failed.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	ramp := time.Since(start)
	inFlight := srv.inFlight(t)
	peakG := srv.goroutines(t)
	hwm := srv.memKB(t, "VmHWM")
	if *streamsHeap != "" {
		if resp, err := http.Get(srv.admin + "/debug/pprof/heap"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			_ = os.WriteFile(*streamsHeap, b, 0o600)
		}
	}
	growth := float64(hwm-baseRSS) / 1024
	t.Logf("%d streams open in %v (%d failed); router in flight %d, goroutines %d -> %d; RSS %.1f MB, peak %.1f MB: growth %.1f MB",
		opened.Load(), ramp.Round(time.Millisecond), failed.Load(), inFlight, baseG, peakG, float64(baseRSS)/1024, float64(hwm)/1024, growth)
	m := metricsText(t, srv.admin)
	t.Logf("router at peak: %s", strings.Join([]string{metricLine(m, "go_memstats_heap_inuse_bytes"), metricLine(m, "go_memstats_stack_inuse_bytes")}, "; "))
	if opened.Load() != int64(n) || inFlight != n {
		t.Errorf("opened %d, in flight %d, want %d", opened.Load(), inFlight, n)
	}
	if growth > 200 {
		t.Errorf("router peak memory growth %.1f MB > 200 MB", growth)
	}
	cancel()
	wg.Wait()
	deadline = time.Now().Add(60 * time.Second)
	busy := func() int {
		return srv.inFlight(t) + int(up.active.Load())
	}
	// Idle keep-alive connections to the upstreams keep two goroutines each: allow a few.
	const slack = 20
	for (busy() > 0 || srv.goroutines(t) > baseG+slack) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if b := busy(); b > 0 {
		t.Errorf("%d requests still held by the router or the engines after every client left", b)
	}
	if g := srv.goroutines(t); g > baseG+slack {
		t.Errorf("router goroutines %d after the streams ended, %d before", g, baseG)
	}
}

// settledGoroutines waits until the router's goroutine count has stayed the same for a second
// (15 s at most) and returns it.
func (p *serveProcess) settledGoroutines(t *testing.T) int {
	t.Helper()
	g, since := p.goroutines(t), time.Now()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if now := p.goroutines(t); now != g {
			g, since = now, time.Now()
		} else if time.Since(since) >= time.Second {
			break
		}
	}
	return g
}

// serveProcess is a `kvroute serve` child process.
type serveProcess struct {
	cmd        *exec.Cmd
	api, admin string
}

// startServeProcess builds kvroute and runs `kvroute serve` in front of urls.
func startServeProcess(t *testing.T, urls ...string) *serveProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kvroute")
	build := exec.Command("go", "build", "-o", bin, "github.com/kvroute/kvroute/cmd/kvroute")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// The upstreams here are bare fakes that no probe can tell the kind of: say it (vllm: health
	// on /health, which they answer).
	args := []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--model", model, "--engine", "vllm", "--policy", "least-request", "--pprof"}
	for _, u := range urls {
		args = append(args, "--endpoint", u)
	}
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serveProcess{cmd: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	lines := bufio.NewScanner(stdout)
	got := make(chan []string, 1)
	go func() {
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) > 5 && f[2] == "api" {
				got <- []string{f[3], f[5]}
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case a := <-got:
		p.api, p.admin = a[0], a[1]
	case <-time.After(30 * time.Second):
		t.Fatal("kvroute serve did not start")
	}
	return p
}

func (p *serveProcess) memKB(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb
		}
	}
	t.Fatalf("no %s in /proc status", field)
	return 0
}

func (p *serveProcess) goroutines(t *testing.T) int {
	t.Helper()
	for l := range strings.SplitSeq(metricsText(t, p.admin), "\n") {
		if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
			var n int
			fmt.Sscan(v, &n)
			return n
		}
	}
	t.Fatal("no go_goroutines in the router's metrics")
	return 0
}

func (p *serveProcess) inFlight(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(p.admin + "/debug/endpoints")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Endpoints []struct {
			InFlight int `json:"in_flight"`
		} `json:"endpoints"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range v.Endpoints {
		n += e.InFlight
	}
	return n
}

// holdingUpstream is n OpenAI-like servers whose chat streams send one chunk a second until the
// client goes away; active counts the streams open.
type holdingUpstream struct {
	urls   []string
	active atomic.Int64
}

func newHoldingUpstream(t *testing.T, n int) *holdingUpstream {
	t.Helper()
	u := &holdingUpstream{}
	for range n {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			if r.URL.Path != "/v1/chat/completions" {
				w.WriteHeader(http.StatusOK)
				return
			}
			u.active.Add(1)
			defer u.active.Add(-1)
			w.Header().Set("Content-Type", "text/event-stream")
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				if _, err := io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"x"}}]}`+"\n\n"); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-tick.C:
				}
			}
		}))
		t.Cleanup(srv.Close)
		u.urls = append(u.urls, srv.URL)
	}
	return u
}

// metricLine returns the sample line of an unlabelled metric.
func metricLine(text, name string) string {
	for l := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return name + " (absent)"
}
