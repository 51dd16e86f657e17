package route

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// churnReplica is one router replica of the churn test: its pool, outlier detection, audit
// and lifecycle, with prefix-aware.
type churnReplica struct {
	pool    *endpoint.Pool
	outlier *Outlier
	audit   *Audit
	share   *Share
	lc      *Lifecycle
	out     *recorder
}

func newChurnReplica(t *testing.T, self uint64, clk *stepClock) *churnReplica {
	t.Helper()
	r := &churnReplica{pool: endpoint.NewPool(), out: &recorder{}}
	r.outlier = NewOutlier(OutlierConfig{}, clk)
	r.audit = NewAudit(AuditConfig{})
	// (The remote attempts ended lately are remembered up to twice MaxRemote, and those in
	// flight up to TTL: small here, so that they are full before the heap is measured.)
	r.share = NewShare(ShareConfig{Self: self, Out: r.out, Clock: clk, Endpoint: r.pool.ByName, MaxRemote: 256, TTL: 10 * time.Second})
	lc, err := New(Config{Picker: newPrefixAware(t, clk), Clock: clk, Attempts: 2, Health: r.outlier, Audit: r.audit, Share: r.share})
	if err != nil {
		t.Fatal(err)
	}
	r.lc = lc
	return r
}

// update gives the pool names and tells the lifecycle of the endpoints that left, as the
// router does.
func (r *churnReplica) update(t *testing.T, names []string) {
	specs := make([]endpoint.Spec, len(names))
	for i, n := range names {
		specs[i] = endpoint.Spec{Name: n, Models: []string{"m"}, KVCapacityTokens: 1 << 20}
	}
	d, err := r.pool.Update(specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range d.Removed {
		r.lc.Removed(e)
	}
}

// deliver applies what r published to o, as from r's origin.
func (r *churnReplica) deliver(o *churnReplica) {
	for i := range r.out.evs {
		e := r.out.evs[i]
		e.Origin = r.share.Self()
		o.lc.Apply(&e)
	}
	r.out.evs = r.out.evs[:0]
}

// sizes is what a's and b's health checking and audit keep: endpoints each.
func churnSizes(rs ...*churnReplica) []int {
	var out []int
	for _, r := range rs {
		r.outlier.mu.Lock()
		out = append(out, len(r.outlier.st))
		r.outlier.mu.Unlock()
		r.audit.mu.Lock()
		out = append(out, len(r.audit.st))
		r.audit.mu.Unlock()
	}
	return out
}

// TestLifecycle_EndpointChurn: two replicas sharing their events go through a rolling update
// of a 4-endpoint fleet, 3,000 cycles; the endpoint that leaves at each has requests in flight
// that end after the router forgot it: one that succeeds (the audit judges its report), one
// that fails (health checking counts it, here and, by its Done, at the other replica) and
// one picked before and sent after it left (the first attempt goes whatever became of its
// endpoint), which is told to back off and fails. Neither replica's health checking, audit or
// policy may keep anything of the endpoints that left: each outlier state or audit kept its
// endpoint with it (about 1 KB a cycle).
func TestLifecycle_EndpointChurn(t *testing.T) {
	clk := &stepClock{t: time.Unix(1000, 0)}
	a, b := newChurnReplica(t, 1, clk), newChurnReplica(t, 2, clk)
	var live []string
	next := 0
	newName := func() string {
		next++
		return fmt.Sprintf("http://ep-%d", next)
	}
	for range 4 {
		live = append(live, newName())
	}
	a.update(t, live)
	b.update(t, live)
	reqs := 0
	request := func() *policy.Request {
		reqs++
		return &policy.Request{ID: fmt.Sprint("r", reqs), Model: "m", BlockTokens: 16, PromptTokens: 100,
			Blocks: []uint64{1, 2, 3, uint64(reqs)}}
	}
	begin := func(r *policy.Request, c []*endpoint.Endpoint) *Call {
		call, err := a.lc.Begin(r, c, "", clk.t)
		if err != nil {
			t.Fatal(err)
		}
		return call
	}
	cycle := func() {
		clk.t = clk.t.Add(100 * time.Millisecond)
		oldest := a.pool.All()[:1]
		// A request that ends well puts the shared blocks on the oldest endpoint, so that the
		// ones after it are predicted to find them there.
		c := begin(request(), oldest)
		c.Next()
		c.FirstToken()
		c.Finish(Outcome{OK: true, CachedTokens: 0, PromptTokens: 100})
		good, bad, late := begin(request(), oldest), begin(request(), oldest), begin(request(), oldest)
		good.Next()
		bad.Next()
		good.FirstToken()
		a.deliver(b)
		live = append(live[1:], newName())
		a.update(t, live)
		b.update(t, live)
		if late.Next() == nil {
			t.Fatal("the first attempt was not sent")
		}
		late.Backoff(time.Second)
		late.Fail(FailUnavailable)
		late.Finish(Outcome{Failure: FailUnavailable})
		bad.Fail(FailTimeout)
		bad.Finish(Outcome{Failure: FailTimeout})
		good.Finish(Outcome{OK: true, CachedTokens: 0, PromptTokens: 100})
		a.deliver(b)
		b.deliver(a) // b's removals
	}
	for range 1000 {
		cycle()
	}
	before := liveHeap()
	const cycles = 3000
	for range cycles {
		cycle()
	}
	after := liveHeap()
	grew := int64(after) - int64(before)
	t.Logf("live heap %d -> %d bytes over %d cycles (%.2f bytes a cycle)", before, after, cycles, float64(grew)/float64(cycles))
	if grew > 32<<10 {
		t.Errorf("live heap grew by %d bytes over %d cycles (%.2f a cycle): something is kept of the endpoints that left",
			grew, cycles, float64(grew)/float64(cycles))
	}
	// Each knows at most the 4 endpoints of the pool.
	for i, n := range churnSizes(a, b) {
		if n > 4 {
			t.Errorf("replica %c's %s keeps %d endpoints, want at most the pool's 4", "ab"[i/2], [2]string{"health checking", "audit"}[i%2], n)
		}
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// liveHeap is the heap in use after a full collection (two: sync.Pool keeps its contents
// through one).
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
