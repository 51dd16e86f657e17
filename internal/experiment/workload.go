package experiment

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/workload"
)

// loadRequests reads the trace, or generates the workload, for the verbs in virtual time, and
// keeps its first limit requests (0: all); name names it in reports.
func loadRequests(trace, work string, seed uint64, limit int) (reqs []workload.Request, name string, err error) {
	if trace != "" {
		name = filepath.Base(trace)
		reqs, err = workload.LoadMooncake(trace)
	} else {
		name = work
		reqs, err = workload.Generate(work, seed)
		if err != nil {
			err = &UsageError{fmt.Errorf("--workload: %w", err)}
		}
	}
	if err != nil {
		return nil, "", err
	}
	if limit > 0 && limit < len(reqs) {
		reqs = reqs[:limit]
	}
	if len(reqs) == 0 {
		return nil, "", errors.New("the workload has no requests")
	}
	return reqs, name, nil
}

// maxSentPromptTokens bounds the prompt of a request sent over HTTP: a rendered prompt takes
// about 4 bytes a token, and the router's default body limit (config.DefaultMaxBodyBytes) is
// 16 MiB, so a longer one is refused by any server, after being built in memory whole.
const maxSentPromptTokens = config.DefaultMaxBodyBytes / 4

// loadWorkload reads the trace, or generates the named workload (shared-prefix when neither),
// for the verbs that send requests over HTTP.
func loadWorkload(trace, spec string, seed uint64) ([]workload.Request, string, error) {
	if trace != "" {
		reqs, err := workload.LoadMooncake(trace)
		if err != nil {
			return nil, "", fmt.Errorf("--trace: %w", err)
		}
		if len(reqs) == 0 {
			return nil, "", usageErr("--trace %s: no requests", trace)
		}
		for i := range reqs {
			if n := reqs[i].PromptTokens; n > maxSentPromptTokens {
				return nil, "", fmt.Errorf("--trace %s: request %d (non-blank line %d): input_length %d is more than the %d tokens (16 MiB at about 4 bytes a token) a server accepts; shorten or drop that line",
					trace, i, i+1, n, maxSentPromptTokens)
			}
		}
		return reqs, filepath.Base(trace), nil
	}
	if spec == "" {
		spec = "shared-prefix"
	}
	reqs, err := workload.Generate(spec, seed)
	if err != nil {
		return nil, "", &UsageError{fmt.Errorf("--workload: %w", err)}
	}
	if len(reqs) == 0 {
		return nil, "", usageErr("--workload %s: no requests", spec)
	}
	return reqs, spec, nil
}

// checkSimulation checks the options Simulate and Plan share: a trace or a workload, the limit,
// the profile and the policies. It returns every problem found.
func checkSimulation(trace, work string, limit int, profile, policies string) (engine.Profile, []Policy, []error) {
	var errs []error
	if (trace == "") == (work == "") {
		errs = append(errs, errors.New("give exactly one of --trace FILE or --workload NAME"))
	}
	if limit < 0 {
		errs = append(errs, fmt.Errorf("--limit %d: want 0 (all) or more", limit))
	}
	prof, err := engine.LookupProfile(profile)
	if err != nil {
		errs = append(errs, fmt.Errorf("--profile: %w", err))
	}
	specs, err := ParsePolicies(policies)
	if err != nil {
		errs = append(errs, fmt.Errorf("--policies: %w", err))
	}
	return prof, specs, errs
}

// prefillWork is the prefill time of every prompt on an idle engine with an empty cache.
func prefillWork(reqs []workload.Request, p engine.Profile) time.Duration {
	var work time.Duration
	for i := range reqs {
		work += p.UnloadedTTFT(reqs[i].PromptTokens, 0)
	}
	return work
}

// span is the time from the first arrival to the last.
func span(reqs []workload.Request) time.Duration {
	lo, hi := reqs[0].Arrival, reqs[0].Arrival
	for i := range reqs {
		lo = min(lo, reqs[i].Arrival)
		hi = max(hi, reqs[i].Arrival)
	}
	return hi - lo
}

// speedupForLoad is the factor K by which arrivals must be compressed for the prefill work
// without cache hits to be load times the capacity of n engines of profile p:
// work / (span / K) = load x n.
func speedupForLoad(reqs []workload.Request, p engine.Profile, n int, load float64) (float64, error) {
	d := span(reqs)
	work := prefillWork(reqs, p)
	if d <= 0 || work <= 0 {
		return 0, usageErr("--load needs a workload whose arrivals spread over time and a profile with a prefill cost (use --speedup)")
	}
	return load * float64(n) * d.Seconds() / work.Seconds(), nil
}

// OfferedLoad is the prefill work without cache hits over the capacity of n engines of profile
// p during the (already scaled) arrivals' span; 0 when undefined.
func OfferedLoad(reqs []workload.Request, p engine.Profile, n int) float64 {
	d := span(reqs)
	if d <= 0 {
		return 0
	}
	return prefillWork(reqs, p).Seconds() / d.Seconds() / float64(n)
}
