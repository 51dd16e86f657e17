package policy

import (
	"math"
	"sync"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// An answer that comes whole ("stream": false) shows the router no first token, so it teaches
// prefix-aware nothing of an endpoint's speed: where no answer streams, the prior speed stood
// for ever (docs/policy.md, "Answers that come whole"). The engine itself counts every first
// token in its TTFT histogram (vLLM's and SGLang's time_to_first_token_seconds), which the
// scrape reads as a running sum and count. Between two scrapes the engine's mean TTFT is the
// change in the sum over the change in the count; the router's, by the prior model, is the mean
// of its predictions for the first tokens it saw or settled in about the same time. Their ratio
// is the calibration those first tokens would have taught, and each answer that came whole in
// the window counts as one sample of it (the streamed ones teach their own, in learnTTFT).
// The two windows are matched only roughly (a settled answer's first token is the queue
// model's guess, and the scrape's time is not the pick's): as a ratio of means over many
// requests, the mismatch is noise, not bias.

// ttftWindow is what the router saw of an endpoint's first tokens since the last scrape it
// read: their predictions by the prior model (seconds), how many, and how many of them came
// whole. paState.mu guards it.
type ttftWindow struct {
	predicted, n, whole float64
	snap                *endpoint.Snapshot // the last scrape read (paState.scraped)
}

// ttftRatio is, exponentially weighted over about the last 1/weight first tokens, the sum and
// count of the engines' TTFTs and of the router's predictions.
type ttftRatio struct {
	mu                                     sync.Mutex
	engineSum, engineN, routerSum, routerN float64
}

// add weighs in a window: the engine's TTFT sum and count, the router's prediction sum and
// count. It returns the engines' mean TTFT and the router's mean prediction, and whether each
// has learnMin first tokens.
func (r *ttftRatio) add(esum, en, rsum, rn, weight float64) (observed, predicted float64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := math.Pow(1-weight, max(en, rn))
	r.engineSum, r.engineN = r.engineSum*keep+esum, r.engineN*keep+en
	r.routerSum, r.routerN = r.routerSum*keep+rsum, r.routerN*keep+rn
	if r.engineN < learnMin || r.routerN < learnMin {
		return 0, 0, false
	}
	return r.engineSum / r.engineN, r.routerSum / r.routerN, true
}

// firstOf counts f's first token in the window: it came (streamed) or was settled or ended
// (whole). The caller holds s.mu.
func (s *paState) firstOf(f *paFlight, whole bool) {
	s.window.predicted += priorTTFT(f.ahead)
	s.window.n++
	if whole {
		s.window.whole++
	}
}

// readScrape reads ep's scrape when it is newer than the last read: its TTFTs since, and the
// router's predictions for the first tokens it saw or settled there, go into the pooled ratio
// of means, and the fleet's speed learns that ratio once for each answer that came whole.
func (pa *prefixAware) readScrape(s *paState, ep *endpoint.Endpoint, now int64) {
	snap := ep.Snapshot()
	if !pa.learn || snap == nil || s.scraped.Load() == snap {
		return
	}
	s.mu.Lock()
	w := s.window
	if w.snap == snap {
		s.mu.Unlock()
		return
	}
	s.window = ttftWindow{snap: snap}
	s.scraped.Store(snap)
	s.mu.Unlock()
	prev := w.snap
	if prev == nil || snap.TTFTCount <= prev.TTFTCount || snap.TTFTSum < prev.TTFTSum ||
		ep.StalledDuring(prev.At.UnixNano(), snap.At.UnixNano()) {
		// No histogram, nothing new, counters reset (an engine restart), or a stall, not a
		// speed (learnTTFT).
		return
	}
	observed, predicted, ok := pa.pooled.add(snap.TTFTSum-prev.TTFTSum, snap.TTFTCount-prev.TTFTCount,
		w.predicted, w.n, learnWeight/4)
	if !ok {
		return
	}
	for range int(w.whole) {
		pa.fleet.add(predicted, observed, learnWeight/4, now, 0, 0)
	}
}
