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
	defaults, _ := policy.Defaults(name) // an unknown name: config validation refused it
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

// canonParam writes a parameter's value v in one form, by the kind of its default (def, as
// policy.Defaults gives it; nil for a key without one, which no policy reads: config
// validation refuses it).
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

// advertisePolicy tells the peers the policy cfg puts in force (params: its parameters, read as
// the router applies them); nothing without peers.
func (p *peers) advertisePolicy(cfg *config.Config, params policy.Params) {
	if p == nil {
		return
	}
	p.node.SetPolicy(cfg.Policy.Name, policyFingerprint(cfg.Policy.Name, params))
}
