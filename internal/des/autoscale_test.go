package des

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/workload"
)

// TestAutoscaleAddsInstances: a controller asks for a third instance at its second look and a
// fourth at its fourth; each joins Delay after it was asked for, takes no request before and
// some after; the controller is shown the instances in the fleet, and looks no more after the
// first look that follows the last arrival.
func TestAutoscaleAddsInstances(t *testing.T) {
	reqs := make([]workload.Request, 300)
	for i := range reqs {
		reqs[i] = req(i, time.Duration(i)*2*time.Millisecond, 64, 40, uint64(i), uint64(1000+i))
	}
	last := reqs[len(reqs)-1].Arrival
	type look struct {
		now              time.Duration
		endpoints, asked int
	}
	var looks []look
	cfg := toyConfig(5)
	cfg.WarmUp = -1
	cfg.Autoscale = &Autoscale{Start: 2, Interval: 100 * time.Millisecond, Delay: 50 * time.Millisecond, Want: func(v View) int {
		looks = append(looks, look{v.Now, len(v.Endpoints), v.Current})
		if v.Picker == nil {
			t.Error("the view has no picker")
		}
		return 2 + min(len(looks)/2, 2)
	}}
	res := run(t, cfg, reqs, Named("least-request", nil))
	want := []Scaled{
		{Instance: 2, Asked: 200 * time.Millisecond, Joined: 250 * time.Millisecond},
		{Instance: 3, Asked: 400 * time.Millisecond, Joined: 450 * time.Millisecond},
	}
	if diff := cmp.Diff(want, res.Scaled); diff != "" {
		t.Errorf("scaled (-want +got):\n%s", diff)
	}
	wantLooks := []look{{100 * time.Millisecond, 2, 2}, {200 * time.Millisecond, 2, 2}, {300 * time.Millisecond, 3, 3},
		{400 * time.Millisecond, 3, 3}, {500 * time.Millisecond, 4, 4}}
	for at := 600 * time.Millisecond; at < last+100*time.Millisecond; at += 100 * time.Millisecond { // up to the first look after the last arrival
		wantLooks = append(wantLooks, look{at, 4, 4})
	}
	if diff := cmp.Diff(wantLooks, looks, cmp.AllowUnexported(look{})); diff != "" {
		t.Errorf("looks (-want +got):\n%s", diff)
	}
	on := make([]int, 5)
	for _, r := range res.Records {
		if r.Err != "" {
			t.Errorf("request %s failed: %s", r.ID, r.Err)
			continue
		}
		on[r.EndpointID]++
		for _, s := range want {
			if r.EndpointID == s.Instance && r.Arrival < s.Joined {
				t.Errorf("request %s went to sim-%d at %v, before it joined at %v", r.ID, s.Instance, r.Arrival, s.Joined)
			}
		}
	}
	if on[2] == 0 || on[3] == 0 || on[4] != 0 {
		t.Errorf("requests per instance %v: want some on the two added, none on the one never asked for", on)
	}
}

func TestAutoscaleConfigErrors(t *testing.T) {
	w := Prepare(randomWorkload(3), "toy", 4)
	want := func(View) int { return 1 }
	for _, tc := range []struct {
		a       Autoscale
		changes []Change
		msg     string
	}{
		{Autoscale{Start: 0, Interval: time.Second, Want: want}, nil, "want 1..3"},
		{Autoscale{Start: 4, Interval: time.Second, Want: want}, nil, "want 1..3"},
		{Autoscale{Start: 1, Want: want}, nil, "autoscale interval"},
		{Autoscale{Start: 1, Interval: time.Second, Delay: -1, Want: want}, nil, "autoscale delay"},
		{Autoscale{Start: 1, Interval: time.Second}, nil, "no controller"},
		{Autoscale{Start: 1, Interval: time.Second, Want: want}, []Change{{Instance: 2, Kind: Add}}, "the autoscaler adds instances from 1"},
	} {
		cfg := toyConfig(3)
		cfg.Autoscale = &tc.a
		cfg.Changes = tc.changes
		if _, err := Run(t.Context(), cfg, w, "p", Named("round-robin", nil)); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%+v: err %v, want one saying %q", tc.a, err, tc.msg)
		}
	}
}
