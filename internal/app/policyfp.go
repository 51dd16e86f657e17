package app

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
)

// policyFingerprint is what a router replica advertises of its policy to its peers
// (peer.Node.SetPolicy): 8 bytes of a SHA-256, in hex, over the policy's name and its effective
// parameters, each default filled in and every value in one form (numbers as numbers,
// durations in nanoseconds), so that replicas that route alike fingerprint alike however their
// configs write it: `cache_weight: 6` and no cache_weight, `6` and `6.0`, `ttl: 2m` and `120s`.
func policyFingerprint(name string, params policy.Params) string {
	defaults := policyDefaults(name)
	eff := make(map[string]string, len(defaults)+len(params))
	for k, def := range defaults {
		eff[k] = canonParam(fmt.Sprint(def), def)
	}
	for k, v := range params {
		eff[k] = canonParam(v, defaults[k])
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", name)
	for _, k := range slices.Sorted(maps.Keys(eff)) {
		fmt.Fprintf(h, "%s=%s\n", k, eff[k])
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// canonParam writes a parameter's value v in one form, by the kind of its default (def; nil
// for a key without one, which no policy reads: config validation refuses it).
func canonParam(v string, def any) string {
	v = strings.TrimSpace(v)
	switch def.(type) {
	case time.Duration:
		if d, err := time.ParseDuration(v); err == nil {
			return strconv.FormatInt(int64(d), 10)
		}
	case bool:
		if b, err := strconv.ParseBool(v); err == nil {
			return strconv.FormatBool(b)
		}
	case int, float64:
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	}
	return v
}

// policyDefaults returns the parameters each built-in policy takes, with the default each takes
// when absent, by kind (int, float64, time.Duration): what policyFingerprint fills in.
//
// They repeat internal/policy's (its constructors' typed getters), which exports no way to ask:
// TestPolicyDefaultsKnown checks that the keys are each policy's, and prefix-aware's defaults
// against docs/policy.md's table, which the policy package's own test checks against the code.
// A default written here that drifts from the code makes a config that writes the default out
// fingerprint apart from one that leaves it out: a warning between replicas that route alike,
// never a change to routing.
func policyDefaults(name string) map[string]any {
	switch name {
	case "prefix-aware":
		return map[string]any{
			"max_load_factor": 2.0, "attention_weight": 25.0, "decode_cost": 0.0005, "cache_weight": 6.0,
			"affinity_window": 60.0, "step_tokens": 8192, "index_blocks": 65536, "max_index_entries": 16 << 20,
		}
	case "cache-aware":
		return map[string]any{"balance_abs_threshold": 64, "balance_rel_threshold": 1.5, "cache_threshold": 0.3, "max_tree_size": 1 << 26}
	case "consistent-hash":
		return map[string]any{"virtual_nodes": 256, "load_factor": 1.25}
	case "overlap-cost":
		return map[string]any{"overlap_score_weight": 1.0, "ttl": 120 * time.Second, "index_blocks": 1 << 20}
	case "prefix-spill":
		return map[string]any{"prefix_length": 1024, "concurrency_threshold": 16}
	case "scorer-weighted":
		return map[string]any{"prefix_weight": 3.0, "queue_weight": 2.0, "kv_weight": 2.0, "lru_blocks": 31250}
	}
	return nil // round-robin, random, least-request, power-of-two: no parameters
}

// advertisePolicy tells the peers the policy cfg puts in force (params: its parameters, read as
// the router applies them); nothing without peers.
func (p *peers) advertisePolicy(cfg *config.Config, params policy.Params) {
	if p == nil {
		return
	}
	p.node.SetPolicy(cfg.Policy.Name, policyFingerprint(cfg.Policy.Name, params))
}
