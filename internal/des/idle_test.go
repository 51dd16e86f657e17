package des

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/workload"
)

// gapGaps are the silences between the bursts of gapWorkload: hours, a whole number of scrape
// intervals (so that the next scrape falls on the arrival's instant), one and a half, two and
// three intervals (too short to skip anything, the shortest that skip one), and odd ones.
var gapGaps = []time.Duration{
	time.Hour, 10 * DefaultScrapeInterval, 300 * time.Millisecond, 2 * DefaultScrapeInterval,
	3 * DefaultScrapeInterval, 37*time.Second + 3*time.Millisecond, 26 * time.Hour, 601 * time.Millisecond,
}

// gapWorkload is bursts of ten requests 2 ms apart, sharing prefixes across bursts, separated
// by gapGaps: a sparse trace whose gaps dwarf its bursts.
func gapWorkload() ([]workload.Request, []time.Duration) {
	var reqs []workload.Request
	var bursts []time.Duration
	at := time.Duration(0)
	for b := 0; b <= len(gapGaps); b++ {
		bursts = append(bursts, at)
		for j := range 10 {
			i := len(reqs)
			reqs = append(reqs, req(i, at, 64, 30+j, uint64(j%3), uint64(100+i)))
			at += 2 * time.Millisecond
		}
		if b < len(gapGaps) {
			at += gapGaps[b]
		}
	}
	return reqs, bursts
}

// snapSpy is a policy that sends each request to the candidate whose last scrape shows the
// fewest requests (the first of equals), and notes at every pick what each candidate's
// snapshot and progress said: what skipped scrapes would change if they mattered.
type snapSpy struct {
	clock policy.Clock
	seen  *[]string
}

func (p *snapSpy) Pick(_ *policy.Request, cands []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	best := 0
	load := func(ep *endpoint.Endpoint) int {
		if s := ep.Snapshot(); s != nil {
			return s.Running + s.Waiting
		}
		return 0
	}
	for k, ep := range cands {
		line := fmt.Sprintf("%v: sim-%d progress %d", p.clock.Now().Sub(Epoch()), ep.ID, ep.LastProgress())
		if s := ep.Snapshot(); s != nil {
			line += fmt.Sprintf(" snapshot %+v", *s)
		}
		*p.seen = append(*p.seen, line)
		if load(ep) < load(cands[best]) {
			best = k
		}
	}
	return []*endpoint.Endpoint{cands[best]}, nil
}

// TestIdleScrapesSkipped: a run that leaves out the scrapes of the gaps between bursts gives the
// same result, event count included, as one that takes every scrape, whatever else goes on in
// the gaps (network latency, faults and their recovery, instances added with their warm-up,
// replicas sharing events, an autoscaler looking), and its policies see the same snapshots.
func TestIdleScrapesSkipped(t *testing.T) {
	reqs, bursts := gapWorkload()
	inGap := func(b int, f float64) time.Duration {
		return bursts[b] + 20*time.Millisecond + time.Duration(f*float64(gapGaps[b]))
	}
	var looks []string
	type scenario struct {
		name   string
		cfg    func() Config
		policy string
		spy    bool
	}
	for _, sc := range []scenario{
		{name: "one router", policy: "prefix-aware", cfg: func() Config { return toyConfig(3) }},
		{name: "spy", spy: true, cfg: func() Config { return toyConfig(3) }},
		{name: "spy with latency and faults", spy: true, cfg: func() Config {
			c := toyConfig(4)
			c.NetworkLatency = 3 * time.Millisecond
			c.Changes = []Change{
				{At: inGap(0, 0.5), Instance: 1, Kind: Kill},
				{At: inGap(1, 0.3), Instance: 1, Kind: Recover},
				{At: bursts[2] + 5*time.Millisecond, Instance: 2, Kind: Hang},
				{At: inGap(5, 0.9), Instance: 2, Kind: Recover},
			}
			return c
		}},
		{name: "faults", policy: "prefix-aware", cfg: func() Config {
			c := toyConfig(4)
			c.NetworkLatency = time.Millisecond
			c.FirstTokenTimeout = 50 * time.Millisecond
			c.Changes = []Change{
				{At: bursts[0] + 3*time.Millisecond, Instance: 0, Kind: Blind},
				{At: inGap(2, 0.5), Instance: 0, Kind: Recover},
				{At: inGap(3, 0.2), Instance: 3, Kind: Fail},
				{At: inGap(6, 0.01), Instance: 3, Kind: Recover},
				{At: bursts[4], Instance: 1, Kind: Cut, Tokens: 3},
				{At: bursts[7], Instance: 1, Kind: Recover},
				{At: inGap(0, 0.75), Instance: 2, Kind: Add},
			}
			c.WarmUp = 0 // the live default
			return c
		}},
		{name: "replicas in sync", policy: "prefix-aware", cfg: func() Config {
			c := toyConfig(3)
			c.Routers = 3
			c.ReplicaSync = ReplicaSync{On: true, Delay: time.Millisecond, Batch: 10 * time.Millisecond, Loss: 0.2}
			return c
		}},
		{name: "autoscaler", policy: "least-request", cfg: func() Config {
			c := toyConfig(4)
			c.Autoscale = &Autoscale{Start: 1, Interval: 30 * time.Second, Delay: 2 * time.Second, Want: func(v View) int {
				busy := 0
				for _, ep := range v.Endpoints {
					if s := ep.Snapshot(); s != nil && s.Running+s.Waiting > 0 {
						busy++
					}
				}
				looks = append(looks, fmt.Sprintf("%v: %d busy of %d", v.Now, busy, len(v.Endpoints)))
				return v.Current + busy
			}}
			return c
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			var seen [2][]string
			var looked [2][]string
			var res [2]*Result
			for k, everyTick := range []bool{true, false} {
				cfg := sc.cfg()
				cfg.everyTick = everyTick
				np := Named(sc.policy, nil)
				if sc.spy {
					np = func(env policy.Env) (policy.Picker, error) { return &snapSpy{clock: env.Clock, seen: &seen[k]}, nil }
				}
				looks = nil
				res[k] = run(t, cfg, reqs, np)
				looked[k] = looks
			}
			if diff := cmp.Diff(res[0], res[1], cmpopts.IgnoreUnexported(Result{})); diff != "" {
				t.Errorf("result (-every scrape +idle ones skipped):\n%s", diff)
			}
			if diff := cmp.Diff(seen[0], seen[1]); diff != "" {
				t.Errorf("what the policy saw (-every scrape +idle ones skipped):\n%s", diff)
			}
			if diff := cmp.Diff(looked[0], looked[1]); diff != "" {
				t.Errorf("what the autoscaler saw (-every scrape +idle ones skipped):\n%s", diff)
			}
			if res[0].skipped != 0 {
				t.Errorf("taking every scrape, %d were skipped", res[0].skipped)
			}
			// An hour and a day of gaps alone hold 27 x 18,000 scrapes; all but a few go (the autoscaler looks every 30 s).
			if want := 27 * 18_000 * 95 / 100; res[1].skipped < want {
				t.Errorf("%d scrapes skipped, want at least %d", res[1].skipped, want)
			}
			for i, r := range res[1].Records {
				if r.Err != "" && sc.name == "one router" {
					t.Errorf("request %d failed: %s", i, r.Err)
				}
			}
		})
	}
}

// TestIdleTicks works out by hand which scrape comes next after one at 1 s, with 200 ms
// intervals, for the next event at each time: only scrapes strictly before the event are
// skipped, and the last of them is kept.
func TestIdleTicks(t *testing.T) {
	for _, tc := range []struct {
		next time.Duration
		want time.Duration // the next scrape's time
	}{
		{next: ms(1000), want: ms(1200)},   // an event at the same instant
		{next: ms(1150), want: ms(1200)},   // before the next scrape
		{next: ms(1200), want: ms(1200)},   // at the next scrape
		{next: ms(1400), want: ms(1200)},   // one scrape before it
		{next: ms(1401), want: ms(1400)},   // two: the first is skipped
		{next: ms(1600), want: ms(1400)},   // two, the event on the third
		{next: ms(11000), want: ms(10800)}, // 48 of the 49 before it skipped
	} {
		s := &sim{cfg: Config{ScrapeInterval: DefaultScrapeInterval}, events: 7, seq: 9}
		s.queue.push(event{at: tc.next, kind: evArrival})
		got := ms(1000) + s.idleTicks(ms(1000))*DefaultScrapeInterval
		if got != tc.want {
			t.Errorf("next event at %v: next scrape at %v, want %v", tc.next, got, tc.want)
		}
		skipped := int((tc.want-ms(1000))/DefaultScrapeInterval) - 1
		if s.skipped != skipped || s.events != 7+skipped || s.seq != uint64(9+skipped) {
			t.Errorf("next event at %v: skipped %d, events %d, seq %d; want %d, %d, %d", tc.next, s.skipped, s.events, s.seq, skipped, 7+skipped, 9+skipped)
		}
	}
}
