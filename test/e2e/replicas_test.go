package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReplicas runs three `kvroute serve` replicas that share what they learn (peers:) behind
// HAProxy (balance roundrobin), in front of four `kvroute sim` instances, beside one router
// alone in front of four others, and checks what issue #14 asks of them:
//
//  1. kvroute bench replays the same shared-prefix workload through both at once: the
//     replicas' hit rate is within 0.03 of the lone router's;
//  2. a replica is killed mid-run: only requests in flight through it fail, and each succeeds
//     when the client sends it again through HAProxy;
//  3. it starts again: ready only once warm (a peer's snapshot), its first requests hit;
//  4. a replica is cut off from its peers (fault injection: its gossip and streams dropped
//     both ways, long enough for the others to declare it dead): no request fails, and once it
//     is let back and rejoined, the hit rate is what it was before the cut.
//
// Everything is on loopback; it skips without haproxy (Debian package haproxy, which .ci/run
// installs).
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("about 2 minutes; skipped with -short")
	}
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (apt-get install haproxy)")
	}
	bin := kvrouteBinary(t)
	dir, secret := peersDir(t)
	fleetA := startSimFleet(t, bin, 4)
	fleetB := startSimFleet(t, bin, 4)

	// The lone router, and the three replicas, each with its own ports (fixed, so that a
	// replica restarts on the same ones).
	lone := startServe(t, bin, writeServeConfig(t, dir, "lone", fleetA, nil, [3]int{}, secret))
	ports := freePorts(t, 12)
	var gossip []string
	for i := range 3 {
		gossip = append(gossip, fmt.Sprintf("127.0.0.1:%d", ports[9+i]))
	}
	cfgs := make([]string, 3)
	reps := make([]*serveProc, 3)
	for i := range 3 {
		name := fmt.Sprintf("r%d", i+1)
		cfgs[i] = writeServeConfig(t, dir, name, fleetB, gossip, [3]int{ports[3*i], ports[3*i+1], ports[3*i+2]}, secret)
		reps[i] = startServe(t, bin, cfgs[i])
	}
	for _, r := range reps {
		waitReady(t, r.admin, 30*time.Second)
	}
	for _, r := range reps {
		waitFollowing(t, r.admin, 2, 30*time.Second)
	}
	lb := startHAProxy(t, haproxy, dir, reps)

	// 1. The same workload through the lone router and through the replicas, at once.
	workload := "shared-prefix:groups=32,prompts=10,system=2048,question=128,output=16"
	var wg sync.WaitGroup
	var one, three benchResult
	wg.Go(func() { one = runBench(t, bin, lone.api, workload, 12) })
	wg.Go(func() { three = runBench(t, bin, lb, workload, 12) })
	wg.Wait()
	t.Logf("lone router: hit rate %.3f, TTFT mean %.0f ms, %d failed; 3 replicas behind HAProxy: hit rate %.3f, TTFT mean %.0f ms, %d failed",
		one.HitRate, one.TTFT.Mean, one.Failed, three.HitRate, three.TTFT.Mean, three.Failed)
	if one.Failed+three.Failed > 0 || one.Completed == 0 {
		t.Errorf("failed requests: %d alone, %d through the replicas", one.Failed, three.Failed)
	}
	if d := one.HitRate - three.HitRate; d > 0.03 {
		t.Errorf("replicas' hit rate %.3f is %.3f below the lone router's %.3f (want within 0.03)", three.HitRate, d, one.HitRate)
	}

	// 2. r2 is killed while requests run through it.
	prompts := sharedPrompts(2, 24, 10)
	// goneAt is when the killed process was reaped: until then its sockets may still take a
	// request (the kernel queues connections on its listener until the process is gone), so a
	// request sent through it then is as much in flight as one it was serving.
	var killedAt, goneAt time.Time
	gone := make(chan struct{})
	var completed atomic.Int64
	recs := sendAll(lb, prompts, 8, func() {
		if completed.Add(1) == 80 {
			killedAt = time.Now()
			_ = reps[1].cmd.Process.Kill()
			go func() {
				_ = reps[1].cmd.Wait()
				goneAt = time.Now()
				close(gone)
			}()
		}
	})
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the killed replica was not reaped within 30 s")
	}
	t.Logf("kill: the replica was reaped %v after the signal", goneAt.Sub(killedAt).Round(time.Microsecond))
	var failed []chatRec
	for _, r := range recs {
		if r.err != nil {
			failed = append(failed, r)
		}
	}
	t.Logf("kill: %d of %d requests failed", len(failed), len(recs))
	if len(failed) > 8 {
		t.Errorf("%d requests failed when one replica was killed; at most its in-flight ones (8 clients) may", len(failed))
	}
	for _, r := range failed {
		if r.start.After(goneAt) {
			t.Errorf("a request started %v after the killed replica was gone failed: %v", r.start.Sub(goneAt), r.err)
		}
		if again := sendAll(lb, []prompt{r.p}, 1, nil)[0]; again.err != nil {
			t.Errorf("a failed request sent again through HAProxy failed again: %v", again.err)
		}
	}

	// 3. r2 starts again on the same ports: warm before ready; its first requests hit.
	reps[1] = startServe(t, bin, cfgs[1])
	waitReady(t, reps[1].admin, 30*time.Second)
	if v := metricValue(t, reps[1].admin, `kvroute_peer_warm_starts_total{result="ok"}`); v != 1 {
		t.Errorf("restarted replica: warm starts ok = %v, want 1", v)
	}
	var first []prompt
	for g := range 12 {
		p := prompts[g*20] // 12 of the 24 groups (shuffled)
		first = append(first, prompt{group: p.group, system: p.system, question: "a new question for the restarted replica " + fmt.Sprint(g)})
	}
	// One at a time, each after asking /debug/explain how it would be ranked: a miss then says
	// whether the restarted replica's index lacked the prefix or ranked another endpoint first.
	client := &http.Client{Timeout: 60 * time.Second}
	var direct []chatRec
	hits := 0
	for _, p := range first {
		why := explain(client, reps[1].admin, p)
		r := chat(client, reps[1].api, p)
		direct = append(direct, r)
		if r.err == nil && r.cached > 0 {
			hits++
			continue
		}
		t.Logf("restarted replica: group %d missed (err %v); /debug/explain before it: %s", p.group, r.err, why)
	}
	predicted := metricValue(t, reps[1].admin, `kvroute_predicted_cached_tokens_total{model="`+model+`"}`)
	t.Logf("restarted replica: %d of %d first requests hit; predicted cached tokens %v", hits, len(direct), predicted)
	if hits < 11 || predicted == 0 {
		t.Errorf("restarted replica: %d of 12 first requests hit (want 11 or more), predicted cached tokens %v: not warm", hits, predicted)
	}
	waitFollowing(t, reps[1].admin, 2, 30*time.Second)
	for _, i := range []int{0, 2} {
		waitFollowing(t, reps[i].admin, 2, 30*time.Second)
	}

	// 4. r3 is cut off from its peers, then let back.
	window := func(seed uint64) float64 {
		t.Helper()
		recs := sendAll(lb, sharedPrompts(seed, 16, 8), 6, nil)
		var hit, all int
		for _, r := range recs {
			if r.err != nil {
				t.Errorf("seed %d: a request failed: %v", seed, r.err)
				continue
			}
			hit += r.cached
			all += r.prompt
		}
		return float64(hit) / float64(max(all, 1))
	}
	before := window(3)
	isolate(t, reps[2].admin, true)
	waitFollowing(t, reps[0].admin, 1, 30*time.Second) // r1 declared r3 dead
	cut := window(4)
	isolate(t, reps[2].admin, false)
	for _, r := range reps {
		waitFollowing(t, r.admin, 2, 30*time.Second)
	}
	after := window(5)
	t.Logf("hit rate before the cut %.3f, during %.3f, after the rejoin %.3f", before, cut, after)
	if after < before-0.03 {
		t.Errorf("hit rate after the rejoin %.3f, before the cut %.3f: not recovered", after, before)
	}
}

// peersDir returns a temporary directory holding a shared secret for replicas, and its path.
func peersDir(t *testing.T) (dir, secret string) {
	t.Helper()
	dir = t.TempDir()
	secret = filepath.Join(dir, "peers.key")
	if err := os.WriteFile(secret, []byte("e2e replicas share this secret, 32+ bytes long\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, secret
}

// startSimFleet runs `kvroute sim` with n H100-TP4 instances on free ports and returns their
// URLs.
func startSimFleet(t *testing.T, bin string, n int) []string {
	t.Helper()
	var urls []string
	last := fmt.Sprintf("%d:", n-1)
	startProcess(t, bin, nil, func(f []string) (string, bool) {
		if len(f) > 2 && f[0] == "instance" {
			urls = append(urls, f[2])
			return f[2], f[1] == last
		}
		return "", false
	}, "sim", "--instances", fmt.Sprint(n), "--port", "0", "--profile", "llama3-70b-h100-tp4", "--model", model)
	return urls
}

// serveProc is a `kvroute serve` process.
type serveProc struct {
	*process
	api, admin string
}

func startServe(t *testing.T, bin, cfg string) *serveProc {
	t.Helper()
	s := &serveProc{}
	s.process = startProcess(t, bin, nil, func(f []string) (string, bool) {
		if len(f) > 5 && f[2] == "api" {
			s.admin = f[5]
			return f[3], true // kvroute serve: api http://... admin http://...
		}
		return "", false
	}, "serve", "--config", cfg)
	s.api = s.addr
	return s
}

// writeServeConfig writes a router config for endpoints; with gossip addresses, that of a
// replica whose API, admin and peer stream ports are ports (so that it restarts on the same),
// and whose gossip address is the one of gossip its name's digit picks.
func writeServeConfig(t *testing.T, dir, name string, endpoints, gossip []string, ports [3]int, secret string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:%d\nadmin_listen: 127.0.0.1:%d\nauth: {mode: none}\npolicy: {name: prefix-aware}\n", ports[0], ports[1])
	b.WriteString("log: {level: warn}\nhealth: {interval: 1s, timeout: 500ms}\nscrape: {interval: 200ms}\nserver: {shutdown_timeout: 5s}\nendpoints:\n")
	for _, u := range endpoints {
		fmt.Fprintf(&b, "  - {url: %q, models: [%s], engine: vllm}\n", u, model)
	}
	if len(gossip) > 0 {
		i := int(name[1] - '1')
		fmt.Fprintf(&b, "peers:\n  name: %s\n  listen: 127.0.0.1:%d\n  gossip_listen: %s\n  static: [%s]\n", name, ports[2], gossip[i], strings.Join(gossip, ", "))
		fmt.Fprintf(&b, "  secret_file: %s\n  warm_start_timeout: 10s\n  rejoin_interval: 1s\n  fault_injection: true\n", secret)
	}
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// freePorts returns n loopback TCP ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// startHAProxy runs haproxy in the foreground in front of the replicas, round-robin, health
// checked on /readyz, retrying connection failures elsewhere; it returns its URL.
func startHAProxy(t *testing.T, bin, dir string, reps []*serveProc) string {
	t.Helper()
	port := freePorts(t, 1)[0]
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 2000
defaults
  mode http
  timeout connect 1s
  timeout client 60s
  timeout server 60s
  option http-no-delay
  retries 3
  option redispatch 1
  retry-on all-retryable-errors
frontend fe
  bind 127.0.0.1:%d
  default_backend replicas
backend replicas
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 300ms fall 1 rise 1
`, port)
	for i, r := range reps {
		api := strings.TrimPrefix(r.api, "http://")
		admin := strings.TrimPrefix(r.admin, "http://")
		_, aport, _ := net.SplitHostPort(admin)
		fmt.Fprintf(&b, "  server r%d %s check port %s\n", i+1, api, aport)
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-f", cfg, "-db")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		if resp, err := http.Get(url + "/v1/models"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		select {
		case <-done:
			t.Fatalf("haproxy exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy not serving after 20 s: %s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type benchResult struct {
	Completed int     `json:"completed"`
	Failed    int     `json:"failed"`
	HitRate   float64 `json:"hit_rate"`
	TTFT      struct {
		Mean float64 `json:"mean"`
	} `json:"ttft_ms"`
}

// runBench runs kvroute bench against target and returns its result.
func runBench(t *testing.T, bin, target, workload string, rate float64) benchResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--target", target, "--workload", workload, "--rate", fmt.Sprint(rate),
		"--model", model, "--json", "--quiet", "--seed", "7")
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("kvroute bench %s: %v", target, err)
		return benchResult{}
	}
	var s struct {
		Results []benchResult `json:"results"`
	}
	if err := json.Unmarshal(out, &s); err != nil || len(s.Results) != 1 {
		t.Errorf("kvroute bench output: %v: %s", err, out)
		return benchResult{}
	}
	return s.Results[0]
}

func waitReady(t *testing.T, admin string, d time.Duration) {
	t.Helper()
	waitFor(t, d, admin+" ready", func() bool {
		resp, err := http.Get(admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// waitFollowing waits until the replica at admin follows n peers' event streams.
func waitFollowing(t *testing.T, admin string, n int, d time.Duration) {
	t.Helper()
	waitFor(t, d, fmt.Sprintf("%s following %d peers", admin, n), func() bool {
		resp, err := http.Get(admin + "/debug/peers")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			Following []string `json:"following"`
		}
		return json.NewDecoder(resp.Body).Decode(&st) == nil && len(st.Following) == n
	})
}

func isolate(t *testing.T, admin string, on bool) {
	t.Helper()
	resp, err := http.Post(fmt.Sprintf("%s/debug/peers/isolate?on=%v", admin, on), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("isolate: %s", resp.Status)
	}
}

// metricValue reads one series' value from a router's /metrics (0 when absent).
func metricValue(t *testing.T, admin, series string) float64 {
	t.Helper()
	var v float64
	for l := range strings.SplitSeq(metricsText(t, admin), "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			fmt.Sscan(rest, &v)
		}
	}
	return v
}

// prompt is one chat request of a shared-prefix workload.
type prompt struct {
	group            int
	system, question string
}

// sharedPrompts is groups x per prompts, each group's sharing a system prompt of about 2,000
// tokens, shuffled.
func sharedPrompts(seed uint64, groups, per int) []prompt {
	r := rand.New(rand.NewPCG(seed, 99))
	words := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango")
	var out []prompt
	for g := range groups {
		var sys strings.Builder
		fmt.Fprintf(&sys, "System prompt %d of run %d. ", g, seed)
		for sys.Len() < 8000 {
			sys.WriteString(words[r.IntN(len(words))] + " ")
		}
		for q := range per {
			out = append(out, prompt{group: g, system: sys.String(), question: fmt.Sprintf("Question %d of group %d: %s?", q, g, words[r.IntN(len(words))])})
		}
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// chatRec is one request's outcome.
type chatRec struct {
	p              prompt
	start          time.Time
	err            error
	prompt, cached int
}

// sendAll sends every prompt, streaming, from concurrency clients; done (when set) is called
// after each completion.
func sendAll(base string, prompts []prompt, concurrency int, done func()) []chatRec {
	out := make([]chatRec, len(prompts))
	var next atomic.Int64
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second}
	for range concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(prompts) {
					return
				}
				out[i] = chat(client, base, prompts[i])
				if done != nil {
					done()
				}
			}
		})
	}
	wg.Wait()
	client.CloseIdleConnections()
	return out
}

// chat sends one streamed chat request and reads it to its end.
// explain returns how the router at admin's /debug/explain ranks p's request: each candidate in
// order, as endpoint cached tokens / in flight, and "over" when over the load bound.
func explain(client *http.Client, admin string, p prompt) string {
	resp, err := client.Post(admin+"/debug/explain", "application/json", bytes.NewReader(chatBody(p)))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var ex struct {
		Candidates []struct {
			Endpoint     string `json:"endpoint"`
			InFlight     int    `json:"in_flight"`
			CachedTokens int    `json:"cached_tokens"`
			WithinBound  bool   `json:"within_bound"`
		} `json:"candidates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ex); err != nil {
		return resp.Status + ": " + err.Error()
	}
	var sb strings.Builder
	for _, c := range ex.Candidates {
		fmt.Fprintf(&sb, "%s %d/%d", c.Endpoint, c.CachedTokens, c.InFlight)
		if !c.WithinBound {
			sb.WriteString(" over")
		}
		sb.WriteString("; ")
	}
	return sb.String()
}

// chatBody is p's streamed chat request, asking for usage.
func chatBody(p prompt) []byte {
	body, _ := json.Marshal(map[string]any{
		"model": model, "stream": true, "max_tokens": 8, "stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{{"role": "system", "content": p.system}, {"role": "user", "content": p.question}},
	})
	return body
}

func chat(client *http.Client, base string, p prompt) chatRec {
	rec := chatRec{p: p, start: time.Now()}
	resp, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(chatBody(p)))
	if err != nil {
		rec.err = err
		return rec
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		rec.err = fmt.Errorf("%s: %s", resp.Status, b)
		return rec
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	complete := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			complete = true
			break
		}
		var chunk struct {
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &chunk) == nil && chunk.Usage != nil {
			rec.prompt = chunk.Usage.PromptTokens
			if chunk.Usage.Details != nil {
				rec.cached = chunk.Usage.Details.CachedTokens
			}
		}
	}
	if !complete {
		rec.err = fmt.Errorf("stream ended before [DONE] (%v)", sc.Err())
	}
	return rec
}
