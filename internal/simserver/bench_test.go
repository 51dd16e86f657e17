package simserver

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFleet500Streams holds 500 concurrent streams on 8 instances in one process at
// time-scale 0.1 and compares the TTFT the clients see (wall time / 0.1) with the TTFT the
// engine model predicts for the same arrivals (the instances' TTFT histograms, model time).
// The ratio says how far the machine lags behind the model under this load. Prompts are a
// system prompt shared by a group (16 groups) plus a unique question; the arrivals are spread
// over 0.3 s of wall time and every stream lasts longer, so all 500 are open at once. The
// h2c variant multiplexes each instance's streams over one HTTP/2 connection. Longer prompts
// (-sim.prompt 8000) are closer to real chat traffic (the Mooncake trace's median prompt is
// 6.9k tokens): first tokens take long enough that a few milliseconds of delay matter less.
//
//	go test -run '^$' -bench Fleet500 -benchtime 3x ./internal/simserver/ [-args -sim.prompt 8000]
func BenchmarkFleet500Streams(b *testing.B) {
	for _, h2c := range []bool{false, true} {
		c := fleetCase{instances: 8, streams: 500, prompt: *benchPrompt, h2c: h2c}
		name := fmt.Sprintf("instances=%d/streams=%d/prompt=%d", c.instances, c.streams, c.prompt)
		if c.h2c {
			name += "/h2c"
		}
		b.Run(name, func(b *testing.B) { benchFleet(b, c) })
	}
}

var benchPrompt = flag.Int("sim.prompt", 2000, "prompt tokens of BenchmarkFleet500Streams (half of them shared by a group)")

type fleetCase struct {
	instances, streams, prompt int // prompt tokens, half of them the group's system prompt
	h2c                        bool
}

func benchFleet(b *testing.B, c fleetCase) {
	const (
		scale  = 0.1
		groups = 16                     // shared system prompts
		output = 300                    // tokens per stream: about 4.5 s of model time
		window = 300 * time.Millisecond // wall time over which the streams arrive (3 s of model time)
	)
	instances, streams, h2c := c.instances, c.streams, c.h2c
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet, err := StartFleet(ctx, Options{TimeScale: scale}, instances, "127.0.0.1", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	urls := fleet.URLs()
	tr := &http.Transport{MaxIdleConns: streams, MaxIdleConnsPerHost: streams}
	if h2c {
		// HTTP/2 with prior knowledge: every instance's streams share one connection.
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	bodies := make([]string, streams)
	for i := range bodies {
		prompt := text(fmt.Sprintf("system prompt %d:", i%groups), c.prompt/2) + text(fmt.Sprintf(" question %d:", i), c.prompt/2)
		bodies[i] = fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":%d}`, DefaultModel, prompt, output)
	}

	var ttfts []time.Duration
	var peak, failed atomic.Int64
	b.ReportAllocs()
	cpu0 := cpuTime()
	round := 0
	for b.Loop() {
		var (
			mu       sync.Mutex
			wg       sync.WaitGroup
			inflight atomic.Int64
		)
		// Arrivals spread over window: every stream lasts longer than that, so all 500 are
		// open at once.
		start := time.Now()
		for i := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Until(start.Add(time.Duration(i) * window / time.Duration(streams))))
				n := inflight.Add(1)
				defer inflight.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				body := strings.Replace(bodies[i], `"prompt":"`, fmt.Sprintf(`"prompt":"r%d `, round), 1)
				ttft, err := oneStream(ctx, client, urls[i%instances], body)
				if err != nil {
					failed.Add(1)
					return
				}
				mu.Lock()
				ttfts = append(ttfts, ttft)
				mu.Unlock()
			}()
		}
		wg.Wait()
		round++
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Milliseconds())/float64(round), "cpu-ms/round")
	if failed.Load() > 0 || len(ttfts) == 0 {
		b.Fatalf("%d streams failed", failed.Load())
	}
	var modelSum float64
	var modelN uint64
	for _, u := range urls {
		h := scrapeB(b, u)
		modelSum += h.sum
		modelN += h.count
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
	var clientSum time.Duration
	for _, t := range ttfts {
		clientSum += t
	}
	slices.Sort(ttfts)
	clientMean := clientSum.Seconds() / float64(len(ttfts)) / scale
	modelMean := modelSum / float64(modelN)
	b.ReportMetric(float64(peak.Load()), "peak-streams")
	b.ReportMetric(clientMean*1000, "client-ttft-ms")
	b.ReportMetric(modelMean*1000, "model-ttft-ms")
	b.ReportMetric(clientMean/modelMean, "ttft-ratio")
	b.ReportMetric(ttfts[len(ttfts)*99/100].Seconds()/scale*1000, "client-p99-ttft-ms")
}

// oneStream sends one streaming request and reads it to the end; it returns the wall time to
// the first token.
func oneStream(ctx context.Context, client *http.Client, url, body string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
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

type histSum struct {
	sum   float64
	count uint64
}

func scrapeB(b *testing.B, url string) histSum {
	b.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	fams, err := parseMetrics(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	h := fams["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram()
	return histSum{sum: h.GetSampleSum(), count: h.GetSampleCount()}
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
