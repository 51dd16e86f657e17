package experiment

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/route"
)

// TestFaultDefaultsAreLive: the simulator's timeout and ejection defaults are the live router's.
func TestFaultDefaultsAreLive(t *testing.T) {
	cfg, err := config.Parse([]byte("endpoints: [{url: 'http://127.0.0.1:1', models: [m]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		sim, live any
	}{
		{"first_token_timeout", des.DefaultFirstTokenTimeout, cfg.Limits.FirstTokenTimeout.D()},
		{"stall_timeout", des.DefaultStallTimeout, cfg.Limits.StallTimeout.D()},
		{"stream_idle_timeout", des.DefaultStreamIdleTimeout, cfg.Limits.StreamIdleTimeout.D()},
		{"response_timeout", des.ResponseTimeout, cfg.Limits.ResponseTimeout.D()},
		{"passive_failures", des.DefaultPassiveFailures, cfg.Health.PassiveFailures},
		{"ejection_time", route.DefaultBaseEjection, cfg.Health.EjectionTime.D()},
		{"max_ejection_time", route.DefaultMaxEjection, cfg.Health.MaxEjectionTime.D()},
		{"max_ejected_percent", route.DefaultMaxEjectedPercent, cfg.Health.MaxEjectedPercent},
	} {
		if c.sim != c.live {
			t.Errorf("%s: the simulator's default is %v, the router's %v", c.name, c.sim, c.live)
		}
	}
}

func TestSimulate_BadFaultOptions(t *testing.T) {
	_, err := Simulate(context.Background(), SimulateOptions{
		Workload: "multi-turn", Instances: 2, Profile: "llama3-8b-h100-tp1", Policies: "round-robin", ScrapeInterval: time.Second,
		Routers: 1, ReplicaAffinity: "none", Cut: []string{"0@10%"}, Blind: []string{"7@10%"}, CutAfter: 0, FirstTokenTimeout: -time.Second, StallTimeout: -time.Second,
		EjectionTime: time.Minute, MaxEjectionTime: time.Second, PassiveFailures: -1, MaxEjectedPercent: 101,
	})
	if !errors.As(err, new(*UsageError)) {
		t.Fatalf("err %v, want a usage error", err)
	}
	for _, want := range []string{"--cut-after 0", "--blind 7@10%: instance 7, want 0 to 1 (--instances 2)", "--first-token-timeout -1s", "--stall-timeout -1s", "--max-ejection-time 1s", "--passive-failures -1", "--max-ejected-percent 101"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = Simulate(context.Background(), SimulateOptions{
		Workload: "prefix-repetition:n=10", Instances: 2, Profile: "llama3-8b-h100-tp1", Policies: "round-robin", ScrapeInterval: time.Second,
		Routers: 1, ReplicaAffinity: "none", Hang: []string{"one@now"},
	})
	if !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), "--hang") {
		t.Errorf("err %v, want a usage error naming --hang", err)
	}
}

// faultOptions returns the options of a run of policy on workload over four instances, with
// the live router's timeouts and no fault yet.
func faultOptions(workload, policy string) SimulateOptions {
	return SimulateOptions{Workload: workload, Instances: 4, Profile: "llama3-8b-h100-tp1",
		Policies: policy, Speedup: 1, Seed: 1, ScrapeInterval: 200 * time.Millisecond, Routers: 1, ReplicaAffinity: "none",
		FirstTokenTimeout: des.DefaultFirstTokenTimeout, StreamIdleTimeout: des.DefaultStreamIdleTimeout,
		StallTimeout: des.DefaultStallTimeout}
}

// TestSimulate_Faults: an instance that fails fast from the start costs no request (each is
// retried once elsewhere); two such fail what round-robin sends the first and retries on the
// second until the first is ejected (passive_failures of them); without ejection, its share.
// The table says what failed and how the router met it.
func TestSimulate_Faults(t *testing.T) {
	// One instance answering 500 to everything: each request it gets is sent once more to
	// another (a 500 is retried once per request, as live), so none fails.
	o := faultOptions("prefix-repetition:n=80,prefixes=4", "round-robin")
	o.Fail = []string{"1@0%"}
	sim, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r := sim.Results[0]; r.Failed != 0 || r.Completed != 80 {
		t.Errorf("completed %d failed %d, want 80 and 0 (a 500 is retried once)", r.Completed, r.Failed)
	}
	var b bytes.Buffer
	if err := sim.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if want := "faults: --fail 1@0%; first-token timeout 2m0s, stall timeout 10s, stream idle timeout 1m0s, passive_failures 3, ejection 30s"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
	// Two: a request round-robin sends to the first and retries on the second fails there
	// (its second 500 is final), until passive_failures of them eject the first; without
	// ejection, every request sent to the first fails so.
	o.Fail = []string{"1@0%", "2@0%"}
	sim, err = Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r := sim.Results[0]; r.Failed != des.DefaultPassiveFailures || r.Completed != 80-des.DefaultPassiveFailures {
		t.Errorf("two failing: completed %d failed %d, want %d failed (then ejected)", r.Completed, r.Failed, des.DefaultPassiveFailures)
	}
	o.PassiveFailures = 1 << 30
	sim, err = Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r := sim.Results[0]; r.Failed != 20 {
		t.Errorf("two failing, without ejection: failed %d, want round-robin's share of the first, 20", r.Failed)
	}
}

// TestSimulate_Blind: an instance blind from the start is found by the routers' cache audit,
// which the table and the JSON report; without the audit (NoAudit) neither says anything.
func TestSimulate_Blind(t *testing.T) {
	o := faultOptions("prefix-repetition:n=400,prefixes=4", "prefix-aware")
	o.Blind = []string{"1@0%"}
	o.HTML = filepath.Join(t.TempDir(), "report.html")
	sim, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	r := sim.Results[0]
	if r.Failed != 0 || len(r.CacheAudit) == 0 || r.CacheAudit[0].Instance != 1 || !r.CacheAudit[0].Blind {
		t.Fatalf("failed %d, audit verdicts %+v; want none failed, instance 1 found blind", r.Failed, r.CacheAudit)
	}
	var b, j bytes.Buffer
	if err := sim.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if err := sim.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"faults: --blind 1@0%", "cache audit, instances whose reported hits stayed far below the predictions (blind) and agree again (sees): prefix-aware: 1 blind "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	if !strings.Contains(j.String(), `"cache_audit": [`) {
		t.Errorf("JSON lacks cache_audit:\n%s", j.String())
	}
	if h, err := os.ReadFile(o.HTML); err != nil || !strings.Contains(string(h), "--blind 1@0%") || !strings.Contains(string(h), "prefix-aware: 1 blind ") {
		t.Errorf("the HTML report lacks the fault and the verdict (err %v)", err)
	}
	o.HTML = ""

	o.NoAudit = true
	if sim, err = Simulate(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	if err := sim.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if len(sim.Results[0].CacheAudit) != 0 || strings.Contains(b.String(), "cache audit") {
		t.Errorf("without the audit: verdicts %+v, table:\n%s", sim.Results[0].CacheAudit, b.String())
	}
}
