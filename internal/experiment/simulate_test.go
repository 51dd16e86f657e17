package experiment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/report"
)

// TestSimulate_BadOptionsAllAtOnce: every problem is named in one usage error, before any work.
func TestSimulate_BadOptionsAllAtOnce(t *testing.T) {
	_, err := Simulate(context.Background(), SimulateOptions{
		Instances: 0, Profile: "gpt-9", Policies: "nope", Load: 0.5, Speedup: 2, BlockSize: -1,
		ScrapeInterval: 0, NetworkLatency: -time.Second, Routers: 0, ReplicaAffinity: "sticky",
	})
	if !errors.As(err, new(*UsageError)) {
		t.Fatalf("err %v, want a usage error", err)
	}
	for _, want := range []string{"exactly one of --trace FILE or --workload NAME", `--profile: `, `"nope"`, "--instances 0",
		"not both", "--block-size -1", "--scrape-interval 0s", "--network-latency -1s", "--routers 0", `--replica-affinity "sticky"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestSimulate_Routers: one router prints what a single router always printed; several say so
// in the table's header line and in the JSON scenario, with the same results.
func TestSimulate_Routers(t *testing.T) {
	o := SimulateOptions{Workload: "prefix-repetition:n=40,prefixes=4", Instances: 2, Profile: "llama3-8b-h100-tp1",
		Policies: "round-robin", Speedup: 1, Seed: 1, ScrapeInterval: 200 * time.Millisecond, Routers: 1, ReplicaAffinity: "none"}
	one, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var table, plain bytes.Buffer
	if err := one.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteTable(&plain, one.Summary); err != nil {
		t.Fatal(err)
	}
	if table.String() != plain.String() {
		t.Errorf("one router: table differs from report.WriteTable:\n%s\nvs\n%s", table.String(), plain.String())
	}

	o.Routers, o.ReplicaAffinity = 3, "session"
	three, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	table.Reset()
	if err := three.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	head, _, _ := strings.Cut(table.String(), "\n")
	if !strings.HasPrefix(head, "workload prefix-repetition:n=40,prefixes=4: 40 requests") || !strings.HasSuffix(head, ", 3 router replicas (by session key)") {
		t.Errorf("header %q, want the scenario then the replicas", head)
	}
	var js bytes.Buffer
	if err := three.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Scenario struct {
			Requests        int    `json:"requests"`
			Routers         int    `json:"routers"`
			ReplicaAffinity string `json:"replica_affinity"`
		} `json:"scenario"`
		Results []report.Result `json:"results"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Scenario.Requests != 40 || doc.Scenario.Routers != 3 || doc.Scenario.ReplicaAffinity != "session" || len(doc.Results) != 1 {
		t.Errorf("JSON %s: want 40 requests, 3 routers by session, one result", js.String())
	}
	// round-robin with the same seed completes every request either way.
	if diff := cmp.Diff([]int{40, 40}, []int{one.Results[0].Completed, three.Results[0].Completed}); diff != "" {
		t.Errorf("completed (-want +got):\n%s", diff)
	}
}

// TestSimulate_EpochTimestamps: a trace stamped in Unix milliseconds simulates at once, with
// the same results as the same trace stamped from 0 (the simulator would otherwise scrape
// every 200 ms of virtual time for 55 years before the first arrival).
func TestSimulate_EpochTimestamps(t *testing.T) {
	const line = `{"timestamp": %d, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}` + "\n"
	run := func(base int64) []report.Result {
		t.Helper()
		path := filepath.Join(t.TempDir(), "trace.jsonl")
		var b strings.Builder
		for i := range int64(3) {
			fmt.Fprintf(&b, line, base+100*i)
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sim, err := Simulate(ctx, SimulateOptions{Trace: path, Instances: 2, Profile: "llama3-8b-h100-tp1",
			Policies: "round-robin", Seed: 1, ScrapeInterval: 200 * time.Millisecond, Routers: 1, ReplicaAffinity: "none"})
		if err != nil {
			t.Fatalf("base %d: %v", base, err)
		}
		for i := range sim.Results {
			sim.Results[i].WallSeconds = 0
		}
		return sim.Results
	}
	want := run(0)
	if diff := cmp.Diff(want, run(1_733_500_000_000)); diff != "" {
		t.Errorf("results differ from the trace stamped from 0 (-want +got):\n%s", diff)
	}
}
