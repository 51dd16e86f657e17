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
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/tenant"
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

// hashingFingerprint is what a router replica advertises of its hashing of prompts to its
// peers (peer.Node.SetHashing): 8 bytes of a SHA-256, in hex, over what shapes a request's
// block hashes, so that replicas whose shared index entries match each other's requests
// fingerprint alike, and replicas whose entries can miss each other's requests do not:
//
//   - prefix.block_tokens, its default filled in: the blocks' length;
//   - normalize.rules, in order: the text hashed; and normalize.rewrite, which decides whether
//     the engine caches that text or the prompt as sent, so what an entry says it holds;
//   - where the cache salt in each seed comes from: the client's cache_salt (auth.mode none),
//     or the tenants' salts (api_key), each an HMAC of its name under auth's secret. Replicas
//     with one secret give a tenant one salt, so the secret is what is compared, by the salt
//     it gives a name no tenant can have (the tenant names are letters, digits, '.', '_' and
//     '-'): no tenant's salt, and not the secret itself, goes into the fingerprint. Tenants
//     listed on some replicas only are no hashing difference (the others refuse them);
//   - the block hashes of a fixed probe text, normalised by default and seeded with that
//     salt: a build that hashes otherwise (another seed, chaining, bytes per token or
//     default normalisation) fingerprints otherwise.
//
// The model in each seed is the request's own: no setting changes it. It returns "" (nothing
// advertised: the peers count it unknown) when auth's secret cannot be read, which a reload
// just accepted read a moment before.
func hashingFingerprint(cfg *config.Config) string {
	h := sha256.New()
	fmt.Fprintf(h, "kvroute hashing\n")
	bt := cfg.Prefix.BlockTokens
	if bt <= 0 {
		bt = prefix.DefaultBlockTokens // as route.Keys reads it
	}
	fmt.Fprintf(h, "block_tokens=%d\nrewrite=%t\n", bt, cfg.Normalize.Rewrite)
	for _, r := range cfg.Normalize.Rules {
		fmt.Fprintf(h, "rule=%q %q\n", r.Pattern, r.Replace)
	}
	salt := ""
	if cfg.AuthMode() == config.AuthAPIKey {
		secret, err := cfg.Secret(nil)
		if err != nil {
			return ""
		}
		salt = tenant.Salt(secret, "\x00kvroute hashing fingerprint")
		fmt.Fprintf(h, "salt=tenants %s\n", salt)
	} else {
		fmt.Fprintf(h, "salt=client\n")
	}
	for _, b := range prefix.NormalizedBlocks(nil, prefix.Seed("probe", salt), []byte(hashingProbe), 1, nil) {
		fmt.Fprintf(h, "%016x\n", b)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// hashingProbe is the text whose block hashes hashingFingerprint takes: line endings,
// runs of white space, edges and a decomposed accent for the default normalisation to change.
const hashingProbe = "  A probe\r\nof the router's  hashing:\t\tcafe\u0301, twice  \r\r the same.  "

// advertisePolicy tells the peers the policy cfg puts in force (params: its parameters, read as
// the router applies them) and its hashing of prompts (hashingFingerprint); nothing without
// peers. The router calls it after every config it applies, at start and at each reload
// accepted.
func (p *peers) advertisePolicy(cfg *config.Config, params policy.Params) {
	if p == nil {
		return
	}
	p.node.SetHashing(hashingFingerprint(cfg))
	p.node.SetPolicy(cfg.Policy.Name, policyFingerprint(cfg.Policy.Name, params))
}
