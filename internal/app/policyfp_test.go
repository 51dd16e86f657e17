package app

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
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

// TestReloadAdvertisesPolicy: a router replica advertises its policy's fingerprint from its
// start; a reload that changes a parameter changes it, one that leaves the policy alone (or
// writes its default out) does not, and kvroute_peers_policy_mismatch is served.
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
	// A config the router rejects leaves the policy in force advertised.
	if err := r.Reload(conf("policy: {name: prefix-aware, params: {cache_weight: -1}}\n")); err == nil {
		t.Fatal("cache_weight -1 accepted")
	}
	if got := advertised(); got != start {
		t.Errorf("after a rejected reload: advertised %q, want %q", got, start)
	}
	if _, m := get(t, r.AdminHandler(), "/metrics"); !strings.Contains(m, "\nkvroute_peers_policy_mismatch 0\n") {
		t.Error("/metrics lacks kvroute_peers_policy_mismatch")
	}
	if _, body := get(t, r.AdminHandler(), "/debug/peers"); !strings.Contains(body, `"fingerprint": "`+fingerprintOf(t, "")+`"`) {
		t.Errorf("/debug/peers lacks this replica's fingerprint:\n%s", body)
	}
}
