package experiment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/des"
)

func TestParseScale(t *testing.T) {
	got, err := ParseScale("start=2, target=0.5,interval=10s,delay=1m,window=30s,rate=25000,every=20s", 6)
	if err != nil {
		t.Fatal(err)
	}
	want := ScaleSpec{Start: 2, Target: 0.5, Interval: 10 * time.Second, Delay: time.Minute, Window: 30 * time.Second, Rate: 25000, Every: 20 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Defaults: the whole fleet, watching only, every look a row.
	got, err = ParseScale("every=30s", 8)
	if err != nil || got.Start != 8 || got.Target != 0 || got.Every != 30*time.Second || got.Delay != 2*time.Minute {
		t.Errorf("defaults: %+v, %v", got, err)
	}
	_, err = ParseScale("start=0,target=-1,interval=0s,delay=-1s,rate=x,color=red,every=45s,window", 4)
	for _, want := range []string{"start=0: want 1..4", "target=-1: want a load per engine", "interval=0s: want a positive duration",
		"delay=-1s: want a positive duration", `rate=x: strconv.ParseFloat`, "color=red: unknown key", `"window" is not key=value`,
		"every=45s: want a multiple of interval=30s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

func TestParseRamp(t *testing.T) {
	if from, to, err := ParseRamp("0.4-1.6"); err != nil || from != 0.4 || to != 1.6 {
		t.Errorf("0.4-1.6: %g, %g, %v", from, to, err)
	}
	for _, bad := range []string{"1", "0-1", "a-b", "1-", "-1-2", "1-inf"} {
		if _, _, err := ParseRamp(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestSimulate_Autoscale: a fleet that starts at one instance of three under a workload that
// outgrows it has instances added, each joining the delay after it was asked for; the table
// has the timeline after the summary, the JSON the looks. Watching only adds nothing.
func TestSimulate_Autoscale(t *testing.T) {
	o := SimulateOptions{Workload: "shared-prefix:n=1200,groups=600,prompts=2,system=2000,question=500,output=20,rate=10", Instances: 3,
		Profile: "llama3-8b-h100-tp1", Policies: "prefix-aware", Seed: 1, ScrapeInterval: 200 * time.Millisecond,
		Routers: 1, ReplicaAffinity: "none", Ramp: "0.5-1.5", Autoscale: "start=1,target=0.5,interval=5s,delay=10s,window=10s,every=10s"}
	sim, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := sim.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	for _, want := range []string{"autoscale: target 0.5 per engine on kvroute_model_load", "looks every 5s, an engine asked for serves 10s later",
		"time  engines  asked", "prefix-aware: mean saturation"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	sc := sim.scaling[0]
	if len(sc.Added) == 0 {
		t.Fatalf("no instance added:\n%s", out)
	}
	for _, a := range sc.Added {
		if a.Joined-a.Asked != 10*time.Second || a.Instance < 1 || a.Instance > 2 {
			t.Errorf("added %+v: want instance 1 or 2, joining 10s after it was asked for", a)
		}
	}
	if sc.EngineShare <= 1.0/3 || sc.EngineShare >= 1 {
		t.Errorf("engine share %g: want between one engine's and three's", sc.EngineShare)
	}
	var js bytes.Buffer
	if err := sim.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Autoscale []struct {
			Looks []struct {
				Load float64 `json:"load"`
			} `json:"looks"`
		} `json:"autoscale"`
	}
	if err := json.Unmarshal(js.Bytes(), &doc); err != nil || len(doc.Autoscale) != 1 || len(doc.Autoscale[0].Looks) == 0 {
		t.Errorf("JSON autoscale: %v (err %v)", doc, err)
	}

	o.Autoscale = "start=1,interval=5s"
	watch, err := Simulate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(watch.scaling[0].Added); n != 0 || watch.scaling[0].EngineShare > 1.0/3+1e-9 {
		t.Errorf("watching only: %d added, engine share %g; want none, one engine of three", n, watch.scaling[0].EngineShare)
	}

	o.Autoscale, o.Ramp = "start=9", "flat"
	if _, err := Simulate(context.Background(), o); !errors.As(err, new(*UsageError)) || !strings.Contains(err.Error(), "start=9") || !strings.Contains(err.Error(), `--ramp "flat"`) {
		t.Errorf("bad --autoscale and --ramp: %v, want a usage error naming both", err)
	}
}

// TestWriteScaling_Joins: the summary names the engines added by their number, not as a count
// ("4 at 3:30" read as four engines), with when each was asked for; engines that join after the
// timeline's last look are said to, and why the timeline stops there.
func TestWriteScaling_Joins(t *testing.T) {
	m := func(mm, ss int) time.Duration { return time.Duration(mm)*time.Minute + time.Duration(ss)*time.Second }
	run := scaling{
		Policy: "prefix-aware",
		Added: []des.Scaled{
			{Instance: 4, Asked: m(1, 30), Joined: m(3, 30)},
			{Instance: 5, Asked: m(4, 0), Joined: m(6, 0)},
			{Instance: 6, Asked: m(4, 30), Joined: m(6, 30)},
			{Instance: 7, Asked: m(4, 30), Joined: m(6, 30)},
		},
	}
	for _, at := range []time.Duration{m(4, 30), m(5, 0)} {
		run.rows = append(run.rows, scaleRow{look: look{At: at, Engines: 5, Asked: 8, Wanted: 8}})
	}
	var b bytes.Buffer
	if err := writeScaling(&b, ScaleSpec{Interval: 30 * time.Second, Delay: 2 * time.Minute, Window: time.Minute}, []scaling{run}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"engines added: engine 4 joined at 3:30 (asked for at 1:30), engine 5 joined at 6:00 (asked for at 4:00), engines 6 and 7 joined at 6:30 (asked for at 4:30);",
		"\n  engine 5 joined at 6:00 (asked for at 4:00), engines 6 and 7 joined at 6:30 (asked for at 4:30), after the last row (5:00): the timeline ends at the first look after the last arrival, so every request had arrived before they joined\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("autoscale report lacks %q:\n%s", want, out)
		}
	}

	// Every join within the timeline: no such line; none added: "none".
	run.Added = run.Added[:1]
	b.Reset()
	if err := writeScaling(&b, ScaleSpec{Interval: 30 * time.Second}, []scaling{run}); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); strings.Contains(out, "after the last row") || !strings.Contains(out, "engines added: engine 4 joined at 3:30 (asked for at 1:30);") {
		t.Errorf("one engine joined within the timeline:\n%s", out)
	}
	run.Added = nil
	b.Reset()
	if err := writeScaling(&b, ScaleSpec{Interval: 30 * time.Second}, []scaling{run}); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "engines added: none;") || strings.Contains(out, "after the last row") {
		t.Errorf("none added:\n%s", out)
	}
}
