package des

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/workload"
)

// TestKillInstanceMidRun: one of 8 instances dies at half time. Every request that was not on
// it at that moment completes. Of the ones it held, those whose first token had reached the
// client fail; those still without one were a connection lost before any byte, which the live
// router sends to the next ranked endpoint once (route.FailLost is RetryableOnce), and
// complete elsewhere. The losses eject it (consecutive counted failures), so nothing completes
// on it afterwards.
func TestKillInstanceMidRun(t *testing.T) {
	const victim = 3
	reqs := killWorkload()
	half := reqs[len(reqs)-1].Arrival / 2
	cfg := toyConfig(8)
	cfg.Changes = []Change{{At: half, Instance: victim, Kind: Kill}}
	res := run(t, cfg, reqs, Named("prefix-aware", nil))
	lost, retried := 0, 0
	for _, r := range res.Records {
		switch {
		case r.Err != "":
			if r.EndpointID != victim || !strings.Contains(r.Err, "died") || r.Arrival > half || r.FirstToken == 0 || r.FirstToken > half {
				t.Errorf("request %s failed: %+v; only those streaming from sim-%d at %v may fail", r.ID, r, victim, half)
			}
			lost++
		case r.EndpointID == victim && r.Finish > half:
			t.Errorf("request %s completed on the dead instance after it died: %+v", r.ID, r)
		case r.Attempts > 1:
			retried++
		}
	}
	if lost == 0 {
		t.Error("no request was on the killed instance when it died: the test proves nothing")
	}
	t.Logf("lost %d, sent again %d", lost, retried)
}

// TestKillIdleInstanceFallsBack: an instance that dies holding nothing is still ranked first
// by the policy for a while: requests sent there meet a refused connection and fall back to
// the next ranked endpoint, until passive ejection takes it out. None fails.
func TestKillIdleInstanceFallsBack(t *testing.T) {
	const victim = 3
	reqs := killWorkload()
	cfg := toyConfig(8)
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Kill}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	fellBack := 0
	for _, r := range res.Records {
		if r.Err != "" || r.EndpointID == victim {
			t.Errorf("request %s: %+v; want every request served elsewhere", r.ID, r)
		}
		if r.Attempts > 1 {
			fellBack++
		}
	}
	if fellBack == 0 || fellBack > route.DefaultConsecutive {
		t.Errorf("%d requests fell back: want at least one, and at most %d before ejection", fellBack, route.DefaultConsecutive)
	}
}

// killWorkload is 400 requests in 40 prefix groups, one per 2 ms, each decoding for ~100 steps.
func killWorkload() []workload.Request {
	reqs := make([]workload.Request, 400)
	for i := range reqs {
		reqs[i] = req(i, time.Duration(i)*2*time.Millisecond, 64, 100, uint64(i%40), uint64(1000+i))
	}
	return reqs
}

// TestAddInstanceMidRun: an instance added at half time takes no request before and some
// after.
func TestAddInstanceMidRun(t *testing.T) {
	reqs := make([]workload.Request, 200)
	for i := range reqs {
		reqs[i] = req(i, time.Duration(i)*5*time.Millisecond, 64, 40, uint64(i), uint64(1000+i))
	}
	half := reqs[len(reqs)-1].Arrival / 2
	cfg := toyConfig(4)
	cfg.Changes = []Change{{At: half, Instance: 3, Kind: Add}}
	res := run(t, cfg, reqs, Named("least-request", nil))
	after := 0
	for _, r := range res.Records {
		if r.Err != "" {
			t.Errorf("request %s failed: %s", r.ID, r.Err)
		}
		if r.EndpointID == 3 {
			if r.Arrival < half {
				t.Errorf("request %s went to sim-3 at %v, before it was added at %v", r.ID, r.Arrival, half)
			}
			after++
		}
	}
	if after == 0 {
		t.Error("the added instance took no request")
	}
}

func TestChangesConfigErrors(t *testing.T) {
	w := Prepare(randomWorkload(3), "toy", 4)
	for _, tc := range []struct {
		changes []Change
		want    string
	}{
		{[]Change{{Instance: 9}}, "instance 9"},
		{[]Change{{Instance: 0, At: -1}}, "want >= 0"},
		{[]Change{{Instance: 1, Kind: Add}, {Instance: 1, Kind: Add}}, "added twice"},
		{[]Change{{Instance: 0, Kind: Add}, {Instance: 1, Kind: Add}}, "from the start"},
	} {
		cfg := toyConfig(2)
		cfg.Changes = tc.changes
		if _, err := Run(t.Context(), cfg, w, "p", Named("round-robin", nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want one saying %q", tc.changes, err, tc.want)
		}
	}
}

// TestKillCutsRetriedStream: a request answered 500 by sim-0 goes on to sim-1 (its one retry
// after a 500), which dies while streaming it. Live, the router had relayed part of the stream:
// the request ends as a cut stream, which counts against sim-1 whatever failed before it (not
// as the request's second lost-or-5xx failure, which points at the request and counts against
// no instance). With one counted failure ejecting, both instances are ejected.
func TestKillCutsRetriedStream(t *testing.T) {
	cfg := toyConfig(4)
	cfg.Changes = []Change{{At: 0, Instance: 0, Kind: Fail}, {At: 50 * time.Millisecond, Instance: 1, Kind: Kill}}
	var ejected []string
	cfg.Outlier = route.OutlierConfig{Consecutive: 1, OnEject: func(ep *endpoint.Endpoint, _ time.Duration, _ bool) {
		ejected = append(ejected, ep.Name)
	}}
	// 200 tokens to decode: about 200 ms, streaming from sim-1 when it dies.
	res := run(t, cfg, []workload.Request{req(0, 0, 8, 200, 1, 2)}, Named("round-robin", nil))
	if r := res.Records[0]; r.Attempts != 2 || r.EndpointID != 1 || r.FirstToken == 0 || !strings.Contains(r.Err, "died") {
		t.Errorf("request: %+v; want it streaming from sim-1 after sim-0's 500, failed when sim-1 died", r)
	}
	if diff := cmp.Diff([]string{"sim-0", "sim-1"}, ejected); diff != "" {
		t.Errorf("ejected (-want +got):\n%s", diff)
	}
}
