package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestReloadRemovesEndpointWithStreamInFlight: an endpoint removed by a reload while a stream
// runs on it loses its series at the reload, and the stream's end does not make them again
// (they would stay for good: every pod replaced under load would leave some behind).
func TestReloadRemovesEndpointWithStreamInFlight(t *testing.T) {
	gone, next := newFakeEngine(t), newFakeEngine(t)
	gone.hold, gone.held = make(chan struct{}), make(chan struct{})
	r, err := NewRouter(routerConfig(t, "", gone.srv.URL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api := httptest.NewServer(r.Handler())
	defer api.Close()
	admin := r.AdminHandler()

	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(api.URL+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"long"}]}`))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	select {
	case <-gone.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not reach the engine")
	}
	if err := r.Reload(routerConfig(t, "", next.srv.URL)); err != nil {
		t.Fatal(err)
	}
	series := func() []string {
		_, body := get(t, admin, "/metrics")
		var out []string
		for l := range strings.SplitSeq(body, "\n") {
			if strings.Contains(l, gone.srv.URL) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
		return out
	}
	if s := series(); len(s) != 0 {
		t.Errorf("after the reload, the removed endpoint's series: %q", s)
	}
	close(gone.hold)
	select {
	case got := <-done:
		if !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "[DONE]") {
			t.Fatalf("the stream: %.200s", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	// The handler counts the request before it returns, and the body ends when it returns.
	if s := series(); len(s) != 0 {
		t.Errorf("after the stream on the removed endpoint ended: %q", s)
	}
}

// jsonLogger is a JSON logger into a buffer the test reads.
func jsonLogger() (*slog.Logger, *testlog.Buffer) {
	var buf testlog.Buffer
	return slog.New(slog.NewJSONHandler(&buf, nil)), &buf
}

// messages returns the log lines whose msg contains s, each as its attributes but time and level.
func messages(t *testing.T, buf *testlog.Buffer, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range buf.JSONLines(t) {
		if msg, _ := l["msg"].(string); strings.Contains(msg, s) {
			delete(l, "time")
			delete(l, "level")
			out = append(out, l)
		}
	}
	return out
}

// TestReloadListenStaysInForce: a reload that changes listen (or admin_listen) cannot move the
// listeners: the config in force keeps the addresses listened on, the warning names both,
// and putting the file back as it was says nothing more.
func TestReloadListenStaysInForce(t *testing.T) {
	e := newFakeEngine(t)
	logger, buf := jsonLogger()
	const listen, admin = "listen: 127.0.0.1:28701\nadmin_listen: 127.0.0.1:28702\n", "listen: 127.0.0.1:28711\nadmin_listen: 127.0.0.1:28702\n"
	r, err := NewRouter(routerConfig(t, listen, e.srv.URL), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Reload(routerConfig(t, admin, e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if got := r.Config().Listen; got != "127.0.0.1:28701" {
		t.Errorf("listen in force after the reload: %s, want 127.0.0.1:28701 (the listener does not move)", got)
	}
	want := []map[string]any{{"msg": "listen and admin_listen change only on restart: the listeners stay where they are",
		"listen": "127.0.0.1:28711", "listen_in_force": "127.0.0.1:28701", "admin_listen": "127.0.0.1:28702", "admin_listen_in_force": "127.0.0.1:28702"}}
	if diff := cmp.Diff(want, messages(t, buf, "change only on restart")); diff != "" {
		t.Errorf("the warning (-want +got):\n%s", diff)
	}
	if err := r.Reload(routerConfig(t, listen, e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, messages(t, buf, "change only on restart")); diff != "" {
		t.Errorf("the file put back as it was: a warning more (-want +got):\n%s", diff)
	}
	if got := r.Config().Listen; got != "127.0.0.1:28701" {
		t.Errorf("listen in force: %s, want 127.0.0.1:28701", got)
	}
}

// TestReloadLogsTenants: tenants added, removed or given other keys are logged by name with
// counts, never a key.
func TestReloadLogsTenants(t *testing.T) {
	e := newFakeEngine(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	const k1, k2, k3 = "sha256:1111111111111111111111111111111111111111111111111111111111111111",
		"sha256:2222222222222222222222222222222222222222222222222222222222222222",
		"sha256:3333333333333333333333333333333333333333333333333333333333333333"
	tenants := func(ts ...string) string {
		return fmt.Sprintf("auth: {mode: api_key, secret_file: %q}\ntenants:\n%s", secret, strings.Join(ts, ""))
	}
	logger, buf := jsonLogger()
	r, err := NewRouter(routerConfig(t, tenants("  - {name: acme, api_keys: ["+k1+"]}\n", "  - {name: beta, api_keys: ["+k2+"]}\n"), e.srv.URL), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// beta leaves, gamma comes, acme gets a second key.
	if err := r.Reload(routerConfig(t, tenants("  - {name: acme, api_keys: ["+k1+", "+k3+"]}\n", "  - {name: gamma, api_keys: ["+k2+"]}\n"), e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	// Nothing about tenants changes.
	if err := r.Reload(routerConfig(t, tenants("  - {name: acme, api_keys: ["+k1+", "+k3+"]}\n", "  - {name: gamma, api_keys: ["+k2+"]}\n"), e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{{"msg": "tenants changed", "added": []any{"gamma"}, "removed": []any{"beta"}, "keys_changed": []any{"acme"},
		"keys_added": 2.0, "keys_removed": 1.0, "tenants": 2.0}}
	if diff := cmp.Diff(want, messages(t, buf, "tenants")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if strings.Contains(buf.String(), "sha256:") {
		t.Errorf("a key digest in the log:\n%s", buf)
	}
}

// TestReloadLogsTenantLimits: a reload that changes a tenant's limits, or its other settings,
// says which tenants and which limits (it said nothing before: only "config applied"); the
// lists name at most maxTenantNames tenants and count the rest, and only the lists that have a
// name are written; no key appears.
func TestReloadLogsTenantLimits(t *testing.T) {
	e := newFakeEngine(t)
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return fmt.Sprintf("sha256:%064x", i) }
	tenants := func(ts ...string) string {
		return fmt.Sprintf("auth: {mode: api_key, secret_file: %q}\ntenants:\n%s", secret, strings.Join(ts, ""))
	}
	acme := func(limits string) string {
		return "  - {name: acme, api_keys: [" + key(1) + "], limits: {" + limits + "}}\n"
	}
	beta := func(priority int) string {
		return fmt.Sprintf("  - {name: beta, api_keys: [%s], priority: %d}\n", key(2), priority)
	}
	logger, buf := jsonLogger()
	r, err := NewRouter(routerConfig(t, tenants(acme("max_output_tokens: 50"), beta(0)), e.srv.URL), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	reload := func(doc string) {
		t.Helper()
		if err := r.Reload(routerConfig(t, doc, e.srv.URL)); err != nil {
			t.Fatal(err)
		}
	}
	reload(tenants(acme("max_output_tokens: 20, tokens_per_minute: 1000"), beta(0)))
	reload(tenants(acme("max_output_tokens: 20, tokens_per_minute: 1000"), beta(5)))
	reload(tenants(acme("max_output_tokens: 20, tokens_per_minute: 1000"), beta(5))) // nothing changes
	many := []string{acme("max_output_tokens: 20, tokens_per_minute: 1000"), beta(5)}
	for i := range 25 {
		many = append(many, fmt.Sprintf("  - {name: t%02d, api_keys: [%s]}\n", i, key(10+i)))
	}
	reload(tenants(many...))
	added := []any{"t00", "t01", "t02", "t03", "t04", "t05", "t06", "t07", "t08", "t09", "+15 more"}
	want := []map[string]any{
		{"msg": "tenants changed", "limits_changed": []any{"acme"}, "limits": []any{"max_output_tokens", "tokens_per_minute"}, "tenants": 2.0},
		{"msg": "tenants changed", "settings_changed": []any{"beta"}, "tenants": 2.0},
		{"msg": "tenants changed", "added": added, "keys_added": 25.0, "keys_removed": 0.0, "tenants": 27.0},
	}
	if diff := cmp.Diff(want, messages(t, buf, "tenants")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got := r.Config().Tenants[0].Limits.MaxOutputTokens; got != 20 {
		t.Errorf("acme's max_output_tokens in force: %d, want 20", got)
	}
	if strings.Contains(buf.String(), "sha256:") {
		t.Errorf("a key digest in the log:\n%s", buf)
	}
}

// TestReloadSecretChangeLogged: a new salt secret is told once it is in force, never for a
// secret the reload rejects; kvroute_config_last_reload_successful says which happened.
func TestReloadSecretChangeLogged(t *testing.T) {
	e := newFakeEngine(t)
	secret := filepath.Join(t.TempDir(), "secret")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(secret, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Repeat("s", 40))
	cfg := func() string {
		return fmt.Sprintf("auth: {mode: api_key, secret_file: %q}\ntenants:\n  - {name: acme, api_keys: [sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae]}\n", secret)
	}
	logger, buf := jsonLogger()
	r, err := NewRouter(routerConfig(t, cfg(), e.srv.URL), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	admin := r.AdminHandler()
	lastReload := func() string {
		_, body := get(t, admin, "/metrics")
		for l := range strings.SplitSeq(body, "\n") {
			if v, ok := strings.CutPrefix(l, "kvroute_config_last_reload_successful "); ok {
				return v
			}
		}
		return "absent"
	}
	if got := lastReload(); got != "1" {
		t.Errorf("at start: kvroute_config_last_reload_successful %s, want 1", got)
	}
	steps := []struct {
		secret   string
		rejected bool
		told     int // salt changes told so far
		last     string
	}{
		{strings.Repeat("s", 40), false, 0, "1"}, // the same secret
		{"short", true, 0, "0"},                  // under config.MinSecretBytes: rejected
		{strings.Repeat("t", 40), false, 1, "1"},
		{strings.Repeat("t", 40), false, 1, "1"},
	}
	for i, s := range steps {
		write(s.secret)
		err := r.Reload(routerConfig(t, cfg(), e.srv.URL))
		if (err != nil) != s.rejected {
			t.Fatalf("step %d: reload error %v, want rejected %v", i, err, s.rejected)
		}
		if n := len(messages(t, buf, "salt secret changed")); n != s.told {
			t.Errorf("step %d: the salt change told %d times, want %d", i, n, s.told)
		}
		if got := lastReload(); got != s.last {
			t.Errorf("step %d: kvroute_config_last_reload_successful %s, want %s", i, got, s.last)
		}
	}
}

// TestReloadKeepsRestartOnly: a reload whose file changes settings that take effect only on
// restart (server's but endpoint_header, pprof, log.format, autoscale.window) leaves the
// config in force with the values the router runs with, applies the rest (endpoint_header, the
// endpoints), and says which keys differ; a later reload that changes something else keeps
// them in force and says so again; the file put back as it was says nothing more. Before, the
// config in force took the file's values at the first reload (the servers kept theirs), and
// the next reload compared with those and said nothing.
func TestReloadKeepsRestartOnly(t *testing.T) {
	e, f := newFakeEngine(t), newFakeEngine(t)
	logger, buf := jsonLogger()
	r, err := NewRouter(routerConfig(t, "", e.srv.URL), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	type settings struct {
		MaxConns                           int
		Shutdown, Window                   time.Duration
		HTTPServer, Format, EndpointHeader string
		Pprof                              bool
	}
	inForce := func() settings {
		c := r.Config()
		return settings{c.Server.MaxConnections, c.Server.ShutdownTimeout.D(), c.Autoscale.Window.D(),
			c.Server.HTTPServer, c.Log.Format, c.Server.EndpointHeader, c.Pprof}
	}
	start := inForce()
	file := func(urls ...string) *config.Config {
		c := routerConfig(t, "", urls...)
		c.Server.MaxConnections = 7
		c.Server.ShutdownTimeout = config.Duration(20 * time.Second)
		c.Server.HTTPServer = config.HTTPServerNetHTTP
		c.Server.EndpointHeader = config.SuggestedEndpointHeader
		c.Pprof = true
		c.Log.Format = "text"
		c.Autoscale.Window = config.Duration(2 * time.Minute)
		return c
	}
	want := start
	want.EndpointHeader = config.SuggestedEndpointHeader
	warnings := func() []map[string]any {
		return append(messages(t, buf, "server settings change only on restart"), messages(t, buf, "pprof, log.format")...)
	}
	serverKeys := []any{"server.shutdown_timeout", "server.max_connections", "server.http_server"}
	otherKeys := []any{"pprof", "log.format", "autoscale.window"}

	for i, urls := range [][]string{{e.srv.URL}, {e.srv.URL, f.srv.URL}} {
		if err := r.Reload(file(urls...)); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, inForce()); diff != "" {
			t.Errorf("reload %d: the config in force (-want +got):\n%s", i+1, diff)
		}
		if n := r.Pool().Len(); n != len(urls) {
			t.Errorf("reload %d: %d endpoints, want %d", i+1, n, len(urls))
		}
		got := warnings() // the server's of each reload so far, then the others'
		if len(got) != 2*(i+1) {
			t.Fatalf("reload %d: %d warnings about restart-only settings, want %d: %v", i+1, len(got), 2*(i+1), got)
		}
		if diff := cmp.Diff(serverKeys, got[i]["keys"]); diff != "" {
			t.Errorf("reload %d: the server keys named (-want +got):\n%s", i+1, diff)
		}
		if diff := cmp.Diff(otherKeys, got[len(got)/2+i]["keys"]); diff != "" {
			t.Errorf("reload %d: the other keys named (-want +got):\n%s", i+1, diff)
		}
	}
	// Built now, the admin handler follows the config in force: no pprof.
	if code, _ := get(t, r.AdminHandler(), "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ after reloads that turned pprof on in the file: %d, want 404 (pprof changes on restart)", code)
	}
	if err := r.Reload(routerConfig(t, "", e.srv.URL)); err != nil {
		t.Fatal(err)
	}
	if got := warnings(); len(got) != 4 {
		t.Errorf("the file put back as it was: %d warnings in all, want still 4", len(got))
	}
	if diff := cmp.Diff(start, inForce()); diff != "" {
		t.Errorf("the file put back: the config in force (-want +got):\n%s", diff)
	}
}

// TestKeepRestartOnlyPeers: a reload keeps the peers section in force but for its secrets'
// sources, which it takes from the file (a rotation); a section added or removed by the file
// takes a restart.
func TestKeepRestartOnlyPeers(t *testing.T) {
	old := &config.Config{Peers: &config.Peers{Name: "a", Listen: "127.0.0.1:7001", SecretFile: "s1"}}
	file := &config.Config{Peers: &config.Peers{Name: "b", Listen: "127.0.0.1:7002", SecretFile: "s2", AcceptSecretFile: "s1"}}
	want := &config.Peers{Name: "a", Listen: "127.0.0.1:7001", SecretFile: "s2", AcceptSecretFile: "s1"}
	if diff := cmp.Diff(want, keepRestartOnly(old, file).Peers); diff != "" {
		t.Errorf("peers in force (-want +got):\n%s", diff)
	}
	if got := keepRestartOnly(old, &config.Config{}).Peers; !cmp.Equal(old.Peers, got) {
		t.Errorf("the section removed from the file: %+v in force, want %+v", got, old.Peers)
	}
	if got := keepRestartOnly(&config.Config{}, file).Peers; got != nil {
		t.Errorf("the section added by the file: %+v in force, want none", got)
	}
}

// TestReloadKeepsPolicyState: a reload that changes a parameter of prefix-aware keeps what it
// learned: a prompt placed before is predicted cached on its holder and goes there again, the
// prefill rates calibrated before stand, and the log says so. A change of policy starts
// empty, and the log says what was dropped.
func TestReloadKeepsPolicyState(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	logger, logs := jsonLogger()
	conf := func(policy string) *config.Config { return routerConfig(t, policy, a.srv.URL, b.srv.URL) }
	r, err := NewRouter(conf("policy: {name: prefix-aware}\n"), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	api, admin := r.Handler(), r.AdminHandler()
	chat := func(text string, stream bool) {
		t.Helper()
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, text)
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if rec.Code != http.StatusOK {
			t.Fatalf("chat: %d %s", rec.Code, rec.Body)
		}
	}
	// Streamed answers, whose first tokens calibrate the prefill rates (far above the prior's
	// 10,000 tokens/s on loopback).
	for i := range 12 {
		chat(fmt.Sprintf("conversation %d: %s", i, strings.Repeat("some words of its own, ", 20)), true)
	}
	doc := strings.Repeat("the same long document, ", 60)
	chat(doc, false)
	holder := a.srv.URL
	if len(b.received()) > len(a.received()) {
		holder = b.srv.URL
	}
	type candidate struct {
		Endpoint     string `json:"endpoint"`
		CachedTokens int    `json:"cached_tokens"`
	}
	explain := func() []candidate {
		t.Helper()
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/explain",
			strings.NewReader(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, doc))))
		var ex struct{ Candidates []candidate }
		if err := json.Unmarshal(rec.Body.Bytes(), &ex); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("/debug/explain: %d %s (%v)", rec.Code, rec.Body, err)
		}
		return ex.Candidates
	}
	before := explain()
	if before[0].Endpoint != holder || before[0].CachedTokens < 256 {
		t.Fatalf("before the reload: %+v, want %s first, holding the document", before, holder)
	}
	rates := map[string]float64{}
	for _, ep := range r.pool.All() {
		rates[ep.Name] = r.prefillRate(ep)
		if rates[ep.Name] <= 10000 {
			t.Fatalf("%s: prefill rate %v before the reload, want one calibrated above the prior", ep.Name, rates[ep.Name])
		}
	}
	picker := r.currentPicker()

	if err := r.Reload(conf("policy: {name: prefix-aware, params: {cache_weight: 4}}\n")); err != nil {
		t.Fatal(err)
	}
	if r.currentPicker() == picker {
		t.Fatal("the policy was not rebuilt with its new parameter")
	}
	if diff := cmp.Diff(before, explain()); diff != "" {
		t.Errorf("what the index predicts, after the reload (-before +after):\n%s", diff)
	}
	for _, ep := range r.pool.All() {
		if got := r.prefillRate(ep); got != rates[ep.Name] {
			t.Errorf("%s: prefill rate %v after the reload, %v before", ep.Name, got, rates[ep.Name])
		}
	}
	held := map[string]*fakeEngine{a.srv.URL: a, b.srv.URL: b}[holder]
	n := len(held.received())
	chat(doc, false)
	if len(held.received()) != n+1 {
		t.Errorf("the document after the reload did not go to its holder %s", holder)
	}
	kept := messages(t, logs, "policy parameters changed")
	if len(kept) != 1 || kept[0]["msg"] != "policy parameters changed: what the policy learned is kept" ||
		!cmp.Equal(kept[0]["changed"], []any{"cache_weight"}) || kept[0]["index_entries"].(float64) < 16 ||
		kept[0]["endpoints"] != 2.0 || kept[0]["fleet_calibrated"] != true {
		t.Errorf("the reload's log: %v; want the state kept, cache_weight changed, the index's entries and 2 endpoints", kept)
	}

	entries, _ := r.currentPicker().(policy.IndexSizer).IndexSize()
	if err := r.Reload(conf("policy: {name: cache-aware}\n")); err != nil {
		t.Fatal(err)
	}
	dropped := messages(t, logs, "policy rebuilt")
	if len(dropped) != 1 || dropped[0]["policy_before"] != "prefix-aware" || dropped[0]["policy"] != "cache-aware" ||
		dropped[0]["index_entries_dropped"] != float64(entries) {
		t.Errorf("a change of policy's log: %v; want it to say that %d index entries were dropped", dropped, entries)
	}
}

// TestReloadIndexSizeRoutesOn: a reload that changes max_index_entries keeps the index,
// resized where it is, and every request the router routes meanwhile is in it afterwards:
// each prompt is predicted cached where it went. The log says the index was resized and how
// many entries did not fit. Before, the index was copied into the new picker's while the old
// one routed on into its own, and what it routed during the copy was lost.
func TestReloadIndexSizeRoutesOn(t *testing.T) {
	a, b := newFakeEngine(t), newFakeEngine(t)
	logger, logs := jsonLogger()
	conf := func(params string) *config.Config {
		return routerConfig(t, "policy: {name: prefix-aware, params: {"+params+"}}\n", a.srv.URL, b.srv.URL)
	}
	r, err := NewRouter(conf(""), logger)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// 100,000 entries, through a snapshot as a peer's would come.
	const fill = 100_000
	x := prefix.NewIndex(prefix.IndexConfig{DefaultCapacity: fill})
	eps := r.pool.All()
	for i := range fill / 10 {
		keys := make([]uint64, 10)
		for k := range keys {
			keys[k] = uint64(10*i + k)
		}
		x.Insert(i%len(eps), prefix.Chain(nil, prefix.Seed("filler", ""), keys), int64(i+1))
	}
	var snap bytes.Buffer
	if _, err := x.WriteSnapshot(&snap, func(ep int) string { return eps[ep].Name }, fill+1, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := r.currentPicker().(policy.Snapshotter).ReadSnapshot(&snap, r.pool.ByName, 0); err != nil || n != fill {
		t.Fatalf("fixture: %d entries read (%v), want %d", n, err, fill)
	}

	api, admin := r.Handler(), r.AdminHandler()
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`,
			fmt.Sprintf("conversation %d: %s", i, strings.Repeat("words of its own, ", 30)))
	}
	var sent []int
	first, reloaded, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; i < 100_000; i++ {
			select {
			case <-reloaded:
				return
			default:
			}
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body(i))))
			if rec.Code != http.StatusOK {
				t.Errorf("request %d: %d %s", i, rec.Code, rec.Body)
				return
			}
			sent = append(sent, i)
			if i == 0 {
				close(first)
			}
		}
	}()
	select {
	case <-first:
	case <-stopped:
		t.Fatal("the client stopped before its first answer")
	case <-time.After(10 * time.Second):
		t.Fatal("no answer in 10 s")
	}
	err = r.Reload(conf("max_index_entries: 90000"))
	close(reloaded)
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not stop in 10 s")
	}
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for _, i := range sent {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/explain", strings.NewReader(body(i))))
		var ex struct {
			Candidates []struct {
				CachedTokens int `json:"cached_tokens"`
			}
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &ex); err != nil || rec.Code != http.StatusOK {
			t.Fatalf("/debug/explain: %d %s (%v)", rec.Code, rec.Body, err)
		}
		if len(ex.Candidates) == 0 || ex.Candidates[0].CachedTokens == 0 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of the %d prompts sent before and during the reload are not predicted cached after it", lost, len(sent))
	}
	kept := messages(t, logs, "policy parameters changed")
	if len(kept) != 1 || kept[0]["index_resized"] != true || kept[0]["index_evicted"].(float64) < fill-90000 ||
		!cmp.Equal(kept[0]["changed"], []any{"max_index_entries"}) {
		t.Errorf("the reload's log: %v; want max_index_entries changed, the index resized, %d entries or more evicted", kept, fill-90000)
	}
}
