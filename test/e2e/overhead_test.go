package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	overheadFor           = flag.Duration("overhead", 0, "run TestOverhead for this long at -overhead-rate (0: skip)")
	overheadRate          = flag.Int("overhead-rate", 1000, "requests per second to the router, and as many to the simulator directly")
	overheadPolicy        = flag.String("overhead-policy", "least-request", "routing policy of the router in TestOverhead")
	kvrouteBin            = flag.String("kvroute-bin", "", "kvroute binary for the tests that start processes (empty: go build one)")
	overheadProcs         = flag.Int("overhead-gomaxprocs", 0, "GOMAXPROCS of the simulator and router processes in TestOverhead (0: Go's default, every CPU)")
	overheadProf          = flag.String("overhead-cpuprofile", "", "save the router process's CPU profile during TestOverhead to this file")
	overheadPhase         = flag.Duration("overhead-phase", 500*time.Millisecond, "TestOverhead: length of each phase in which every request takes one path (0: every path at every tick)")
	overheadNginx         = flag.Bool("overhead-nginx", false, "TestOverhead: also measure nginx (from PATH) proxying to the simulator, as a reference")
	overheadRouterServers = flag.String("overhead-router-servers", "builtin", "TestOverhead: one router per server.http_server value, comma-separated (builtin, net/http); the first is the one the targets are checked on")
	overheadBare          = flag.String("overhead-bare", "h1", "TestOverhead: also measure a bare reverse proxy for each of these bareproxy -transport values (h1, h1-server, net/http, fasthttp), comma-separated (empty: none)")
)

// chatBody4K is a non-streamed chat request of about 4 KB asking for one token.
func chatBody4K(i int) string {
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	return fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, model, sys, i)
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// TestOverhead measures the latency the router adds. The simulator (`kvroute sim --profile
// instant`), the router (`kvroute serve`) and, as the floor to compare with, a bare
// httputil.ReverseProxy (./bareproxy, kvroute's upstream transport, nothing else) run as their
// own processes, so that none shares a heap, a garbage collector or a scheduler with the load
// generator. One open-loop schedule sends 4 KB chat requests at -overhead-rate; in alternating
// phases of -overhead-phase (500 ms) all of them go to one path: straight to the simulator,
// through the router, or through the bare proxy, so that every path is measured at the same
// rate, and drifts of the machine fall on all of them alike. With -overhead-phase 0 every tick
// sends one request down each path at once instead (each path then shares the machine with the
// others' load). The router's and the simulator's CPU time per request come from /proc.
//
//	go test ./test/e2e -run TestOverhead -overhead 12s -overhead-rate 1000 -v
//	    [-overhead-router-servers builtin,net/http] [-overhead-bare h1,h1-server,h1-direct,net/http,fasthttp] [-overhead-nginx]
func TestOverhead(t *testing.T) {
	if *overheadFor <= 0 {
		t.Skip("run with -overhead 12s")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	bin := kvrouteBinary(t)
	var env []string
	if *overheadProcs > 0 {
		env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(*overheadProcs))
	}
	sim := startProcess(t, bin, env, func(f []string) (string, bool) {
		if len(f) > 2 && f[0] == "instance" && f[1] == "0:" {
			return f[2], true // instance 0: http://127.0.0.1:PORT model=...
		}
		return "", false
	}, "sim", "--profile", "instant", "--port", "0", "--model", model)
	var admin string
	startRouter := func(httpServer string, first bool) *process {
		return startProcess(t, bin, env, func(f []string) (string, bool) {
			if len(f) > 5 && f[2] == "api" {
				if first {
					admin = f[5]
				}
				return f[3], true // kvroute serve: api http://127.0.0.1:PORT admin http://127.0.0.1:PORT ...
			}
			return "", false
		}, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--model", model,
			"--policy", *overheadPolicy, "--endpoint", sim.addr, "--http-server", httpServer,
			"--pprof="+strconv.FormatBool(first && *overheadProf != ""))
	}
	servers := strings.Split(*overheadRouterServers, ",")
	router := startRouter(servers[0], true)
	type path struct {
		name  string
		base  string
		lat   []time.Duration // per tick; 0: not sent on this path, or failed
		ticks int             // ticks at which requests were sent on this path
		proc  *process        // the proxy's process, when it is one of ours
		cpu0  time.Duration
	}
	paths := []*path{{name: "direct", base: sim.addr}, {name: "router", base: router.addr}}
	if len(servers) > 1 || servers[0] != "builtin" {
		paths[1].name = "router (" + servers[0] + ")"
	}
	for _, srv := range servers[1:] {
		r := startRouter(srv, false)
		paths = append(paths, &path{name: "router (" + srv + ")", base: r.addr, proc: r})
	}
	for tp := range strings.SplitSeq(*overheadBare, ",") {
		if tp == "" {
			continue
		}
		bare := startProcess(t, goBuild(t, "github.com/kvroute/kvroute/test/e2e/bareproxy"), env, func(f []string) (string, bool) {
			if len(f) == 3 && f[0] == "bareproxy:" {
				return f[2], true // bareproxy: api http://127.0.0.1:PORT
			}
			return "", false
		}, "-listen", "127.0.0.1:0", "-upstream", sim.addr, "-transport", tp)
		paths = append(paths, &path{name: "bare proxy (" + tp + ")", base: bare.addr, proc: bare})
	}

	if *overheadNginx {
		paths = append(paths, &path{name: "nginx", base: startNginx(t, sim.addr)})
	}

	// Less garbage collection in the load generator: every path shares it, but its pauses
	// would only add noise to each distribution.
	defer debug.SetGCPercent(debug.SetGCPercent(800))
	const nBodies = 256
	bodies := make([][]byte, nBodies)
	for i := range bodies {
		bodies[i] = []byte(chatBody4K(i))
	}
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 2048, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	do := func(base string, body []byte) (time.Duration, error) {
		start := time.Now()
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(start), err
	}
	// Warm up connections and the processes on every path.
	for i := range 200 {
		for _, p := range paths {
			if _, err := do(p.base, bodies[i%nBodies]); err != nil {
				t.Fatalf("warm-up via %s: %v", p.name, err)
			}
		}
	}

	interval := time.Second / time.Duration(*overheadRate)
	n := int(*overheadFor / interval)
	for _, p := range paths {
		p.lat = make([]time.Duration, n)
	}
	lag := make([]time.Duration, n)
	var failures atomic.Int64
	var wg sync.WaitGroup
	profiled := make(chan error, 1)
	if *overheadProf != "" {
		secs := max(1, int(overheadFor.Seconds()))
		go func() { profiled <- saveURL(admin+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), *overheadProf) }()
	} else {
		profiled <- nil
	}
	cpuRouter0, cpuSim0 := router.cpu(t), sim.cpu(t)
	for _, p := range paths {
		if p.proc != nil {
			p.cpu0 = p.proc.cpu(t)
		}
	}
	rdRouter0, wrRouter0 := router.syscalls(t)
	phaseTicks := int(*overheadPhase / interval)
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d) // open-loop pacing
		}
		lag[i] = time.Since(due)
		body := bodies[i%nBodies]
		send := func(p *path) {
			p.ticks++
			wg.Go(func() {
				d, err := do(p.base, body)
				if err != nil {
					failures.Add(1)
					return
				}
				p.lat[i] = d
			})
		}
		if phaseTicks > 0 {
			send(paths[(i/phaseTicks)%len(paths)])
			continue
		}
		for k := range paths {
			send(paths[(i+k)%len(paths)]) // which path goes first rotates
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpuRouter, cpuSim := router.cpu(t)-cpuRouter0, sim.cpu(t)-cpuSim0
	for _, p := range paths {
		if p.proc != nil {
			p.cpu0 = p.proc.cpu(t) - p.cpu0 // now the CPU time over the run
		}
	}
	rdRouter, wrRouter := router.syscalls(t)
	rdRouter, wrRouter = rdRouter-rdRouter0, wrRouter-wrRouter0

	us := func(x time.Duration) string { return strconv.FormatFloat(float64(x)/1e3, 'f', 0, 64) + " µs" }
	mode := "every path at every tick"
	if phaseTicks > 0 {
		mode = "phases of " + overheadPhase.String() + ", one path each in turn"
	}
	lats := make([][]time.Duration, len(paths))
	sent := 0
	for k, p := range paths {
		for _, d := range p.lat {
			if d > 0 {
				lats[k] = append(lats[k], d)
			}
		}
		sent += len(lats[k])
	}
	t.Logf("GOMAXPROCS of the processes: %s; %d CPUs; policy %s", cmp.Or(strconv.Itoa(*overheadProcs), "default"), runtime.NumCPU(), *overheadPolicy)
	t.Logf("%s; %d ticks in %v: %.0f requests/s per path while sent to (%d/s asked), %d failures; send lag p50 %s p99 %s",
		mode, n, elapsed.Round(time.Millisecond), float64(len(lats[1]))/(float64(paths[1].ticks)*interval.Seconds()), *overheadRate,
		failures.Load(), us(percentile(lag, 0.5)), us(percentile(lag, 0.99)))
	d50, d99 := percentile(lats[0], 0.5), percentile(lats[0], 0.99)
	for k, p := range paths {
		p50, p99 := percentile(lats[k], 0.5), percentile(lats[k], 0.99)
		line := fmt.Sprintf("%-22s p50 %8s  p99 %8s", p.name+":", us(p50), us(p99))
		if k > 0 {
			line += fmt.Sprintf("   added to direct: p50 %8s  p99 %8s", us(p50-d50), us(p99-d99))
		}
		if p.proc != nil {
			line += fmt.Sprintf("   CPU per request %s", us(p.cpu0/time.Duration(max(len(lats[k]), 1))))
		}
		t.Log(line)
	}
	t.Logf("targets for the router's added latency: p50 200 µs, p99 2 ms")
	t.Logf("CPU per request: router %s, simulator %s (every path's requests counted for the simulator)",
		us(cpuRouter/time.Duration(max(len(lats[1]), 1))), us(cpuSim/time.Duration(max(sent, 1))))
	perReq := float64(max(len(lats[1]), 1))
	t.Logf("router system calls per request: %.1f reads, %.1f writes", float64(rdRouter)/perReq, float64(wrRouter)/perReq)
	if failures.Load() > 0 {
		t.Errorf("%d requests failed", failures.Load())
	}
	if err := <-profiled; err != nil {
		t.Errorf("router CPU profile: %v", err)
	}
}

// startNginx runs nginx (one process, no access log, keep-alive to the upstream) in front of
// upstream and returns its base URL; it is stopped when the test ends.
func startNginx(t *testing.T, upstream string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("-overhead-nginx: no nginx in PATH")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	conf := fmt.Sprintf(`daemon off; master_process off; worker_processes 1;
pid %[1]s/nginx.pid; error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body; proxy_temp_path %[1]s/proxy; fastcgi_temp_path %[1]s/fcgi;
  uwsgi_temp_path %[1]s/uwsgi; scgi_temp_path %[1]s/scgi;
  upstream sim { server %[2]s; keepalive 512; }
  server {
    listen %[3]s;
    location / { proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
}
`, dir, strings.TrimPrefix(upstream, "http://"), addr)
	file := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", file, "-e", filepath.Join(dir, "error.log"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not listen on %s within 10 s: %s", addr, b)
		}
	}
}

// saveURL writes the body of a GET of url to file.
func saveURL(url, file string) error {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // leaves no idle connection behind
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
}

// kvrouteBinary returns -kvroute-bin, or builds kvroute into a temporary directory.
func kvrouteBinary(t *testing.T) string {
	t.Helper()
	if *kvrouteBin != "" {
		return *kvrouteBin
	}
	return goBuild(t, "github.com/kvroute/kvroute/cmd/kvroute")
}

// goBuild builds the command pkg into a temporary directory.
func goBuild(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), path.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// process is a kvroute child process and the address it announced.
type process struct {
	cmd  *exec.Cmd
	addr string
}

// startProcess runs bin with args (and env, when not nil) and waits (30 s at most) for a stdout line whose fields
// addr recognises; the process is interrupted, then killed after 20 s, when the test ends. Its
// stderr (access logs) goes to the null device.
func startProcess(t *testing.T, bin string, env []string, addr func(fields []string) (string, bool), args ...string) *process {
	t.Helper()
	return startProcessLogged(t, bin, env, nil, addr, args...)
}

// startProcessLogged is startProcess with the process's stderr going to stderr (nil: the null
// device).
func startProcessLogged(t *testing.T, bin string, env []string, stderr io.Writer, addr func(fields []string) (string, bool), args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env // nil: this process's environment
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd}
	got := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) > 0 {
				if a, ok := addr(f); ok {
					got <- a
					break
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { <-read; done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case a := <-got:
		p.addr = a
	case <-time.After(30 * time.Second):
		t.Fatalf("%s %s did not announce its address", bin, args[0])
	}
	return p
}

// cpu returns the user and system CPU time the process has used (from /proc, 10 ms steps).
func (p *process) cpu(t *testing.T) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		t.Fatalf("short /proc stat %q", b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("bad /proc stat %q", b)
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond
}

// syscalls returns the read and write system calls the process has made (from /proc).
func (p *process) syscalls(t *testing.T) (reads, writes int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			reads, _ = strconv.ParseInt(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(l, "syscw: "); ok {
			writes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return reads, writes
}
