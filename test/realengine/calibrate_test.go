package realengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/loadgen"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// simProfile is the engine profile fitted to this engine (internal/engine/profile.go), which
// `kvroute simulate` runs the same workload with.
const simProfile = "ollama-tiny-cpu"

// simRequestOverhead is the fitted TTFT outside the engine's steps (fit.RequestOverhead), which
// kvroute simulate adds as --network-latency, half each way (docs/fidelity.md).
const simRequestOverhead = 18 * time.Millisecond

// ollamaBatch is ollama's num_batch default: the prompt tokens one step computes.
const ollamaBatch = 512

// calPoint is one calibration request, alone on an idle engine.
type calPoint struct {
	// Tokens and Cached are the prompt and its part shared with an earlier prompt, in workload
	// tokens (4 bytes: the router's and the simulator's unit).
	Tokens int `json:"workload_tokens"`
	Cached int `json:"workload_cached"`
	// EngineTokens and EngineUsed are what ollama's log says: the prompt and what it reused.
	EngineTokens int     `json:"engine_tokens"`
	EngineUsed   int     `json:"engine_used"`
	TTFT         float64 `json:"ttft_ms"`
	// ITL is the median inter-token latency of the request's output, ms.
	ITL float64 `json:"itl_ms"`
}

// calibration is the calibration requests and the engine profile fitted to them.
type calibration struct {
	Points []calPoint `json:"points"`
	// EnginePerWorkloadToken is engine tokens over workload tokens of the cold prompts: how
	// much text one of this tokenizer's tokens holds, relative to the router's 4 bytes.
	EnginePerWorkloadToken float64 `json:"engine_tokens_per_workload_token"`
	Fit                    fit     `json:"fit"`
}

// fit is a profile's time constants, in the engine model's units (workload tokens).
type fit struct {
	// RequestOverhead is the TTFT outside the engine's steps (kvroute simulate
	// --network-latency RequestOverhead/2).
	RequestOverhead    time.Duration `json:"request_overhead_ns"`
	PrefillPerToken    time.Duration `json:"prefill_per_token_ns"`
	AttentionPerMPairs time.Duration `json:"attention_per_mpairs_ns"`
	DecodePerSeq       time.Duration `json:"decode_per_seq_ns"`
	DecodePerCtxToken  time.Duration `json:"decode_per_ctx_token_ns"`
	// MaxBatchedTokens is ollama's batch in workload tokens.
	MaxBatchedTokens int `json:"max_batched_tokens"`
	// TTFTRMSE is the root mean square error of the fitted TTFTs, ms.
	TTFTRMSE float64 `json:"ttft_rmse_ms"`
}

// calibrate measures lone requests on one fresh instance, sequentially: cold prompts of five
// sizes (two each), a repeated prompt (all cached), and a shared 1,504-token prefix with a new
// 208-token question (the workload's hit); 16 output tokens each for the inter-token latency;
// all of it rounds times (KVROUTE_REALENGINE_CALIBRATION_ROUNDS, default 1: more points
// average out a noisy machine). It then fits the engine model's constants to them
// (fitProfile).
func calibrate(t *testing.T, fl *fleet, dir string, rounds int) calibration {
	t.Helper()
	if err := mkdir(dir); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	p := fl.start(t, port, filepath.Join(dir, "ollama.log"))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	warmUp(t, url)
	before := slotsAtLeast(t, p.log, 1) // a fresh engine: the warm-up's line

	next := uint64(1 << 60) // block ids of their own: nothing shared with other prompts
	blocks := func(tokens int) []uint64 {
		out := make([]uint64, tokens/workload.GeneratedBlockTokens)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	var reqs []workload.Request
	var cached []int
	add := func(bs []uint64, hit int) {
		reqs = append(reqs, workload.Request{Blocks: bs, BlockTokens: workload.GeneratedBlockTokens, PromptTokens: len(bs) * workload.GeneratedBlockTokens, OutputTokens: 16})
		cached = append(cached, hit)
	}
	for range rounds {
		for _, n := range []int{256, 768, 1280, 1792, 2560} {
			for range 2 {
				add(blocks(n), 0)
			}
		}
		again := blocks(1792)
		add(again, 0)
		add(again, 1792)
		add(again, 1792)
		system := blocks(1504)
		add(append(slices.Clone(system), blocks(208)...), 0)
		add(append(slices.Clone(system), blocks(208)...), 1504)
		add(append(slices.Clone(system), blocks(208)...), 1504)
	}

	items := make([]loadgen.Item, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		items[i] = loadgen.Item{PromptTokens: r.PromptTokens, MaxTokens: r.OutputTokens, Prompt: func() string { return workload.Render(r) }}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*3*time.Minute)
	defer cancel()
	res, err := loadgen.Run(ctx, loadgen.Config{Target: url, Model: modelName, Concurrency: 1, RequestTimeout: time.Minute}, items)
	if err != nil {
		t.Fatalf("calibration requests: %v", err)
	}
	slots := slotsAtLeast(t, p.log, len(before)+len(reqs))[len(before):]
	if len(slots) != len(reqs) {
		t.Fatalf("the engine logged %d calibration requests, want %d", len(slots), len(reqs))
	}
	p.stop(t)

	var c calibration
	var engineCold, workloadCold int
	for i := range res.Records {
		r := &res.Records[i]
		if !r.OK() || r.TTFT <= 0 {
			t.Fatalf("calibration request %d: %s %s", i, r.ErrorLabel(), r.Err)
		}
		itl := make([]float64, len(r.ITL))
		for j, d := range r.ITL {
			itl[j] = ms(d)
		}
		c.Points = append(c.Points, calPoint{
			Tokens: reqs[i].PromptTokens, Cached: cached[i], EngineTokens: slots[i].prompt, EngineUsed: slots[i].used,
			TTFT: ms(r.TTFT), ITL: median(itl),
		})
		if cached[i] == 0 {
			engineCold += slots[i].prompt
			workloadCold += reqs[i].PromptTokens
		}
	}
	c.EnginePerWorkloadToken = float64(engineCold) / float64(workloadCold)
	c.Fit, err = fitProfile(c.Points, c.EnginePerWorkloadToken)
	if err != nil {
		t.Fatalf("fit: %v", err)
	}
	for _, pt := range c.Points {
		t.Logf("calibration: %4d tokens (%4d cached; engine %4d, used %4d): TTFT %6.1f ms, ITL %5.1f ms",
			pt.Tokens, pt.Cached, pt.EngineTokens, pt.EngineUsed, pt.TTFT, pt.ITL)
	}
	f := c.Fit
	t.Logf("fitted (workload tokens; %.3f engine tokens each): request overhead %v, prefill %v/token, attention %v/M pairs, "+
		"decode %v/seq + %v/context token, batch %d tokens; TTFT RMSE %.1f ms",
		c.EnginePerWorkloadToken, f.RequestOverhead, f.PrefillPerToken, f.AttentionPerMPairs, f.DecodePerSeq, f.DecodePerCtxToken, f.MaxBatchedTokens, f.TTFTRMSE)
	if prof, err := engine.LookupProfile(simProfile); err == nil {
		for _, pt := range c.Points {
			t.Logf("profile %s + %v: %4d tokens, %4d cached: predicts TTFT %6.1f ms, measured %6.1f", simProfile, simRequestOverhead,
				pt.Tokens, pt.Cached, ms(simRequestOverhead+prof.UnloadedTTFT(pt.Tokens, pt.Cached)), pt.TTFT)
		}
	}
	return c
}

// fitProfile fits the engine model to lone requests.
//
// A CPU engine's step has no fixed cost worth the name (no kernel launches, no all-reduce:
// StepOverhead 0); its lone decode step costs one sequence's matrix products plus reading its
// context, so the inter-token latencies fit DecodePerSeq + context x DecodePerCtxToken. A lone
// prefill of n tokens with h cached costs, in the engine model (engine.Profile.UnloadedTTFT),
// one step per chunk of MaxBatchedTokens (ollama's batch), each tokens x PrefillPerToken +
// attention pairs x AttentionPerMPairs; the measured TTFT adds what happens outside the engine
// model's steps (HTTP through the router and to the engine, the chat template, tokenization,
// the slot search), a constant per request that kvroute simulate's --network-latency (half of
// it each way) stands for. TTFT is thus linear in (per-request constant, PrefillPerToken,
// AttentionPerMPairs): the least-squares solution over the points, refitted without any that
// comes out negative. UnloadedTTFT itself computes the features, with one constant set to 1,
// so the fit uses the engine model's own chunking and hit rules.
func fitProfile(pts []calPoint, enginePerToken float64) (fit, error) {
	if len(pts) < 3 || enginePerToken <= 0 {
		return fit{}, errors.New("want at least 3 points and a token ratio")
	}
	batch := int(math.Round(ollamaBatch / enginePerToken))
	unit := func(p engine.Profile) engine.Profile {
		p.BlockSize, p.MaxBatchedTokens = workload.GeneratedBlockTokens, batch
		return p
	}
	perToken := unit(engine.Profile{PrefillPerToken: 1})
	perPair := unit(engine.Profile{AttentionPerMPairs: time.Millisecond}) // pairs, in ns
	x := make([][]float64, len(pts))
	y := make([]float64, len(pts))
	for i, p := range pts {
		x[i] = []float64{1, float64(perToken.UnloadedTTFT(p.Tokens, p.Cached)), float64(perPair.UnloadedTTFT(p.Tokens, p.Cached)) / 1e6}
		y[i] = p.TTFT * 1e6
	}
	coef, sse := nonNegativeLeastSquares(x, y)
	f := fit{
		RequestOverhead:    time.Duration(coef[0]),
		PrefillPerToken:    time.Duration(coef[1]),
		AttentionPerMPairs: time.Duration(coef[2]),
		MaxBatchedTokens:   batch,
		TTFTRMSE:           math.Sqrt(sse/float64(len(pts))) / 1e6,
	}
	dx := make([][]float64, len(pts))
	dy := make([]float64, len(pts))
	for i, p := range pts {
		dx[i] = []float64{1, float64(p.Tokens)}
		dy[i] = p.ITL * 1e6
	}
	d, _ := nonNegativeLeastSquares(dx, dy)
	f.DecodePerSeq, f.DecodePerCtxToken = time.Duration(d[0]), time.Duration(d[1])
	return f, nil
}

// nonNegativeLeastSquares minimises |x c - y|^2 over c >= 0 by trying every subset of the
// columns (there are at most a handful) and keeping the best solution that is non-negative.
// It returns the coefficients and the sum of squared errors.
func nonNegativeLeastSquares(x [][]float64, y []float64) ([]float64, float64) {
	k := len(x[0])
	best, bestSSE := make([]float64, k), math.Inf(1)
	for mask := 1; mask < 1<<k; mask++ {
		var cols []int
		for j := range k {
			if mask&(1<<j) != 0 {
				cols = append(cols, j)
			}
		}
		sub, ok := solveNormal(x, y, cols)
		if !ok || slices.ContainsFunc(sub, func(v float64) bool { return v < 0 }) {
			continue
		}
		c := make([]float64, k)
		for i, j := range cols {
			c[j] = sub[i]
		}
		var sse float64
		for i := range x {
			e := y[i]
			for j := range k {
				e -= x[i][j] * c[j]
			}
			sse += e * e
		}
		if sse < bestSSE {
			best, bestSSE = c, sse
		}
	}
	return best, bestSSE
}

// solveNormal solves the normal equations of the least-squares fit on the columns cols, by
// Gaussian elimination with partial pivoting; ok is false when they are singular.
func solveNormal(x [][]float64, y []float64, cols []int) ([]float64, bool) {
	n := len(cols)
	a := make([][]float64, n)
	for r := range n {
		a[r] = make([]float64, n+1)
		for c := range n {
			for i := range x {
				a[r][c] += x[i][cols[r]] * x[i][cols[c]]
			}
		}
		for i := range x {
			a[r][n] += x[i][cols[r]] * y[i]
		}
	}
	for c := range n {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12*math.Max(1, math.Abs(a[c][c])) {
			return nil, false
		}
		a[c], a[p] = a[p], a[c]
		for r := range n {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for k := c; k <= n; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	out := make([]float64, n)
	for r := range n {
		out[r] = a[r][n] / a[r][r]
	}
	return out, true
}

// simulate runs `kvroute simulate` with the fitted profile on the suite's workload and returns
// its results (nil, logged, when the profile is not built in).
func simulate(t *testing.T, kvroute, spec string, policies []string) []report.Result {
	t.Helper()
	if _, err := engine.LookupProfile(simProfile); err != nil {
		t.Logf("no %s profile: no simulated comparison", simProfile)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kvroute, "simulate", "--workload", spec, "--instances", fmt.Sprint(instances),
		"--profile", simProfile, "--network-latency", (simRequestOverhead / 2).String(), "--policies", strings.Join(policies, ","), "--seed", "1", "--json").Output()
	if err != nil {
		t.Errorf("kvroute simulate: %v", err)
		return nil
	}
	var doc struct{ Results []report.Result }
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Errorf("kvroute simulate --json: %v", err)
		return nil
	}
	return doc.Results
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
