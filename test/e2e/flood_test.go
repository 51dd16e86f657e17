package e2e

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

// TestTenantFlood measures whether one tenant flooding at ten times its requests-per-minute
// limit raises a well-behaved tenant's TTFT p99: three phases of the same length on the same
// fleet (two simulated Llama 3.1 8B on H100, real time): the good tenant alone, with the
// flooder sending at its limit, and with the flooder at 10x its limit. It takes about 90 s, so
// it runs only with KVROUTE_FLOOD=1:
//
//	KVROUTE_FLOOD=1 go test -run TestTenantFlood -v ./test/e2e/
func TestTenantFlood(t *testing.T) {
	if os.Getenv("KVROUTE_FLOOD") == "" {
		t.Skip("a 90 s measurement: set KVROUTE_FLOOD=1 to run it")
	}
	const (
		phase     = 15 * time.Second
		goodRate  = 10.0 // requests per second
		floodRPM  = 120  // the flooder's limit
		floodRate = floodRPM / 60.0
	)
	s := startTenantStack(t, 2, simserver.Options{Profile: "llama3-8b-h100-tp1", TimeScale: 1},
		"server: {shutdown_timeout: 5s}\n"+tenantYAML(map[string]string{
			"good":  "{requests_per_minute: 6000}",
			"flood": fmt.Sprintf("{requests_per_minute: %d}", floodRPM),
		}, "good=sk-good", "flood=sk-flood"), nil)
	rng := rand.New(rand.NewPCG(1, 2))
	system := strings.Repeat("You answer questions about the product catalogue precisely. ", 30) // ~450 tokens
	words := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa")
	randomText := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rng.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	var mu sync.Mutex
	goodBody := func() string {
		mu.Lock()
		defer mu.Unlock()
		return chatJSON(system+randomText(2000), `,"stream":true`)
	}
	floodBody := func() string {
		mu.Lock()
		defer mu.Unlock()
		return chatJSON(randomText(16000), "") // ~4000 tokens, nothing shared
	}
	client := &http.Client{Timeout: 30 * time.Second}
	send := func(key, body string) (status int, ttft time.Duration) {
		req, _ := http.NewRequest(http.MethodPost, s.api+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, 0
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			if strings.HasPrefix(line, "data: ") && ttft == 0 {
				ttft = time.Since(start)
			}
			if err != nil {
				break
			}
		}
		_, _ = io.Copy(io.Discard, br)
		return resp.StatusCode, ttft
	}
	// open runs f at rate per second for d, each call in its own goroutine, and waits for all.
	open := func(rate float64, d time.Duration, f func()) {
		var wg sync.WaitGroup
		n := int(rate * d.Seconds())
		interval := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		for i := range n {
			if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait) // pacing an open-loop load, not waiting for a result
			}
			wg.Go(f)
		}
		wg.Wait()
	}
	// drain empties the flooder's bucket (a minute's worth) so that a flood phase runs at
	// steady state: the flooder gets its limit, no more.
	drain := func() {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range floodRPM {
					if st, _ := send("sk-flood", chatJSON("x", "")); st == http.StatusTooManyRequests {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	open(goodRate, 2*time.Second, func() { send("sk-good", goodBody()) }) // warm the shared prefix

	run := func(name string, floodMul float64) result {
		var (
			rmu   sync.Mutex
			ttfts []time.Duration
			errs  int
			flood = map[int]int{}
			wg    sync.WaitGroup
		)
		if floodMul > 0 {
			drain()
			wg.Go(func() {
				open(floodRate*floodMul, phase, func() {
					st, _ := send("sk-flood", floodBody())
					rmu.Lock()
					flood[st]++
					rmu.Unlock()
				})
			})
		}
		open(goodRate, phase, func() {
			st, ttft := send("sk-good", goodBody())
			rmu.Lock()
			defer rmu.Unlock()
			if st != http.StatusOK || ttft == 0 {
				errs++
				return
			}
			ttfts = append(ttfts, ttft)
		})
		wg.Wait()
		r := result{name: name, ttfts: ttfts, goodErrs: errs, flood: flood}
		r.summarise(t)
		return r
	}
	pool := func(name string, rs ...result) result {
		p := result{name: name, flood: map[int]int{}}
		for _, r := range rs {
			p.ttfts = append(p.ttfts, r.ttfts...)
			p.goodErrs += r.goodErrs
			for k, v := range r.flood {
				p.flood[k] += v
			}
		}
		p.summarise(t)
		return p
	}
	// Alternate the two cases twice and pool each case's samples: one phase's p99 is noisy.
	alone := run("good alone", 0)
	a1 := run("flooder at its limit", 1)
	f1 := run("flooder at 10x limit", 10)
	a2 := run("flooder at its limit", 1)
	f2 := run("flooder at 10x limit", 10)
	atLimit := pool("pooled: at its limit", a1, a2)
	flooding := pool("pooled: at 10x limit", f1, f2)
	t.Logf("TTFT p99 ratio: 10x flood / at limit = %.2f, 10x flood / alone = %.2f",
		float64(flooding.p99)/float64(atLimit.p99), float64(flooding.p99)/float64(alone.p99))
	if flooding.goodErrs > 0 || flooding.flood[http.StatusTooManyRequests] == 0 {
		t.Errorf("good tenant failures %d, flooder 429s %d: want none and many", flooding.goodErrs, flooding.flood[http.StatusTooManyRequests])
	}
	// Not asserted: on a shared machine the wall-clock p99 measures the machine too (a busy
	// moment gives 1-2 s in any phase, alone included). The bar is asserted in virtual time by
	// internal/tenant's TestFloodVirtualTime.
	if float64(flooding.p99) > 1.2*float64(atLimit.p99) {
		t.Logf("flooding at 10x: p99 %.1f ms against %.1f ms at the limit, over the 20%% bar; compare with the good-alone p99 to tell the machine's noise", ms(flooding.p99), ms(atLimit.p99))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// result is one phase of TestTenantFlood: the good tenant's TTFTs, its failures, and the
// flooder's answers by status.
type result struct {
	name     string
	ttfts    []time.Duration
	p50, p99 time.Duration
	goodErrs int
	flood    map[int]int
}

func (r *result) summarise(t *testing.T) {
	slices.Sort(r.ttfts)
	if n := len(r.ttfts); n > 0 {
		r.p50 = r.ttfts[n/2]
		r.p99 = r.ttfts[min(n-1, int(float64(n)*0.99))]
	}
	t.Logf("%-22s good: %3d ok %d failed, TTFT p50 %6.1f ms p99 %6.1f ms; flooder statuses %v",
		r.name, len(r.ttfts), r.goodErrs, ms(r.p50), ms(r.p99), r.flood)
}
