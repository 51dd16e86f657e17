package simserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFleet500Streams holds 500 concurrent streams on 8 instances at time-scale 0.1 and
// compares, request by request, the TTFT the client saw (wall time / 0.1) with the TTFT the
// engine model gave the same request (model time from its arrival to its first token, queueing
// included). The arrivals ramp evenly over -sim.ramp of wall time (2 s: 20 s of model time) and
// every stream asks for enough tokens to outlast the ramp (a step takes at least the profile's
// 12 ms of overhead), so all 500 are open at once at the end of the ramp (peak-streams says so).
// Prompts are a system prompt shared by a group (16 groups) plus a unique question. The client
// runs as its own process (a re-run of the test binary, -sim.client-process, on by default) so
// that its CPU is counted apart from the simulator's: server-cpu-ms and client-cpu-ms per round.
// The h2c variant multiplexes each instance's streams over one HTTP/2 connection.
//
//	go test -run '^$' -bench Fleet500 -benchtime 3x ./internal/simserver/ [-args -sim.prompt 8000]
func BenchmarkFleet500Streams(b *testing.B) {
	for _, h2c := range []bool{false, true} {
		c := fleetCase{instances: 8, streams: *benchStreams, prompt: *benchPrompt, h2c: h2c}
		name := fmt.Sprintf("instances=%d/streams=%d/prompt=%d", c.instances, c.streams, c.prompt)
		if c.h2c {
			name += "/h2c"
		}
		b.Run(name, func(b *testing.B) { benchFleet(b, c) })
	}
}

var (
	benchPrompt     = flag.Int("sim.prompt", 2000, "prompt tokens of BenchmarkFleet500Streams (half of them shared by a group)")
	benchStreams    = flag.Int("sim.streams", 500, "streams of BenchmarkFleet500Streams (fewer: the unloaded baseline)")
	benchRamp       = flag.Duration("sim.ramp", 2*time.Second, "wall time over which BenchmarkFleet500Streams's arrivals ramp")
	benchOutput     = flag.Int("sim.output", 0, "output tokens per stream of BenchmarkFleet500Streams (0: enough to outlast the ramp)")
	benchEvery      = flag.Duration("sim.interval", 0, "Options.StreamInterval of BenchmarkFleet500Streams (0: the default, 10 ms)")
	benchClientProf = flag.String("sim.client-cpuprofile", "", "write the client process's CPU profile to this file")
	benchProcess    = flag.Bool("sim.client-process", true, "run BenchmarkFleet500Streams's client as its own process")
)

type fleetCase struct {
	instances, streams, prompt int // prompt tokens, half of them the group's system prompt
	h2c                        bool
}

// clientConfig is what the benchmark's client does in one round; a client process gets it
// as JSON in the environment.
type clientConfig struct {
	URLs    []string
	Streams int
	Prompt  int // tokens
	Output  int // tokens
	Ramp    time.Duration
	Round   int
	H2C     bool
	Out     string // the client process writes its clientReport here
}

// clientReport is what one round's client saw.
type clientReport struct {
	TTFT  map[string]time.Duration // by request id, wall time
	Peak  int64                    // most streams open at once
	Fails int
	Err   string // the first failure
}

const (
	benchScale  = 0.1
	benchGroups = 16
	envClient   = "KVROUTE_SIM_BENCH_CLIENT"
)

func benchFleet(b *testing.B, c fleetCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fleet, err := StartFleet(ctx, Options{TimeScale: benchScale, StreamInterval: *benchEvery}, c.instances, "127.0.0.1", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	var (
		mu    sync.Mutex
		model = map[string]time.Duration{}
	)
	record := func(id string, ttft time.Duration) {
		mu.Lock()
		model[id] = ttft
		mu.Unlock()
	}
	for _, in := range fleet.Instances() {
		in.onFirst.Store(&record)
	}
	output := *benchOutput
	if output <= 0 {
		// A step takes at least the profile's overhead: the first stream is still open when
		// the last one arrives.
		minStep := 12 * time.Millisecond
		output = int(float64(*benchRamp)/benchScale/float64(minStep)) + 1
	}
	cfg := clientConfig{URLs: fleet.URLs(), Streams: c.streams, Prompt: c.prompt, Output: output, Ramp: *benchRamp, H2C: c.h2c}
	var (
		client, model90, client90 []float64 // model ms
		ratios                    []float64
		peak                      int64
		clientCPU                 time.Duration
	)
	b.ReportAllocs()
	cpu0 := cpuTime()
	round := 0
	for b.Loop() {
		cfg.Round = round
		var rep clientReport
		if *benchProcess {
			var cpu time.Duration
			rep, cpu, err = runClientProcess(ctx, b.TempDir(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			clientCPU += cpu
		} else {
			rep = runClient(ctx, cfg)
		}
		if rep.Fails > 0 {
			b.Fatalf("%d streams failed, the first: %s", rep.Fails, rep.Err)
		}
		peak = max(peak, rep.Peak)
		mu.Lock()
		for id, t := range rep.TTFT {
			m, ok := model[id]
			if !ok {
				mu.Unlock()
				b.Fatalf("request %s: no model TTFT recorded", id)
			}
			cm := t.Seconds() / benchScale * 1000
			client = append(client, cm)
			client90 = append(client90, cm)
			model90 = append(model90, m.Seconds()*1000)
			ratios = append(ratios, cm/(m.Seconds()*1000))
		}
		mu.Unlock()
		round++
	}
	b.StopTimer()
	serverCPU := cpuTime() - cpu0
	b.ReportMetric(float64(serverCPU.Milliseconds())/float64(round), "server-cpu-ms/round")
	if *benchProcess {
		b.ReportMetric(float64(clientCPU.Milliseconds())/float64(round), "client-cpu-ms/round")
	}
	var lag time.Duration
	var delay, writes int64
	for _, in := range fleet.Instances() {
		lag = max(lag, in.MaxLag())
		delay += in.firstWriteDelay.Load()
		writes += in.firstWrites.Load()
	}
	b.ReportMetric(float64(delay)/float64(max(writes, 1))/1e6, "first-write-delay-wall-ms")
	b.ReportMetric(lag.Seconds()*1000, "max-lag-wall-ms")
	b.ReportMetric(float64(peak), "peak-streams")
	b.ReportMetric(float64(output), "output-tokens")
	cMean, mMean := mean(client), mean(model90)
	slices.Sort(client90)
	slices.Sort(model90)
	slices.Sort(ratios)
	b.ReportMetric(cMean, "client-ttft-ms")
	b.ReportMetric(mMean, "model-ttft-ms")
	b.ReportMetric(cMean/mMean, "ttft-ratio")
	b.ReportMetric(pct(client90, 0.9), "client-p90-ttft-ms")
	b.ReportMetric(pct(model90, 0.9), "model-p90-ttft-ms")
	b.ReportMetric(pct(client90, 0.9)/pct(model90, 0.9), "p90-ratio")
	b.ReportMetric(pct(ratios, 0.9), "p90-of-request-ratios")
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(max(len(xs), 1))
}

// pct returns the q quantile of sorted xs (0 when empty).
func pct(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// runClientProcess runs one round's client as a re-run of this test binary and returns its
// report and the CPU time it used.
func runClientProcess(ctx context.Context, dir string, cfg clientConfig) (clientReport, time.Duration, error) {
	cfg.Out = filepath.Join(dir, "client.json")
	js, err := json.Marshal(cfg)
	if err != nil {
		return clientReport{}, 0, err
	}
	args := []string{"-test.run=^TestFleetClientProcess$", "-test.count=1"}
	if *benchClientProf != "" {
		args = append(args, "-test.cpuprofile="+*benchClientProf)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), envClient+"="+string(js))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return clientReport{}, 0, fmt.Errorf("client process: %w: %s", err, out)
	}
	var cpu time.Duration
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	raw, err := os.ReadFile(cfg.Out)
	if err != nil {
		return clientReport{}, 0, fmt.Errorf("client process: %w: %s", err, out)
	}
	var rep clientReport
	if err := json.Unmarshal(raw, &rep); err != nil {
		return clientReport{}, 0, fmt.Errorf("client process report: %w", err)
	}
	return rep, cpu, nil
}

// TestFleetClientProcess is BenchmarkFleet500Streams's client when the benchmark runs it as
// its own process; otherwise it is skipped.
func TestFleetClientProcess(t *testing.T) {
	js := os.Getenv(envClient)
	if js == "" {
		t.Skip("the client process of BenchmarkFleet500Streams")
	}
	var cfg clientConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep := runClient(ctx, cfg)
	raw, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Out, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// runClient opens cfg.Streams streams, arrivals ramping evenly over cfg.Ramp, each to
// instance i mod len(URLs), and reads them to the end.
func runClient(ctx context.Context, cfg clientConfig) clientReport {
	tr := &http.Transport{MaxIdleConns: cfg.Streams, MaxIdleConnsPerHost: cfg.Streams}
	if cfg.H2C {
		// HTTP/2 with prior knowledge: every instance's streams share one connection.
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	bodies := make([]string, cfg.Streams)
	for i := range bodies {
		prompt := fmt.Sprintf("r%d ", cfg.Round) + text(fmt.Sprintf("system prompt %d:", i%benchGroups), cfg.Prompt/2) + text(fmt.Sprintf(" question %d:", i), cfg.Prompt/2)
		bodies[i] = fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":%d}`, DefaultModel, prompt, cfg.Output)
	}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		inflight atomic.Int64
		rep      = clientReport{TTFT: make(map[string]time.Duration, cfg.Streams)}
	)
	start := time.Now()
	for i := range cfg.Streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTimer(time.Until(start.Add(time.Duration(i) * cfg.Ramp / time.Duration(cfg.Streams))))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			n := inflight.Add(1)
			defer inflight.Add(-1)
			id := fmt.Sprintf("r%d-%d", cfg.Round, i)
			ttft, err := oneStreamID(ctx, client, cfg.URLs[i%len(cfg.URLs)], bodies[i], id)
			mu.Lock()
			defer mu.Unlock()
			rep.Peak = max(rep.Peak, n)
			if err != nil {
				if rep.Fails == 0 {
					rep.Err = err.Error()
				}
				rep.Fails++
				return
			}
			rep.TTFT[id] = ttft
		}()
	}
	wg.Wait()
	return rep
}

// oneStream sends one streaming request and reads it to the end; it returns the wall time to
// the first token.
func oneStream(ctx context.Context, client *http.Client, url, body string) (time.Duration, error) {
	return oneStreamID(ctx, client, url, body, "")
}

// oneStreamID is oneStream with an x-request-id (when id is set).
func oneStreamID(ctx context.Context, client *http.Client, url, body, id string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	if id != "" {
		req.Header.Set("X-Request-Id", id)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	// A lean reader (ReadSlice, no allocation per line): the client shares the CPU with the
	// simulator, so it should cost as little as a load generator can.
	rd := bufio.NewReaderSize(resp.Body, 32<<10)
	var ttft time.Duration
	for range 1000000 {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			return 0, fmt.Errorf("stream ended without [DONE]: %w", err)
		}
		if ttft == 0 && bytes.Contains(line, []byte(`"text":" `)) {
			ttft = time.Since(start)
		}
		if bytes.Equal(line, []byte("data: [DONE]\n")) {
			return ttft, nil
		}
	}
	return 0, fmt.Errorf("stream ended without [DONE]")
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequest is the cost of one streaming completion of a 2000-token prompt and 10
// output tokens on an instant engine, client included.
func BenchmarkRequest(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet, err := StartFleet(ctx, Options{Profile: "instant"}, 1, "127.0.0.1", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":10}`, DefaultModel, text("bench", 2000))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := oneStream(ctx, client, fleet.URLs()[0], body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRequestKVEvents is BenchmarkRequest on an instance that publishes KV events (with
// no subscriber): the same prompt every time (its blocks stay cached: no BlockStored event)
// or a new prompt every time (125 blocks stored a request, with their token ids).
func BenchmarkRequestKVEvents(b *testing.B) {
	for _, unique := range []bool{false, true} {
		b.Run(fmt.Sprint("unique=", unique), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			fleet, err := StartFleet(ctx, Options{Profile: "instant", KVEvents: "tcp://127.0.0.1:0"}, 1, "127.0.0.1", 0)
			if err != nil {
				b.Fatal(err)
			}
			defer fleet.Close()
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			prompt := text("bench", 2000)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := prompt
				if unique {
					p = fmt.Sprintf("%08d", i) + prompt[8:]
					i++
				}
				body := fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":10}`, DefaultModel, p)
				if _, err := oneStream(ctx, client, fleet.URLs()[0], body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
