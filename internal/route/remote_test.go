package route

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
)

// recorder is a Sync that keeps copies of what it is told, as a transport would.
type recorder struct{ evs []Event }

func (r *recorder) Publish(ev *Event) {
	e := *ev
	e.Blocks = append([]uint64(nil), ev.Blocks...)
	r.evs = append(r.evs, e)
}

// replica is one router replica of a test: its pool, its policy, its lifecycle and share.
type replica struct {
	eps   []*endpoint.Endpoint
	share *Share
	lc    *Lifecycle
	out   *recorder
}

func newReplica(t *testing.T, self uint64, p policy.Picker, clk *stepClock, cfg ShareConfig, names ...string) *replica {
	t.Helper()
	return newReplicaOf(t, self, Config{Picker: p, Clock: clk}, clk, cfg, names...)
}

// newReplicaOf is newReplica with the lifecycle's configuration, lcfg, its Share set here.
func newReplicaOf(t *testing.T, self uint64, lcfg Config, clk *stepClock, cfg ShareConfig, names ...string) *replica {
	t.Helper()
	r := &replica{eps: pool(t, names...), out: &recorder{}}
	cfg.Self, cfg.Out, cfg.Clock = self, r.out, clk
	cfg.Endpoint = func(name string) *endpoint.Endpoint {
		for _, e := range r.eps {
			if e.Name == name {
				return e
			}
		}
		return nil
	}
	r.share = NewShare(cfg)
	lcfg.Share = r.share
	lc, err := New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	r.lc = lc
	return r
}

// deliver applies every event r published so far to the other replicas, as from r's origin,
// and returns why each was dropped (DropNone: applied).
func (r *replica) deliver(to ...*replica) []Drop {
	var got []Drop
	for _, e := range r.out.evs {
		e.Origin = r.share.Self()
		for _, o := range to {
			got = append(got, o.lc.Apply(&e))
		}
	}
	r.out.evs = nil
	return got
}

func load(eps []*endpoint.Endpoint) [][2]int {
	out := make([][2]int, len(eps))
	for i, e := range eps {
		out[i] = [2]int{e.InFlight(), e.PendingPrefill()}
	}
	return out
}

// TestShareReplays: what one replica's lifecycle does, another's replays: the endpoint
// counters and the policy's Routed / FirstToken / Done, with the request rebuilt.
func TestShareReplays(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	sa, sb := &script{order: []string{"y", "x"}}, &script{order: []string{"x", "y"}}
	a := newReplica(t, 1, sa, clk, ShareConfig{}, "x", "y")
	b := newReplica(t, 2, sb, clk, ShareConfig{}, "y", "x") // another order: another ID per name

	req := &policy.Request{ID: "r1", Model: "m", Tenant: "t", SessionKey: "s", Blocks: []uint64{7, 8}, BlockTokens: 16, PromptTokens: 40, MaxTokens: 9}
	c, err := a.lc.Begin(req, a.eps, "", clk.t)
	if err != nil {
		t.Fatal(err)
	}
	if ep := c.Next(); ep.Name != "y" {
		t.Fatalf("picked %s", ep.Name)
	}
	if d := a.deliver(b); !cmp.Equal(d, []Drop{DropNone}) {
		t.Fatalf("Routed: %v", d)
	}
	if diff := cmp.Diff([][2]int{{1, 40}, {0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("b's counters after Routed (y, x) (-want +got):\n%s", diff)
	}
	clk.t = clk.t.Add(25 * time.Millisecond)
	c.FirstToken()
	a.deliver(b)
	if diff := cmp.Diff([][2]int{{1, 0}, {0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("b's counters after FirstToken (-want +got):\n%s", diff)
	}
	c.Finish(Outcome{OK: true, CachedTokens: 32, OutputTokens: 9})
	a.deliver(b)
	if diff := cmp.Diff([][2]int{{0, 0}, {0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("b's counters after Done (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sa.log, sb.log); diff != "" {
		t.Errorf("b's policy heard otherwise than a's (-a +b):\n%s", diff)
	}
	st := b.share.Stats()
	if st.Applied != 3 || st.Remote != 0 || st.Local != 0 {
		t.Errorf("b's stats: %+v", st)
	}
	if st := a.share.Stats(); st.Local != 0 {
		t.Errorf("a's local attempts after the end: %d", st.Local)
	}
}

// TestShareRebuildsRequest: the policy of the receiving replica gets the routing facts.
func TestShareRebuildsRequest(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	var got []policy.Request
	b := newReplica(t, 2, &observerFunc{routed: func(r *policy.Request) { got = append(got, *r) }}, clk, ShareConfig{}, "x")
	ev := Event{Kind: EventRouted, Origin: 1, ID: 5, Endpoint: "x", Model: "m", Tenant: "t", SessionKey: "s",
		Blocks: []uint64{1, 2, 3}, BlockTokens: 16, PromptTokens: 50, MaxTokens: 7, Whole: true}
	if d := b.lc.Apply(&ev); d != DropNone {
		t.Fatal(d)
	}
	want := []policy.Request{{Model: "m", Tenant: "t", SessionKey: "s", Blocks: []uint64{1, 2, 3}, BlockTokens: 16, PromptTokens: 50, MaxTokens: 7, Whole: true, Remote: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rebuilt request (-want +got):\n%s", diff)
	}
}

// replicated is a policy that records what SetReplicas told it, and when.
type replicated struct {
	got   []string
	picks int
}

func (p *replicated) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	p.picks++
	return c, nil
}

func (p *replicated) SetReplicas(n, rank int, lag time.Duration) {
	p.got = append(p.got, fmt.Sprintf("%d %d %v before pick %d", n, rank, lag, p.picks+1))
}

// The transport's SetReplicas reaches the policy before the next request, once per call,
// and reaches a lifecycle built later (a reload) on the same Share too.
func TestShareTellsReplicas(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	p := &replicated{}
	a := newReplica(t, 1, p, clk, ShareConfig{}, "x", "y")
	begin := func(lc *Lifecycle) {
		t.Helper()
		if _, err := lc.Begin(&policy.Request{ID: "r"}, a.eps, "", clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	begin(a.lc)
	a.share.SetReplicas(3, 1, 10*time.Millisecond)
	begin(a.lc)
	begin(a.lc)
	a.share.SetReplicas(2, 0, 10*time.Millisecond)
	begin(a.lc)
	want := []string{"3 1 10ms before pick 2", "2 0 10ms before pick 4"}
	if diff := cmp.Diff(want, p.got); diff != "" {
		t.Errorf("SetReplicas calls (-want +got):\n%s", diff)
	}
	q := &replicated{}
	lc, err := New(Config{Picker: q, Clock: clk, Share: a.share})
	if err != nil {
		t.Fatal(err)
	}
	begin(lc)
	if diff := cmp.Diff([]string{"2 0 10ms before pick 1"}, q.got); diff != "" {
		t.Errorf("a rebuilt lifecycle's policy (-want +got):\n%s", diff)
	}
}

// observerFunc is a policy that ranks candidates as given and reports Routed.
type observerFunc struct{ routed func(*policy.Request) }

func (o *observerFunc) Pick(_ *policy.Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	return c, nil
}
func (o *observerFunc) Routed(r *policy.Request, _ *endpoint.Endpoint)                { o.routed(r) }
func (o *observerFunc) FirstToken(*policy.Request, *endpoint.Endpoint, time.Duration) {}
func (o *observerFunc) Done(*policy.Request, *endpoint.Endpoint, policy.Result)       {}
func (o *observerFunc) Removed(*endpoint.Endpoint)                                    {}

// TestShareIdempotent: duplicates, replays, an end before its start, an unknown endpoint, an
// event of its own, nonsense: dropped with their reason, the counters untouched.
func TestShareIdempotent(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{}
	b := newReplica(t, 2, s, clk, ShareConfig{}, "x")
	routed := func(id uint64) *Event {
		return &Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: "x", PromptTokens: 10, BlockTokens: 16, Blocks: []uint64{1}}
	}
	steps := []struct {
		ev   *Event
		want Drop
	}{
		{routed(1), DropNone},
		{routed(1), DropDuplicate},
		{&Event{Kind: EventFirstToken, Origin: 1, ID: 1, TTFT: time.Millisecond}, DropNone},
		{&Event{Kind: EventFirstToken, Origin: 1, ID: 1, TTFT: time.Millisecond}, DropDuplicate},
		{&Event{Kind: EventDone, Origin: 1, ID: 1, OK: true, Predicted: -1}, DropNone},
		{&Event{Kind: EventDone, Origin: 1, ID: 1, OK: true, Predicted: -1}, DropDuplicate},
		{routed(1), DropDuplicate}, // a replay after the end
		{&Event{Kind: EventDone, Origin: 1, ID: 2}, DropUnknown},
		{routed(2), DropDuplicate}, // its end came first
		{&Event{Kind: EventFirstToken, Origin: 1, ID: 3}, DropUnknown},
		{&Event{Kind: EventRouted, Origin: 1, ID: 4, Endpoint: "nowhere", PromptTokens: 10}, DropUnknownEndpoint},
		{&Event{Kind: EventRouted, Origin: 2, ID: 5, Endpoint: "x"}, DropSelf},
		{&Event{Kind: EventRouted, Origin: 0, ID: 6, Endpoint: "x"}, DropInvalid},
		{&Event{Kind: EventRouted, Origin: 1, ID: 7, Endpoint: "x", PromptTokens: -1}, DropInvalid},
		{&Event{Kind: EventRouted, Origin: 1, ID: 8, Endpoint: ""}, DropInvalid},
		{&Event{Kind: EventRouted, Origin: 1, ID: 9, Endpoint: "x", Blocks: []uint64{1}}, DropInvalid}, // blocks of no size
		{&Event{Kind: 99, Origin: 1, ID: 10}, DropInvalid},
	}
	for i, st := range steps {
		if got := b.lc.Apply(st.ev); got != st.want {
			t.Errorf("step %d (%s %d): %v, want %v", i, st.ev.Kind, st.ev.ID, got, st.want)
		}
	}
	if diff := cmp.Diff([][2]int{{0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	want := []string{"routed x", "first x 1ms", "done x ok=true cached=-1 ttft=1ms"}
	if diff := cmp.Diff(want, s.log); diff != "" {
		t.Errorf("policy heard (-want +got):\n%s", diff)
	}
	st := b.share.Stats()
	if st.Applied != 3 || st.Dropped[DropDuplicate] != 5 || st.Dropped[DropInvalid] != 5 || st.Dropped[DropUnknown] != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestShareIdempotentManyOrigins: an end that overtook its start is remembered whatever the
// order of IDs and however many origins there are: beyond those whose newest IDs the Share
// keeps (maxOrigins), it looks in what ended.
func TestShareIdempotentManyOrigins(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	b := newReplica(t, 1<<62, &script{}, clk, ShareConfig{}, "x")
	routed := func(origin, id uint64) *Event {
		return &Event{Kind: EventRouted, Origin: origin, ID: id, Endpoint: "x", PromptTokens: 10, BlockTokens: 16, Blocks: []uint64{1}}
	}
	done := func(origin, id uint64) *Event {
		return &Event{Kind: EventDone, Origin: origin, ID: id, OK: true, Predicted: -1}
	}
	for o := uint64(1); o <= maxOrigins+10; o++ {
		steps := []struct {
			ev   *Event
			want Drop
		}{
			{done(o, 5), DropUnknown},
			{routed(o, 5), DropDuplicate}, // its end came first
			{routed(o, 9), DropNone},
			{done(o, 3), DropUnknown}, // below the newest ID
			{routed(o, 3), DropDuplicate},
			{routed(o, 9), DropDuplicate},
			{done(o, 9), DropNone},
		}
		for i, st := range steps {
			if got := b.lc.Apply(st.ev); got != st.want {
				t.Fatalf("origin %d, step %d (%s %d): %v, want %v", o, i, st.ev.Kind, st.ev.ID, got, st.want)
			}
		}
	}
	if st := b.share.Stats(); st.Remote != 0 || st.Applied != 2*(maxOrigins+10) {
		t.Errorf("stats %+v", st)
	}
}

// TestRemoteCorrections: an engine report below the origin's prediction (an eviction) reaches
// the receiver's policy as it is; any other reads as no report, so that a receiver that
// predicted more (it had heard of another request with that prefix first) sees no eviction.
func TestRemoteCorrections(t *testing.T) {
	for _, c := range []struct {
		name               string
		cached, originPred int
		want               int
	}{
		{"origin predicted right", 100, 100, -1},
		{"engine had more", 300, 100, -1},
		{"origin saw an eviction", 100, 300, 100},
		{"engine did not say", -1, 100, -1},
		{"origin has no prediction", 100, -1, -1},
	} {
		if got := remoteCached(&Event{CachedTokens: c.cached, Predicted: c.originPred}); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestShareBounded: remote attempts beyond MaxRemote are dropped; one whose end never comes
// ends, failed, after the TTL; a replica that leaves takes its attempts with it.
func TestShareBounded(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{}
	b := newReplica(t, 9, s, clk, ShareConfig{MaxRemote: 3, TTL: time.Minute}, "x")
	routed := func(origin, id uint64) *Event {
		return &Event{Kind: EventRouted, Origin: origin, ID: id, Endpoint: "x", PromptTokens: 10}
	}
	for i, want := range []Drop{DropNone, DropNone, DropNone, DropFull} {
		if got := b.lc.Apply(routed(1, uint64(i))); got != want {
			t.Errorf("attempt %d: %v, want %v", i, got, want)
		}
	}
	if got := b.eps[0].InFlight(); got != 3 {
		t.Fatalf("in flight %d, want 3", got)
	}
	clk.t = clk.t.Add(30 * time.Second)
	b.lc.Apply(&Event{Kind: EventDone, Origin: 1, ID: 0, OK: true})
	b.lc.Apply(routed(2, 1)) // room again
	clk.t = clk.t.Add(31 * time.Second)
	b.share.Expire() // 1's two others are a minute old, 2's is not
	if got := b.eps[0].InFlight(); got != 1 {
		t.Errorf("in flight after the TTL: %d, want 1", got)
	}
	if n := b.share.ForgetOrigin(2); n != 1 || b.eps[0].InFlight() != 0 || b.eps[0].PendingPrefill() != 0 {
		t.Errorf("ForgetOrigin ended %d, in flight %d, pending %d", n, b.eps[0].InFlight(), b.eps[0].PendingPrefill())
	}
	if st := b.share.Stats(); st.Expired != 3 || st.Remote != 0 || st.Dropped[DropFull] != 1 {
		t.Errorf("stats %+v", st)
	}
	// Late ends of attempts ended here (expired, their origin gone) and of one refused for
	// want of room change nothing, and say why.
	for _, c := range []struct {
		ev   *Event
		want Drop
	}{
		{&Event{Kind: EventDone, Origin: 1, ID: 1}, DropEndedHere}, // expired
		{&Event{Kind: EventDone, Origin: 2, ID: 1}, DropEndedHere}, // its origin forgotten
		{&Event{Kind: EventDone, Origin: 1, ID: 3}, DropFull},
	} {
		if d := b.lc.Apply(c.ev); d != c.want {
			t.Errorf("late end of %d/%d: %v, want %v", c.ev.Origin, c.ev.ID, d, c.want)
		}
	}
	if got := b.eps[0].InFlight(); got != 0 {
		t.Errorf("in flight after the late ends: %d", got)
	}
}

// TestShareDropReasons: the events a replica drops in the ordinary course of sharing (a
// peer declared gone and back, a stream started afresh, an endpoint that left) are told
// apart from losses and from what no lifecycle makes, step by step as a QA pass on three
// replicas met them.
func TestShareDropReasons(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	s := &script{}
	b := newReplica(t, 9, s, clk, ShareConfig{}, "x")
	routed := func(id uint64, ep string) *Event {
		return &Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: ep, PromptTokens: 10, BlockTokens: 16, Blocks: []uint64{1}}
	}
	first := func(id uint64) *Event {
		return &Event{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: time.Millisecond}
	}
	done := func(id uint64) *Event { return &Event{Kind: EventDone, Origin: 1, ID: id, OK: true, Predicted: -1} }
	type step struct {
		ev   *Event
		want Drop
	}
	apply := func(what string, steps []step) {
		t.Helper()
		for i, st := range steps {
			if got := b.lc.Apply(st.ev); got != st.want {
				t.Errorf("%s, step %d (%s %d): %v, want %v", what, i, st.ev.Kind, st.ev.ID, got, st.want)
			}
		}
	}
	// Origin 1 routes attempt 1 and is declared gone (paused): this replica ends it. Back,
	// its stream says what ended meanwhile; the attempt's late events are settled already.
	apply("before the pause", []step{{routed(1, "x"), DropNone}})
	if n := b.share.ForgetOrigin(1); n != 1 {
		t.Fatalf("ForgetOrigin ended %d, want 1", n)
	}
	apply("the origin back", []step{
		{first(1), DropEndedHere}, {done(1), DropEndedHere}, {routed(1, "x"), DropEndedHere}, {done(1), DropEndedHere},
	})
	// Its new stream's hello lists 1 (still running there) and 2 and 3, routed before the
	// stream began: their routed events never reach this stream; a snapshot may bring one.
	b.share.Reconcile(1, map[uint64]bool{1: true, 2: true, 3: true})
	apply("a stream started afresh", []step{
		{first(2), DropBeforeStream}, {done(2), DropBeforeStream},
		{done(2), DropDuplicate},        // the same end twice
		{routed(2, "x"), DropDuplicate}, // a snapshot's, after its end
		{routed(3, "x"), DropNone},      // a snapshot's, before its end: started
		{first(3), DropNone}, {done(3), DropNone},
	})
	// An endpoint leaves every pool: the others' removed events come after this replica's
	// own; an attempt routed there just before this replica saw it go is dropped whole.
	apply("an endpoint removed", []step{
		{&Event{Kind: EventRemoved, Origin: 1, Endpoint: "gone"}, DropEndpointLeft},
		{&Event{Kind: EventBackoff, Origin: 1, Endpoint: "gone", Rest: time.Second}, DropUnknownEndpoint},
		{routed(4, "gone"), DropUnknownEndpoint}, {first(4), DropUnknownEndpoint}, {done(4), DropUnknownEndpoint},
	})
	// An attempt whose routed event is refused as invalid (blocks of no size; a negative
	// count: a client's max_tokens -1 an older replica let through) is dropped whole, as
	// invalid; one heard of nowhere (its routed event lost) is unknown. An endpoint's event
	// that names none is invalid, not endpoint_left.
	negative := routed(7, "x")
	negative.MaxTokens = -1
	apply("the rest", []step{
		{&Event{Kind: EventRouted, Origin: 1, ID: 5, Endpoint: "x", Blocks: []uint64{1}}, DropInvalid},
		{done(5), DropInvalid},
		{first(6), DropUnknown}, {done(6), DropUnknown},
		{negative, DropInvalid}, {first(7), DropInvalid}, {done(7), DropInvalid},
		{&Event{Kind: EventRemoved, Origin: 1}, DropInvalid},
		{&Event{Kind: EventBackoff, Origin: 1, Rest: time.Second}, DropInvalid},
	})
	if diff := cmp.Diff([][2]int{{0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	var expected, other []string
	for d := DropNone + 1; d < numDrops; d++ {
		if d.Expected() {
			expected = append(expected, d.String())
		} else {
			other = append(other, d.String())
		}
	}
	if diff := cmp.Diff([]string{"duplicate", "ended_here", "before_stream", "endpoint_left"}, expected); diff != "" {
		t.Errorf("expected reasons (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"unknown_request", "unknown_endpoint", "full", "invalid", "self"}, other); diff != "" {
		t.Errorf("other reasons (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"duplicate", "unknown_request", "unknown_endpoint", "full", "invalid", "self", "ended_here", "before_stream", "endpoint_left"},
		DropReasons()); diff != "" {
		t.Errorf("DropReasons (-want +got):\n%s", diff)
	}
}

// TestShareExpiryQueueBounded: attempts that start and end forever keep the expiry queue
// proportional to those in flight.
func TestShareExpiryQueueBounded(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	b := newReplica(t, 9, &script{}, clk, ShareConfig{TTL: time.Hour}, "x")
	for i := range uint64(20_000) {
		b.lc.Apply(&Event{Kind: EventRouted, Origin: 1, ID: i, Endpoint: "x", PromptTokens: 1})
		b.lc.Apply(&Event{Kind: EventDone, Origin: 1, ID: i, OK: true})
	}
	b.share.mu.Lock()
	n := len(b.share.expiry)
	b.share.mu.Unlock()
	if n > 1025 {
		t.Errorf("expiry queue holds %d entries for 0 attempts in flight", n)
	}
}

// TestShareReconcile: after a broken stream, what the origin says is in flight is the truth.
func TestShareReconcile(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	b := newReplica(t, 9, &script{}, clk, ShareConfig{}, "x")
	for id := range uint64(4) {
		b.lc.Apply(&Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: "x", PromptTokens: 1})
	}
	b.lc.Apply(&Event{Kind: EventRouted, Origin: 3, ID: 0, Endpoint: "x", PromptTokens: 1})
	if n := b.share.Reconcile(1, map[uint64]bool{2: true}); n != 3 {
		t.Errorf("Reconcile ended %d, want 3", n)
	}
	if got := b.eps[0].InFlight(); got != 2 {
		t.Errorf("in flight %d, want 2 (1's attempt 2 and 3's)", got)
	}
}

// TestShareInFlight: a new replica takes the attempts in flight, local and remote, and
// starts them as they are (first token seen or not).
func TestShareInFlight(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	a := newReplica(t, 1, &script{order: []string{"x"}}, clk, ShareConfig{}, "x")
	c, _ := a.lc.Begin(&policy.Request{PromptTokens: 20, BlockTokens: 16, Blocks: []uint64{4}}, a.eps, "", clk.t)
	c.Next()
	c.FirstToken()
	c2, _ := a.lc.Begin(&policy.Request{PromptTokens: 30}, a.eps, "", clk.t)
	c2.Next()
	a.lc.Apply(&Event{Kind: EventRouted, Origin: 7, ID: 1, Endpoint: "x", PromptTokens: 5})
	if ids := a.share.LocalIDs(); len(ids) != 2 {
		t.Errorf("local ids %v", ids)
	}
	c3 := newReplica(t, 3, &script{}, clk, ShareConfig{}, "x")
	for _, ev := range a.share.InFlight() {
		if d := c3.lc.Apply(&ev); d != DropNone {
			t.Errorf("%s of %d/%d: %v", ev.Kind, ev.Origin, ev.ID, d)
		}
	}
	if diff := cmp.Diff(load(a.eps), load(c3.eps)); diff != "" {
		t.Errorf("the new replica's counters differ (-a +new):\n%s", diff)
	}
	// The ends come from their origins.
	c.Finish(Outcome{OK: true})
	c2.Finish(Outcome{OK: true})
	a.out.evs = a.out.evs[len(a.out.evs)-2:]
	a.deliver(c3)
	c3.lc.Apply(&Event{Kind: EventDone, Origin: 7, ID: 1, OK: true})
	if diff := cmp.Diff([][2]int{{0, 0}}, load(c3.eps)); diff != "" {
		t.Errorf("after the ends (-want +got):\n%s", diff)
	}
}

// TestShareRemoved: an endpoint another replica saw leave is forgotten by the policy here.
func TestShareRemoved(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	a := newReplica(t, 1, &script{}, clk, ShareConfig{}, "x", "y")
	s := &script{}
	b := newReplica(t, 2, s, clk, ShareConfig{}, "x", "y")
	a.lc.Removed(a.eps[1])
	if d := a.deliver(b); !cmp.Equal(d, []Drop{DropNone}) {
		t.Fatalf("Removed: %v", d)
	}
	if diff := cmp.Diff([]string{"removed y"}, s.log); diff != "" {
		t.Errorf("b's policy heard (-want +got):\n%s", diff)
	}
}

// TestShareStalls: a stall one replica's watch finds is a stall at the others (the engine
// goes after the others there, with no watch of theirs fired); a probe one replica lets
// through holds the others' probes for an interval and a second (peerProbeHold), so that the
// replicas together send one probe per interval; an answer one of them hears ends it at all; a finding older than an
// answer heard here is not applied.
func TestShareStalls(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	t0 := clk.t
	mk := func(self uint64, cfg ShareConfig) *replica {
		return newReplicaOf(t, self, stallConfig(clk, 100*time.Millisecond), clk, cfg, "a", "b")
	}
	var told []string // b's OnPeerStall: once per stall a peer opened there
	a := mk(1, ShareConfig{})
	b := mk(2, ShareConfig{OnPeerStall: func(ep *endpoint.Endpoint, silent time.Duration) {
		told = append(told, fmt.Sprintf("%s %v", ep.Name, silent))
	}})
	first := func(r *replica) (*Call, string) {
		t.Helper()
		c, err := r.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, r.eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return c, c.Next().Name
	}
	at := func(d time.Duration) { clk.t = t0.Add(d) }
	kinds := func(r *replica) []string {
		var out []string
		for _, e := range r.out.evs {
			out = append(out, e.Kind.String())
		}
		return out
	}

	// a sends a request to engine a, which holds it and answers nothing: a's watch (2 s: 20 x
	// 100 ms) finds it stalled, and a tells b, 2 s silent.
	held, ep := first(a)
	if ep != "a" {
		t.Fatalf("first pick %s, want a", ep)
	}
	if stalled, _ := held.Stall().Due(t0.Add(2 * time.Second).UnixNano()); !stalled {
		t.Fatal("not stalled after 2 s of silence")
	}
	if diff := cmp.Diff([]string{"routed", "stalled"}, kinds(a)); diff != "" {
		t.Fatalf("a published (-want +got):\n%s", diff)
	}
	if got := a.out.evs[1]; got.Endpoint != "a" || got.Silent != 2*time.Second {
		t.Errorf("stalled event %+v, want engine a, silent 2s", got)
	}
	at(2 * time.Second)
	if d := a.deliver(b); !cmp.Equal(d, []Drop{DropNone, DropNone}) {
		t.Fatalf("delivered: %v", d)
	}
	if got := b.eps[0].StalledSince(); got != t0.UnixNano() {
		t.Errorf("b: engine a stalled since %d, want %d (a's last answer from it: none, so the attempt's start)", got, t0.UnixNano())
	}
	c, ep := first(b)
	if ep != "b" {
		t.Errorf("b ranked %s first, want b: a is stalled", ep)
	}
	c.Finish(Outcome{OK: true})
	b.out.evs = nil

	// 32 s: a's probe interval is over: a lets a request through to engine a and tells b,
	// which holds its own probe (due at 32 s too) for an interval.
	at(32 * time.Second)
	probe, ep := first(a)
	if ep != "a" {
		t.Fatalf("a's probe went to %s, want a", ep)
	}
	if diff := cmp.Diff([]string{"stalled", "routed"}, kinds(a)); diff != "" {
		t.Fatalf("a published (-want +got):\n%s", diff)
	}
	if got := a.out.evs[0].Silent; got != 32*time.Second {
		t.Errorf("probe's stalled event: silent %v, want 32s", got)
	}
	a.deliver(b)
	for _, d := range []time.Duration{33 * time.Second, 62 * time.Second, 62*time.Second + 900*time.Millisecond} {
		at(d)
		if c, ep := first(b); ep != "b" {
			t.Errorf("b at %v ranked %s first: a probe within an interval and a second (peerProbeHold) of a's", d, ep)
		} else {
			c.Finish(Outcome{OK: true})
		}
	}
	at(63 * time.Second)
	c, ep = first(b)
	if ep != "a" {
		t.Errorf("b at 63 s ranked %s first, want its own probe of a, an interval and a second after a's", ep)
	}
	c.Finish(Outcome{})
	b.out.evs = nil

	if diff := cmp.Diff([]string{"a 2s"}, told); diff != "" {
		t.Errorf("b's OnPeerStall (-want +got):\n%s", diff)
	}

	// The engine answers a's probe: b hears of it from a and the stall ends there too; a
	// finding a peer sends after that, from before it, is not applied.
	at(64 * time.Second)
	probe.FirstToken()
	probe.Finish(Outcome{OK: true})
	held.Finish(Outcome{OK: true})
	if b.eps[0].StalledSince() == 0 {
		t.Fatal("b: the stall ended before it heard of the answer")
	}
	a.deliver(b)
	if b.eps[0].StalledSince() != 0 || a.eps[0].StalledSince() != 0 {
		t.Errorf("stalled after an answer: a %d, b %d", a.eps[0].StalledSince(), b.eps[0].StalledSince())
	}
	at(65 * time.Second)
	stale := Event{Kind: EventStalled, Origin: 1, Endpoint: "a", Silent: 10 * time.Second}
	if d := b.lc.Apply(&stale); d != DropNone || b.eps[0].StalledSince() != 0 || len(told) != 1 {
		t.Errorf("a finding from before the answer b heard: %v, stalled since %d, told %q", d, b.eps[0].StalledSince(), told)
	}
	for _, ev := range []Event{
		{Kind: EventStalled, Origin: 1, Endpoint: "z", Silent: time.Second},
		{Kind: EventStalled, Origin: 1, Endpoint: "a", Silent: -time.Second},
	} {
		if d := b.lc.Apply(&ev); d == DropNone {
			t.Errorf("%+v applied", ev)
		}
	}
}

// TestSharedPolicyFollowsConversation: prefix-aware on replica b sends a conversation's next
// turn where replica a sent its first, because it heard of it; without sharing it does not
// know (the scenario behind the lost hit rate).
func TestSharedPolicyFollowsConversation(t *testing.T) {
	for _, shared := range []bool{true, false} {
		clk := &stepClock{t: time.Unix(100, 0)}
		mk := func(self uint64) *replica {
			p, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clk})
			if err != nil {
				t.Fatal(err)
			}
			return newReplica(t, self, p, clk, ShareConfig{}, "e0", "e1", "e2", "e3")
		}
		a, b := mk(1), mk(2)
		// Earlier traffic has filled e0..e2 a little on both; the conversation lands wherever
		// a puts it.
		turn1 := &policy.Request{Model: "m", Blocks: seqBlocks(1000, 200), BlockTokens: 16, PromptTokens: 3200}
		c, _ := a.lc.Begin(turn1, a.eps, "", clk.t)
		home := c.Next()
		clk.t = clk.t.Add(300 * time.Millisecond)
		c.FirstToken()
		c.Finish(Outcome{OK: true, CachedTokens: 0})
		if shared {
			a.deliver(b)
		}
		clk.t = clk.t.Add(time.Second)
		turn2 := &policy.Request{Model: "m", Blocks: seqBlocks(1000, 220), BlockTokens: 16, PromptTokens: 3520}
		c2, _ := b.lc.Begin(turn2, b.eps, "", clk.t)
		got := c2.Next()
		if shared && got.Name != home.Name {
			t.Errorf("shared: b sent turn 2 to %s, a sent turn 1 to %s", got.Name, home.Name)
		}
		if shared {
			if p := c2.Predicted(); p != 200*16 {
				t.Errorf("shared: b predicts %d cached tokens, want %d", p, 200*16)
			}
		} else if p := c2.Predicted(); p != 0 {
			t.Errorf("alone: b predicts %d cached tokens, want 0", p)
		}
	}
}

func seqBlocks(start uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = start + uint64(i)*7919
	}
	return out
}

// newPrefixAware returns prefix-aware with a fixed rand, on clk.
func newPrefixAware(tb testing.TB, clk *stepClock) policy.Picker {
	tb.Helper()
	p, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// applyBenchGroups is how many prompts the replay benchmarks cycle through.
const applyBenchGroups = 64

// newApplyBench builds what the replay benchmarks run on: a replica (Self 2) running
// prefix-aware in front of four endpoints e0-e3, and the 64-block prompts of 64 groups.
func newApplyBench(b *testing.B) (*stepClock, *Lifecycle, *Share, [][]uint64, []string) {
	clk := &stepClock{t: time.Unix(100, 0)}
	p := newPrefixAware(b, clk)
	p4 := endpoint.NewPool()
	if _, err := p4.Update([]endpoint.Spec{{Name: "e0"}, {Name: "e1"}, {Name: "e2"}, {Name: "e3"}}); err != nil {
		b.Fatal(err)
	}
	eps := p4.All()
	s := NewShare(ShareConfig{Self: 2, Clock: clk, Endpoint: func(name string) *endpoint.Endpoint {
		return eps[int(name[1]-'0')]
	}})
	lc, err := New(Config{Picker: p, Clock: clk, Share: s})
	if err != nil {
		b.Fatal(err)
	}
	chains := make([][]uint64, applyBenchGroups)
	for g := range chains {
		chains[g] = prefix.Chain(nil, prefix.Seed("m", ""), seqBlocks(uint64(g)<<32, 64))
	}
	return clk, lc, s, chains, []string{"e0", "e1", "e2", "e3"}
}

// BenchmarkApply replays one remote request (routed, first token, done) of a 64-block prompt
// on a replica running prefix-aware: the CPU the sync costs a replica per request of another.
func BenchmarkApply(b *testing.B) {
	clk, lc, _, chains, names := newApplyBench(b)
	const groups = applyBenchGroups
	b.ReportAllocs()
	var id uint64
	for b.Loop() {
		id++
		g := int(id % groups)
		routed := Event{Kind: EventRouted, Origin: 1, ID: id, Endpoint: names[g%4], Model: "m", Blocks: chains[g], BlockTokens: 16, PromptTokens: 1030, MaxTokens: 8}
		first := Event{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: 20 * time.Millisecond}
		done := Event{Kind: EventDone, Origin: 1, ID: id, OK: true, CachedTokens: 1008, PromptTokens: 1030, OutputTokens: 8, TTFT: 20 * time.Millisecond}
		for _, ev := range []*Event{&routed, &first, &done} {
			if d := lc.Apply(ev); d != DropNone {
				b.Fatal(d)
			}
		}
		clk.t = clk.t.Add(time.Millisecond)
	}
}

// TestExpiredKeepsPlacement: the attempts of a replica that died end with an unknown outcome:
// its in-flight requests' blocks stay in the index of prefix-aware here (they were most likely
// computed), the counters go back to zero, and nothing is learnt of speed.
func TestExpiredKeepsPlacement(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	p, err := policy.New("prefix-aware", nil, policy.Env{Rand: rand.New(rand.NewPCG(1, 2)), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	b := newReplica(t, 2, p, clk, ShareConfig{}, "e0", "e1")
	blocks := prefix.Chain(nil, prefix.Seed("m", ""), seqBlocks(5, 10))
	ev := Event{Kind: EventRouted, Origin: 1, ID: 1, Endpoint: "e0", Model: "m", Blocks: blocks, BlockTokens: 16, PromptTokens: 170}
	if d := b.lc.Apply(&ev); d != DropNone {
		t.Fatal(d)
	}
	if n := b.share.ForgetOrigin(1); n != 1 {
		t.Fatalf("ForgetOrigin ended %d", n)
	}
	if diff := cmp.Diff([][2]int{{0, 0}, {0, 0}}, load(b.eps)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	req := &policy.Request{Model: "m", Blocks: blocks, BlockTokens: 16, PromptTokens: 170}
	if got := p.(policy.Predictor).PredictCached(req, b.eps[0]); got != 160 {
		t.Errorf("after its replica left, the request's blocks are predicted at %d tokens on e0, want 160", got)
	}
}

// TestShareFailures: a replica's failures of the engine's own doing reach the other replicas'
// passive health checking through their Done events, one by one and replayed whole
// (ApplyBatch), so that an engine failing for the fleet is ejected everywhere after as many
// failures as one router would need; a peer's success resets that count, and its connection
// failures do not count.
func TestShareFailures(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	mk := func(self uint64, consecutive int) (*replica, *Outlier) {
		o := NewOutlier(OutlierConfig{Consecutive: consecutive, MaxEjectedPercent: 100, Fleet: func() int { return 3 }}, clk)
		return newReplicaOf(t, self, Config{Picker: &script{order: []string{"a", "b", "c"}}, Clock: clk, Health: o},
			clk, ShareConfig{}, "a", "b", "c"), o
	}
	a, _ := mk(1, 10) // a itself ejects nothing here
	b, bo := mk(2, 3)
	// attempt sends one request from r to its first candidate, which ends as end says.
	attempt := func(r *replica, end func(c *Call)) string {
		t.Helper()
		c, err := r.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, r.eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		ep := c.Next().Name
		end(c)
		return ep
	}
	fail := func(f Failure) func(*Call) {
		return func(c *Call) { c.Fail(f); c.Finish(Outcome{}) }
	}
	ok := func(c *Call) { c.FirstToken(); c.Finish(Outcome{OK: true, CachedTokens: -1}) }
	cut := func(c *Call) { c.FirstToken(); c.Finish(Outcome{Failure: FailCut, CachedTokens: -1}) }

	// Engine a answers 500 to two of a's requests, then cuts one of b's own: b ejects it.
	attempt(a, fail(FailStatus))
	attempt(a, fail(FailStatus))
	if got := a.out.evs[1]; got.Kind != EventDone || got.OK || got.Failure != FailStatus {
		t.Fatalf("a published %+v, want a failed done with server_error", got)
	}
	a.deliver(b)
	if bo.Ejected(b.eps[0], clk.t) {
		t.Fatal("b ejected engine a after 2 failures")
	}
	attempt(b, cut)
	if !bo.Ejected(b.eps[0], clk.t) {
		t.Fatal("b did not eject engine a after a's 2 failures and its own")
	}
	b.out.evs = nil

	// Engine b: a's cut stream, its success, then two cut streams: replayed whole
	// (ApplyBatch coalesces each request's three events), b ejects after the last two and
	// one of a's 503s, not before; a connection failure of a's counts for nothing at b.
	apply := func() {
		evs := make([]Event, len(a.out.evs))
		for i, e := range a.out.evs {
			e.Origin = 1
			evs[i] = e
		}
		a.out.evs = nil
		b.lc.ApplyBatch(evs, func(d Drop) { t.Errorf("b dropped an event of a's: %v", d) })
	}
	a.lc.picker.(*script).order = []string{"b", "c"}
	attempt(a, cut)
	attempt(a, ok)
	attempt(a, cut)
	attempt(a, cut)
	apply()
	if bo.Ejected(b.eps[1], clk.t) {
		t.Fatal("b ejected engine b: a success came between the cut streams")
	}
	if got := b.lc.share.Stats().Coalesced; got != 4 {
		t.Errorf("b replayed %d of a's requests whole, want 4", got)
	}
	attempt(a, fail(FailConnect))
	apply()
	if bo.Ejected(b.eps[1], clk.t) {
		t.Fatal("b ejected engine b after a's connection failure")
	}
	attempt(a, fail(FailUnavailable))
	apply()
	if !bo.Ejected(b.eps[1], clk.t) {
		t.Fatal("b did not eject engine b after 3 of a's failures in a row")
	}
}

// TestShareAudit: the other replicas' reports reach the cache-report audit through their Done
// events, one by one and replayed whole, so that a replica finds a silent zero hit on the
// fleet's reports, not only its own; an attempt that failed teaches it nothing.
func TestShareAudit(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	audit := NewAudit(AuditConfig{})
	b := newReplicaOf(t, 2, Config{Picker: &script{order: []string{"a", "b"}}, Clock: clk, Audit: audit}, clk, ShareConfig{}, "a", "b")
	id := uint64(0)
	// request is the events of a remote request on engine a, predicted to find 100 tokens
	// cached, that found found.
	request := func(found int, ok bool) []Event {
		id++
		return []Event{
			{Kind: EventRouted, Origin: 1, ID: id, Endpoint: "a", PromptTokens: 120},
			{Kind: EventFirstToken, Origin: 1, ID: id, TTFT: time.Millisecond},
			{Kind: EventDone, Origin: 1, ID: id, OK: ok, CachedTokens: found, PromptTokens: 120, Predicted: 100},
		}
	}
	a := b.eps[0]
	// Failed attempts, however many, are no report.
	for range 20 {
		b.lc.ApplyBatch(request(0, false), nil)
	}
	if st := audit.Status(a); st.Blind || st.FoundShare != -1 {
		t.Fatalf("after failed attempts: %+v, want nothing learnt", st)
	}
	// Reports of nothing found, one event at a time: blind after the audit's minimum.
	for i := range 20 {
		for _, ev := range request(0, true) {
			b.lc.Apply(&ev)
		}
		if audit.Blind(a) {
			if i < 9 {
				t.Errorf("blind after %d reports, want at least 10", i+1)
			}
			break
		}
	}
	if !audit.Blind(a) {
		t.Fatal("not blind after 20 remote reports of nothing found")
	}
	// Reports that agree, replayed whole: it sees again.
	for range 20 {
		b.lc.ApplyBatch(request(100, true), nil)
		if !audit.Blind(a) {
			break
		}
	}
	if audit.Blind(a) {
		t.Error("still blind after 20 remote reports that agree")
	}
	if got := b.share.Stats().Coalesced; got < 21 {
		t.Errorf("%d requests replayed whole, want every batch's", got)
	}
}

// TestShareBackoff: an engine's 429 at one replica (its Retry-After) is published once per
// rest, and has the other replicas try the engine after the others for as long.
func TestShareBackoff(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	mk := func(self uint64) *replica {
		return newReplicaOf(t, self, Config{Picker: &script{order: []string{"a", "b"}}, Clock: clk, Attempts: 2}, clk, ShareConfig{}, "a", "b")
	}
	a, b := mk(1), mk(2)
	first := func(r *replica) string {
		t.Helper()
		c, err := r.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, r.eps, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		ep := c.Next().Name
		if ep == "a" {
			c.Backoff(2 * time.Second) // engine a sheds load: 429, Retry-After 2 s
			c.Fail(FailBusy)
			ep = c.Next().Name
		}
		c.FirstToken()
		c.Finish(Outcome{OK: true, CachedTokens: -1})
		return ep
	}
	kinds := func(r *replica) (out []string) {
		for _, e := range r.out.evs {
			out = append(out, e.Kind.String())
		}
		return out
	}
	// a meets the 429 and says so once; a second request at a, while a backs off, neither
	// meets nor publishes one.
	if got := first(a); got != "b" {
		t.Fatalf("a's request served by %s, want b after a's 429", got)
	}
	if got := first(a); got != "b" {
		t.Fatalf("a's second request went to %s, want b (a backs off)", got)
	}
	want := []string{"routed", "backoff", "done", "routed", "first_token", "done", "routed", "first_token", "done"}
	if diff := cmp.Diff(want, kinds(a)); diff != "" {
		t.Fatalf("a published (-want +got):\n%s", diff)
	}
	if ev := a.out.evs[1]; ev.Endpoint != "a" || ev.Rest != 2*time.Second {
		t.Errorf("backoff event %+v, want engine a for 2s", ev)
	}
	// b, told, tries engine a after b for the 2 s, then first again.
	for _, d := range a.deliver(b) {
		if d != DropNone {
			t.Fatalf("b dropped one of a's events: %v", d)
		}
	}
	clk.t = clk.t.Add(1900 * time.Millisecond)
	if c, _ := b.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, b.eps, "", clk.t); c.Next().Name != "b" {
		t.Error("b ranked engine a first within its rest")
	} else {
		c.Finish(Outcome{})
	}
	clk.t = clk.t.Add(200 * time.Millisecond)
	if c, _ := b.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, b.eps, "", clk.t); c.Next().Name != "a" {
		t.Error("b still ranks engine a last after its rest")
	} else {
		c.Finish(Outcome{})
	}
	// A negative rest is malformed; an unknown endpoint is dropped; a rest is capped at a minute.
	if d := b.lc.Apply(&Event{Kind: EventBackoff, Origin: 1, Endpoint: "a", Rest: -time.Second}); d != DropInvalid {
		t.Errorf("negative rest: %v, want invalid", d)
	}
	if d := b.lc.Apply(&Event{Kind: EventBackoff, Origin: 1, Endpoint: "z", Rest: time.Second}); d != DropUnknownEndpoint {
		t.Errorf("unknown endpoint: %v", d)
	}
	b.lc.Apply(&Event{Kind: EventBackoff, Origin: 1, Endpoint: "a", Rest: time.Hour})
	clk.t = clk.t.Add(time.Minute + time.Millisecond)
	if c, _ := b.lc.Begin(&policy.Request{ID: "r", PromptTokens: 10}, b.eps, "", clk.t); c.Next().Name != "a" {
		t.Error("an hour's rest asked by a peer outlasted a minute")
	}
}
