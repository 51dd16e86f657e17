package app

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// fingerprintOf is the fingerprint of a config's policy section as the router applies it.
func fingerprintOf(t *testing.T, section string) string {
	t.Helper()
	cfg := routerConfig(t, section, "http://127.0.0.1:1")
	params, err := cfg.Policy.PolicyParams()
	if err != nil {
		t.Fatal(err)
	}
	return policyFingerprint(cfg.Policy.Name, params)
}

// TestPolicyFingerprint: configs whose policies route alike fingerprint alike, however they
// write it (a default written out or left out, a number or a duration in another form); a
// parameter or a policy of its own does not.
func TestPolicyFingerprint(t *testing.T) {
	none := fingerprintOf(t, "")
	if len(none) != 16 {
		t.Fatalf("fingerprint %q, want 8 bytes in hex", none)
	}
	for _, same := range []string{
		"policy: {name: prefix-aware}\n",
		"policy: {name: prefix-aware, params: {}}\n",
		"policy: {name: prefix-aware, params: {cache_weight: 6}}\n",
		"policy: {name: prefix-aware, params: {cache_weight: 6.0, max_load_factor: '2', step_tokens: 8192}}\n",
		"policy: {name: prefix-aware, params: {max_index_entries: 16777216, decode_cost: 5e-4}}\n",
	} {
		if got := fingerprintOf(t, same); got != none {
			t.Errorf("%q: fingerprint %s, the default's %s", same, got, none)
		}
	}
	seen := map[string]string{none: "the default"}
	for _, other := range []string{
		"policy: {name: prefix-aware, params: {cache_weight: 5}}\n",
		"policy: {name: prefix-aware, params: {cache_weight: 6.5}}\n",
		"policy: {name: prefix-aware, params: {step_tokens: 0}}\n",
		"policy: {name: cache-aware}\n",
		"policy: {name: least-request}\n",
		"policy: {name: round-robin}\n",
		"policy: {name: overlap-cost, params: {ttl: 60s}}\n",
	} {
		got := fingerprintOf(t, other)
		if prev, ok := seen[got]; ok {
			t.Errorf("%q: fingerprint %s, as %s", other, got, prev)
		}
		seen[got] = other
	}
	if a, b := fingerprintOf(t, "policy: {name: overlap-cost, params: {ttl: 2m}}\n"), fingerprintOf(t, "policy: {name: overlap-cost, params: {ttl: 120s}}\n"); a != b ||
		a != fingerprintOf(t, "policy: {name: overlap-cost}\n") {
		t.Errorf("ttl 2m, 120s and the default fingerprint %s, %s and %s", a, b, fingerprintOf(t, "policy: {name: overlap-cost}\n"))
	}
}

// TestReloadAdvertisesPolicy: a router replica advertises its policy's fingerprint and its
// hashing's from its start; a reload that changes a parameter changes it, one that leaves the
// policy alone (or writes its default out) does not, a rejected one changes neither, and
// kvroute_peers_policy_mismatch is served.
func TestReloadAdvertisesPolicy(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	conf := func(extra string) *config.Config {
		return routerConfig(t, "auth: {mode: none}\n"+
			"peers: {name: a, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS}\n"+extra, eng.srv.URL)
	}
	r, err := NewRouter(conf(""), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	runRouter(t, r)
	advertised := func() string {
		name, fp := r.peers.node.Policy()
		return name + " " + fp
	}
	start := advertised()
	if want := "prefix-aware " + fingerprintOf(t, ""); start != want {
		t.Fatalf("advertised %q at start, want %q", start, want)
	}
	steps := []struct {
		what, extra string
		changed     bool
	}{
		{"another log level", "log: {level: debug}\n", false},
		{"cache_weight 5", "policy: {name: prefix-aware, params: {cache_weight: 5}}\n", true},
		{"cache_weight 5 again, another log level", "policy: {name: prefix-aware, params: {cache_weight: 5}}\nlog: {level: info}\n", false},
		{"cache_weight back to its default, written out", "policy: {name: prefix-aware, params: {cache_weight: 6}}\n", true},
	}
	prev := start
	for _, s := range steps {
		if err := r.Reload(conf(s.extra)); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		got := advertised()
		if (got != prev) != s.changed {
			t.Errorf("%s: advertised %q after %q; changed %v, want %v", s.what, got, prev, got != prev, s.changed)
		}
		prev = got
	}
	if prev != start {
		t.Errorf("the default written out advertises %q, left out %q", prev, start)
	}
	hashing := hashingOf(t, "auth: {mode: none}\n")
	if got := r.peers.node.Hashing(); got != hashing {
		t.Errorf("hashing advertised %q, want %q", got, hashing)
	}
	// A config the router rejects leaves the policy and the hashing in force advertised.
	if err := r.Reload(conf("policy: {name: prefix-aware, params: {cache_weight: -1}}\nprefix: {block_tokens: 32}\n")); err == nil {
		t.Fatal("cache_weight -1 accepted")
	}
	if got := advertised(); got != start {
		t.Errorf("after a rejected reload: advertised %q, want %q", got, start)
	}
	if got := r.peers.node.Hashing(); got != hashing {
		t.Errorf("after a rejected reload: hashing advertised %q, want %q", got, hashing)
	}
	if _, m := get(t, r.AdminHandler(), "/metrics"); !strings.Contains(m, "\nkvroute_peers_policy_mismatch 0\n") {
		t.Error("/metrics lacks kvroute_peers_policy_mismatch")
	}
	if _, body := get(t, r.AdminHandler(), "/debug/peers"); !strings.Contains(body, `"fingerprint": "`+fingerprintOf(t, "")+`"`) {
		t.Errorf("/debug/peers lacks this replica's fingerprint:\n%s", body)
	}
}

// hashingOf is the hashing fingerprint of a config (routerConfig's, with extra).
func hashingOf(t *testing.T, extra string) string {
	t.Helper()
	return hashingFingerprint(routerConfig(t, extra, "http://127.0.0.1:1"))
}

// TestHashingFingerprint: configs whose requests get the same block hashes fingerprint alike,
// however they write it (the default block size written out, other tenants under the same
// secret, another policy); those that hash otherwise (block size, normalisation rules or
// their order, rewrite, auth mode, salt secret) do not. Neither the secret nor a tenant's
// salt goes into it in a form that shows.
func TestHashingFingerprint(t *testing.T) {
	dir := t.TempDir()
	secret1, secret2 := filepath.Join(dir, "s1"), filepath.Join(dir, "s2")
	salt1 := strings.Repeat("k", 32)
	for file, s := range map[string]string{secret1: salt1, secret2: strings.Repeat("j", 32)} {
		if err := os.WriteFile(file, []byte(s+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int) string { return config.KeyDigest(fmt.Sprintf("key-%d", i)) }
	tenants := func(secret string, names ...string) string {
		var b strings.Builder
		fmt.Fprintf(&b, "auth: {mode: api_key, secret_file: %q}\ntenants:\n", secret)
		for i, n := range names {
			fmt.Fprintf(&b, "  - {name: %s, api_keys: [%q]}\n", n, key(i))
		}
		return b.String()
	}
	none := hashingOf(t, "auth: {mode: none}\n")
	if len(none) != 16 {
		t.Fatalf("fingerprint %q, want 8 bytes in hex", none)
	}
	for _, same := range []string{
		"",                             // no auth section: none
		"prefix: {block_tokens: 16}\n", // the default written out
		"normalize: {rules: []}\n",
		"policy: {name: round-robin}\n", // the policy has a fingerprint of its own
	} {
		if got := hashingOf(t, "auth: {mode: none}\n"+same); got != none {
			t.Errorf("%q: fingerprint %s, the default's %s", same, got, none)
		}
	}
	acme := hashingOf(t, tenants(secret1, "acme"))
	if got := hashingOf(t, tenants(secret1, "acme", "beta")); got != acme {
		t.Errorf("another tenant under the same secret: fingerprint %s, want %s", got, acme)
	}
	seen := map[string]string{none: "the default", acme: "tenants under secret 1"}
	for _, other := range []string{
		"auth: {mode: none}\nprefix: {block_tokens: 32}\n",
		"auth: {mode: none}\nprefix: {block_tokens: 15}\n",
		"auth: {mode: none}\nnormalize: {rewrite: true}\n",
		"auth: {mode: none}\nnormalize: {rules: [{pattern: '\\d+', replace: '<n>'}]}\n",
		"auth: {mode: none}\nnormalize: {rules: [{pattern: '\\d+', replace: '<m>'}]}\n",
		"auth: {mode: none}\nnormalize: {rules: [{pattern: '\\d+', replace: '<n>'}, {pattern: 'x+', replace: 'x'}]}\n",
		"auth: {mode: none}\nnormalize: {rules: [{pattern: 'x+', replace: 'x'}, {pattern: '\\d+', replace: '<n>'}]}\n",
		tenants(secret2, "acme"),
		tenants(secret1, "acme") + "prefix: {block_tokens: 32}\n",
	} {
		got := hashingOf(t, other)
		if prev, ok := seen[got]; ok {
			t.Errorf("%q: fingerprint %s, as %s", other, got, prev)
		}
		seen[got] = other
	}
	// What the fingerprint is made of: no tenant's salt, nor the secret, is a part of it.
	if acmeSalt := tenant.Salt([]byte(salt1), "acme"); strings.Contains(acmeSalt, acme) || strings.Contains(salt1, acme) {
		t.Errorf("the fingerprint %s is a part of the salt or the secret", acme)
	}
}

// TestHashingMismatch: two router replicas on loopback, one at prefix.block_tokens 16, the
// other at 32. Each logs the difference once (WARN), counts it in
// kvroute_peers_hashing_mismatch and shows it in /debug/peers; a reload of the second to 16
// brings them into agreement: each logs it (INFO) and its gauge is back to 0.
func TestHashingMismatch(t *testing.T) {
	t.Setenv("KVROUTE_TEST_PEERS", peerSecret)
	eng := newFakeEngine(t)
	conf := func(name, seed string, blockTokens int) *config.Config {
		static := ""
		if seed != "" {
			static = fmt.Sprintf(", static: [%q]", seed)
		}
		return routerConfig(t, fmt.Sprintf("auth: {mode: none}\nprefix: {block_tokens: %d}\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_env: KVROUTE_TEST_PEERS, warm_start_timeout: 5s, batch_interval: 1ms%s}\n",
			blockTokens, name, static), eng.srv.URL)
	}
	start := func(cfg *config.Config, logs *testlog.Buffer) *Router {
		r, err := NewRouter(cfg, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		runRouter(t, r)
		return r
	}
	var logsA, logsB testlog.Buffer
	a := start(conf("a", "", 16), &logsA)
	waitUntil(t, "a's gossip address", func() bool { return a.peers.node.GossipAddr() != "" })
	b := start(conf("b", a.peers.node.GossipAddr(), 32), &logsB)
	mismatches := func(r *Router) float64 { return testutil.ToFloat64(r.peers.node.Metrics().HashingMismatch) }
	type debugPeers struct {
		Hashing struct {
			Fingerprint string `json:"fingerprint"`
			Mismatches  int    `json:"mismatches"`
		} `json:"hashing"`
		PeerPolicies []struct {
			Name           string `json:"name"`
			Hashing        string `json:"hashing_fingerprint"`
			HashingMatches *bool  `json:"hashing_matches"`
			PolicyMatches  *bool  `json:"policy_matches"`
		} `json:"peer_policies"`
	}
	debug := func(r *Router) debugPeers {
		t.Helper()
		var st debugPeers
		if _, body := get(t, r.AdminHandler(), "/debug/peers"); json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("/debug/peers: %s", body)
		}
		return st
	}
	fpA, fpB := a.peers.node.Hashing(), b.peers.node.Hashing()
	if fpA == "" || fpA == fpB {
		t.Fatalf("fingerprints %q at 16 and %q at 32 tokens", fpA, fpB)
	}
	waitUntil(t, "each replica seeing the other hash otherwise", func() bool {
		return mismatches(a) == 1 && mismatches(b) == 1
	})
	for _, c := range []struct {
		r          *Router
		logs       *testlog.Buffer
		peer       string
		own, other string
	}{{a, &logsA, "b", fpA, fpB}, {b, &logsB, "a", fpB, fpA}} {
		st := debug(c.r)
		if st.Hashing.Fingerprint != c.own || st.Hashing.Mismatches != 1 || len(st.PeerPolicies) != 1 ||
			st.PeerPolicies[0].Name != c.peer || st.PeerPolicies[0].Hashing != c.other ||
			st.PeerPolicies[0].HashingMatches == nil || *st.PeerPolicies[0].HashingMatches ||
			st.PeerPolicies[0].PolicyMatches == nil || !*st.PeerPolicies[0].PolicyMatches {
			t.Errorf("/debug/peers of the peer of %s: %+v", c.peer, st)
		}
		line := "level=INFO msg=\"a peer replica hashes prompts into blocks otherwise"
		if k := c.logs.Count(line); k != 1 || c.logs.Count("peer="+c.peer+" fingerprint="+c.own+" peer_fingerprint="+c.other+" fix=\"either:") != 1 {
			t.Errorf("the difference with %s logged %d times, want once, with both fingerprints:\n%s", c.peer, k, c.logs.String())
		}
		if _, m := get(t, c.r.AdminHandler(), "/metrics"); !strings.Contains(m, "\nkvroute_peers_hashing_mismatch 1\n") ||
			!strings.Contains(m, "\nkvroute_peers_policy_mismatch 0\n") {
			t.Errorf("the metrics of the peer of %s lack the hashing's mismatch, or count the policy's", c.peer)
		}
	}
	if err := b.Reload(conf("b", a.peers.node.GossipAddr(), 16)); err != nil {
		t.Fatal(err)
	}
	if got := b.peers.node.Hashing(); got != fpA {
		t.Fatalf("b at 16 tokens advertises %q, a %q", got, fpA)
	}
	waitUntil(t, "the gauges back to 0", func() bool { return mismatches(a) == 0 && mismatches(b) == 0 })
	for _, l := range []*testlog.Buffer{&logsA, &logsB} {
		if l.Count("level=INFO msg=\"a peer replica hashes prompts as this one again\"") != 1 || l.Count("hashes prompts into blocks otherwise") != 1 {
			t.Errorf("want the agreement logged once, the difference no more:\n%s", l.String())
		}
	}
	if st := debug(a); st.Hashing.Mismatches != 0 || len(st.PeerPolicies) != 1 || st.PeerPolicies[0].HashingMatches == nil || !*st.PeerPolicies[0].HashingMatches {
		t.Errorf("a's /debug/peers after b's reload: %+v", st)
	}
}
