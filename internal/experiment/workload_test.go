package experiment

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestLoadCalibration: the speed-up that speedupForLoad computes gives, once applied, exactly
// the load asked for, and the figures follow the definitions: prefill work over the fleet's
// time.
func TestLoadCalibration(t *testing.T) {
	prof, err := engine.LookupProfile("llama3-70b-h200-tp8")
	if err != nil {
		t.Fatal(err)
	}
	// Four 2,000-token prompts, one a second: a span of 3 s.
	reqs := make([]workload.Request, 4)
	for i := range reqs {
		reqs[i] = workload.Request{Arrival: time.Duration(i) * time.Second, PromptTokens: 2000}
	}
	work := 4 * prof.UnloadedTTFT(2000, 0)
	if got := prefillWork(reqs, prof); got != work {
		t.Errorf("prefill work %v, want 4 x %v", got, work)
	}
	if got := span(reqs); got != 3*time.Second {
		t.Errorf("span %v, want 3s", got)
	}
	// Offered load: the work over 2 instances x 3 s.
	if got, want := OfferedLoad(reqs, prof, 2), work.Seconds()/3/2; math.Abs(got-want) > 1e-12 {
		t.Errorf("offered load %v, want %v", got, want)
	}
	for _, load := range []float64{0.1, 0.7, 2} {
		k, err := speedupForLoad(reqs, prof, 2, load)
		if err != nil {
			t.Fatal(err)
		}
		if got := OfferedLoad(workload.Speedup(reqs, k), prof, 2); math.Abs(got-load) > 1e-6 {
			t.Errorf("load %v: speed-up %v gives load %v", load, k, got)
		}
	}
	// Arrivals all at once have no span to compress: a usage error pointing at --speedup.
	same := []workload.Request{{PromptTokens: 100}, {PromptTokens: 100}}
	_, err = speedupForLoad(same, prof, 1, 0.5)
	if !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), "--speedup") {
		t.Errorf("no span: err %v, want a usage error suggesting --speedup", err)
	}
	if got := OfferedLoad(same, prof, 1); got != 0 {
		t.Errorf("no span: offered load %v, want 0", got)
	}
}

func TestLoadRequests(t *testing.T) {
	reqs, name, err := loadRequests("", "prefix-repetition:n=10", 1, 4)
	if err != nil || len(reqs) != 4 || name != "prefix-repetition:n=10" {
		t.Errorf("limit 4: %d requests named %q, %v; want 4 and the spec as name", len(reqs), name, err)
	}
	if _, _, err := loadRequests("", "zipf", 1, 0); !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), "--workload") {
		t.Errorf("unknown workload: err %v, want a usage error naming --workload", err)
	}
	// A missing trace is not a usage error: the command line was fine, the file is not there.
	if _, _, err := loadRequests("/nonexistent/t.jsonl", "", 1, 0); err == nil || errors.As(err, new(*UsageError)) {
		t.Errorf("missing trace: err %v, want a plain error", err)
	}
	reqs, name, err = loadWorkload("", "", 1)
	if err != nil || len(reqs) == 0 || name != "shared-prefix" {
		t.Errorf("no workload: %d requests named %q, %v; want shared-prefix", len(reqs), name, err)
	}
	if _, _, err := loadWorkload("/nonexistent/t.jsonl", "", 1); err == nil || !strings.HasPrefix(err.Error(), "--trace: ") {
		t.Errorf("missing trace: err %v, want it to name --trace", err)
	}
}
