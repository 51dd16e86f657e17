package des

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/workload"
)

// conversations is a workload of many conversations whose turns each repeat the previous
// turn's prompt and add to it, interleaved, so that the replica a turn reaches rarely routed
// the turn before.
func conversations(convs, turns int) []workload.Request {
	var reqs []workload.Request
	for t := range turns {
		for c := range convs {
			var blocks []uint64
			for b := range 4 * (t + 1) {
				blocks = append(blocks, uint64(c*1000+b+1))
			}
			at := time.Duration(t*convs+c) * 3 * time.Millisecond
			reqs = append(reqs, req(len(reqs), at, 4*len(blocks), 2, blocks...))
		}
	}
	return reqs
}

func hitRate(recs []report.Record) float64 {
	var hit, all int
	for _, r := range recs {
		hit += r.CachedTokens
		all += r.PromptTokens
	}
	return float64(hit) / float64(all)
}

// fixedPicker ranks candidates by the request's number, whatever it knows (so that its
// decisions cannot depend on what it heard), and records the load it saw at each pick.
type fixedPicker struct {
	seen map[string][][2]int // request ID -> each candidate's in flight and pending prefill
}

func (p *fixedPicker) Pick(r *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	var v [][2]int
	for _, e := range c {
		v = append(v, [2]int{e.InFlight(), e.PendingPrefill()})
	}
	p.seen[r.ID] = v
	n, _ := strconv.Atoi(r.ID)
	k := n % len(c)
	return append(slices.Clone(c[k:]), c[:k]...), nil
}

// TestReplicaSyncWithoutDelayIsOneRouter: replicas that hear every event at once see, at each
// pick, the load of the whole fleet, as one router does; with a delay they see it late.
func TestReplicaSyncWithoutDelayIsOneRouter(t *testing.T) {
	reqs := conversations(12, 5)
	pickers := func(out *[]*fixedPicker) NewPicker {
		return func(policy.Env) (policy.Picker, error) {
			p := &fixedPicker{seen: map[string][][2]int{}}
			*out = append(*out, p)
			return p, nil
		}
	}
	merged := func(ps []*fixedPicker) map[string][][2]int {
		m := map[string][][2]int{}
		for _, p := range ps {
			maps.Copy(m, p.seen)
		}
		return m
	}
	cfg := toyConfig(4)
	var one []*fixedPicker
	oneRes := run(t, cfg, reqs, pickers(&one))
	cfg.Routers = 3
	cfg.ReplicaSync = ReplicaSync{On: true}
	var three []*fixedPicker
	threeRes := run(t, cfg, reqs, pickers(&three))
	if diff := cmp.Diff(oneRes.Records, threeRes.Records); diff != "" {
		t.Errorf("records of 3 replicas syncing at once differ from one router's (-one +three):\n%s", diff)
	}
	if diff := cmp.Diff(merged(one), merged(three)); diff != "" {
		t.Errorf("load seen at each pick (-one router +3 replicas):\n%s", diff)
	}
	if diff := cmp.Diff([]int{20, 20, 20}, threeRes.Routed); diff != "" {
		t.Errorf("routed per replica (-want +got):\n%s", diff)
	}
	// Without sync each replica sees a third; with a delay, the picture lags.
	for _, rs := range []ReplicaSync{{}, {On: true, Delay: 2 * time.Millisecond}} {
		cfg.ReplicaSync = rs
		var late []*fixedPicker
		run(t, cfg, reqs, pickers(&late))
		if cmp.Equal(merged(one), merged(late)) {
			t.Errorf("sync %v: every pick saw the whole fleet's load", rs)
		}
	}
}

// TestReplicaSyncKeepsHitRate: four replicas that share their events with a small delay keep
// the hit rate that a conversation workload loses without sharing.
func TestReplicaSyncKeepsHitRate(t *testing.T) {
	reqs := conversations(13, 5) // 13: a conversation's turns reach the 4 replicas in turn
	cfg := toyConfig(4)
	one := hitRate(run(t, cfg, reqs, Named("prefix-aware", nil)).Records)
	cfg.Routers = 4
	alone := hitRate(run(t, cfg, reqs, Named("prefix-aware", nil)).Records)
	cfg.ReplicaSync = ReplicaSync{On: true, Delay: time.Millisecond}
	shared := hitRate(run(t, cfg, reqs, Named("prefix-aware", nil)).Records)
	t.Logf("hit rate: one router %.3f, 4 replicas alone %.3f, sharing %.3f", one, alone, shared)
	if one < 0.5 || shared < 0.97*one || alone > 0.9*one {
		t.Errorf("hit rate: one router %.3f, 4 replicas alone %.3f, sharing after 1ms %.3f; want sharing >= 0.97 x one, alone well below", one, alone, shared)
	}
}

// TestReplicaSyncLoss: lost events leave remote attempts in flight until their TTL, but the
// run completes, and is the same again with the same seed.
func TestReplicaSyncLoss(t *testing.T) {
	reqs := conversations(10, 4)
	cfg := toyConfig(3)
	cfg.Routers = 3
	cfg.ReplicaSync = ReplicaSync{On: true, Delay: 2 * time.Millisecond, Loss: 0.3}
	a := run(t, cfg, reqs, Named("prefix-aware", nil))
	b := run(t, cfg, reqs, Named("prefix-aware", nil))
	if diff := cmp.Diff(a.Records, b.Records); diff != "" {
		t.Errorf("two runs with the same seed differ (-a +b):\n%s", diff)
	}
	for _, r := range a.Records {
		if r.Err != "" {
			t.Errorf("request %s failed: %s", r.ID, r.Err)
		}
	}
}

func TestParseReplicaSync(t *testing.T) {
	for _, c := range []struct {
		delay string
		loss  float64
		batch time.Duration
		want  ReplicaSync
		err   string
	}{
		{"off", 0, 0, ReplicaSync{}, ""},
		{"1ms", 0, 0, ReplicaSync{On: true, Delay: time.Millisecond}, ""},
		{"0s", 0.1, 0, ReplicaSync{On: true, Loss: 0.1}, ""},
		{"0s", 0, 10 * time.Millisecond, ReplicaSync{On: true, Batch: 10 * time.Millisecond}, ""},
		{"fast", 0, 0, ReplicaSync{}, "want off or a delay"},
		{"-1ms", 0, 0, ReplicaSync{}, "want off or a delay"},
		{"1ms", 1, 0, ReplicaSync{}, "probability"},
		{"off", 0.2, 0, ReplicaSync{}, "needs --replica-sync"},
		{"off", 0, time.Millisecond, ReplicaSync{}, "--replica-sync-batch needs --replica-sync"},
		{"1ms", 0, -time.Millisecond, ReplicaSync{}, "want 0 (each event on its own) or an interval"},
		{"1ms", 0, 2 * time.Second, ReplicaSync{}, "up to 1s"},
	} {
		got, err := ParseReplicaSync(c.delay, c.loss, c.batch)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseReplicaSync(%q, %g, %v): err %v, want one saying %q", c.delay, c.loss, c.batch, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseReplicaSync(%q, %g, %v) = %+v, %v, want %+v", c.delay, c.loss, c.batch, got, err, c.want)
		}
		if back, err := ParseReplicaSync(got.String(), 0, 0); c.loss == 0 && c.batch == 0 && (err != nil || back != got) {
			t.Errorf("String %q reads back as %+v, %v", got.String(), back, err)
		}
	}
	cfg := toyConfig(1)
	cfg.ReplicaSync = ReplicaSync{On: true, Loss: 2}
	if _, err := Run(context.Background(), cfg, Prepare(randomWorkload(2), "toy", 4), "p", Named("random", nil)); err == nil || !strings.Contains(err.Error(), "loss") {
		t.Errorf("loss 2: err %v, want one naming the loss", err)
	}
}

// TestReplicaSyncBatches: with batches, a replica's events leave together a batch interval
// after the first of them, in the order they happened, and reach every other replica the
// transit later; an event after a batch left opens the next one.
func TestReplicaSyncBatches(t *testing.T) {
	ms := time.Millisecond
	s := &sim{cfg: Config{ReplicaSync: ReplicaSync{On: true, Delay: ms, Batch: 10 * ms}}}
	s.routers = make([]router, 3)
	out := &syncOut{s: s, from: 1}
	type sent struct {
		at time.Duration
		id uint64
	}
	var want []sent
	for i, at := range []time.Duration{2 * ms, 5 * ms, 12 * ms, 12 * ms, 13 * ms, 40 * ms} {
		s.clock.now = at
		out.Publish(&route.Event{ID: uint64(i)})
		leaves := []time.Duration{12 * ms, 12 * ms, 22 * ms, 22 * ms, 22 * ms, 50 * ms}[i]
		want = append(want, sent{leaves + ms, uint64(i)}, sent{leaves + ms, uint64(i)}) // to replicas 0 and 2
	}
	var got []sent
	for s.queue.len() > 0 {
		e := s.queue.pop()
		d := s.sync.pending[e.req]
		if d.to == 1 || d.ev.Origin != 2 {
			t.Fatalf("event %d sent to %d with origin %d: want to 0 or 2, origin 2", d.ev.ID, d.to, d.ev.Origin)
		}
		got = append(got, sent{e.at, d.ev.ID})
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(sent{})); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}
