package realengine

import (
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
)

// fitProfile recovers the constants of a known profile from the TTFTs and ITLs it implies.
func TestFitProfile_RecoversAKnownProfile(t *testing.T) {
	const ratio = 0.8 // engine tokens per workload token: batch 640 workload tokens
	const overhead = 12 * time.Millisecond
	want := engine.Profile{
		BlockSize: 16, MaxBatchedTokens: 640,
		PrefillPerToken: 250 * time.Microsecond, AttentionPerMPairs: 40 * time.Millisecond,
		DecodePerSeq: 2 * time.Millisecond, DecodePerCtxToken: 500 * time.Nanosecond,
	}
	var pts []calPoint
	for _, c := range [][2]int{{256, 0}, {768, 0}, {1280, 0}, {1792, 0}, {2560, 0}, {1792, 1792}, {1712, 1504}} {
		itl := want.DecodePerSeq + time.Duration(c[0])*want.DecodePerCtxToken
		pts = append(pts, calPoint{Tokens: c[0], Cached: c[1], TTFT: ms(overhead + want.UnloadedTTFT(c[0], c[1])), ITL: ms(itl)})
	}
	got, err := fitProfile(pts, ratio)
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, g, w time.Duration) {
		if math.Abs(float64(g-w)) > 0.01*float64(w)+100 {
			t.Errorf("%s = %v, want %v", name, g, w)
		}
	}
	near("RequestOverhead", got.RequestOverhead, overhead)
	near("PrefillPerToken", got.PrefillPerToken, want.PrefillPerToken)
	near("AttentionPerMPairs", got.AttentionPerMPairs, want.AttentionPerMPairs)
	near("DecodePerSeq", got.DecodePerSeq, want.DecodePerSeq)
	near("DecodePerCtxToken", got.DecodePerCtxToken, want.DecodePerCtxToken)
	if got.MaxBatchedTokens != 640 || got.TTFTRMSE > 0.01 {
		t.Errorf("batch %d, RMSE %v ms: want 640 and about 0", got.MaxBatchedTokens, got.TTFTRMSE)
	}
	if _, err := fitProfile(pts[:2], ratio); err == nil {
		t.Error("two points: want an error")
	}
}

// A constant the data makes negative is dropped and the rest refitted.
func TestNonNegativeLeastSquares(t *testing.T) {
	// y = 2 x0 exactly, and x1 anti-correlated noise that an unconstrained fit would use.
	x := [][]float64{{1, 0.1}, {2, -0.3}, {3, 0.2}, {4, -0.1}}
	y := []float64{2, 4, 6, 8}
	c, sse := nonNegativeLeastSquares(x, y)
	if math.Abs(c[0]-2) > 1e-9 || c[1] != 0 || sse > 1e-12 {
		t.Errorf("c = %v, sse %v: want [2 0], 0", c, sse)
	}
	x = [][]float64{{1, -1}, {2, -2}, {3, -3}}
	y = []float64{-1, -2, -3}
	if c, _ := nonNegativeLeastSquares(x, y); c[0] < 0 || c[1] < 0 {
		t.Errorf("c = %v: want non-negative", c)
	}
}
