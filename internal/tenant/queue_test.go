package tenant

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// waitLen polls until q holds n waiters (bounded by a deadline).
func waitLen(t *testing.T, q *queue, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for q.len() != n {
		if time.Now().After(deadline) {
			t.Fatalf("queue length %d, want %d", q.len(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// enqueue starts a waiter and returns the channel its result arrives on, once it is queued.
func enqueue(t *testing.T, q *queue, ctx context.Context, tenant string, prio int, cands []*endpoint.Endpoint) <-chan error {
	t.Helper()
	n := q.len()
	done := make(chan error, 1)
	go func() { _, err := q.wait(ctx, tenant, prio, 1, cands); done <- err }()
	waitLen(t, q, n+1)
	return done
}

func TestQueueFairOrder(t *testing.T) {
	var saturated atomic.Bool
	saturated.Store(true)
	q := newQueue(100, time.Minute, 0, func([]*endpoint.Endpoint) bool { return saturated.Load() })
	ctx := context.Background()
	// Tenant a floods four requests, then b sends two, then c (higher priority) one.
	var results []<-chan error
	for _, w := range []struct {
		tenant string
		prio   int
	}{{"a", 0}, {"a", 0}, {"a", 0}, {"a", 0}, {"b", 0}, {"b", 0}, {"c", 1}} {
		results = append(results, enqueue(t, q, ctx, w.tenant, w.prio, nil))
	}
	if w := q.pass(); w != nil {
		t.Fatalf("saturated, yet %s was admitted", w.tenant)
	}
	saturated.Store(false)
	var order []string
	for range 7 {
		w := q.pass()
		if w == nil {
			t.Fatal("nothing admitted while not saturated")
		}
		order = append(order, w.tenant)
	}
	// c first (priority); then a and b alternate until b has nothing left.
	want := []string{"c", "a", "b", "a", "b", "a", "a"}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("admission order (-want +got):\n%s", diff)
	}
	for i, r := range results {
		if err := <-r; err != nil {
			t.Errorf("waiter %d: %v", i, err)
		}
	}
	// A newcomer starts at the virtual time reached, not behind a's old backlog.
	saturated.Store(true)
	ra := enqueue(t, q, ctx, "a", 0, nil)
	rd := enqueue(t, q, ctx, "d", 0, nil)
	saturated.Store(false)
	got := []string{q.pass().tenant, q.pass().tenant}
	if diff := cmp.Diff([]string{"a", "d"}, got); diff != "" {
		t.Errorf("after the backlog (-want +got):\n%s", diff)
	}
	<-ra
	<-rd
}

func TestQueuePerCandidates(t *testing.T) {
	e1, e2 := &endpoint.Endpoint{Name: "e1"}, &endpoint.Endpoint{Name: "e2"}
	var busy atomic.Value
	busy.Store([]*endpoint.Endpoint{e1, e2})
	q := newQueue(10, time.Minute, 0, func(c []*endpoint.Endpoint) bool {
		return slices.Contains(busy.Load().([]*endpoint.Endpoint), c[0])
	})
	ctx := context.Background()
	r1 := enqueue(t, q, ctx, "a", 5, []*endpoint.Endpoint{e1})
	r2 := enqueue(t, q, ctx, "b", 0, []*endpoint.Endpoint{e2})
	busy.Store([]*endpoint.Endpoint{e1}) // e2 frees up: b goes though a ranks first
	if w := q.pass(); w == nil || w.tenant != "b" {
		t.Fatalf("admitted %v, want b (its endpoint is free)", w)
	}
	if w := q.pass(); w != nil {
		t.Fatalf("admitted %s while e1 is saturated", w.tenant)
	}
	busy.Store([]*endpoint.Endpoint{})
	if w := q.pass(); w == nil || w.tenant != "a" {
		t.Fatalf("admitted %v, want a", w)
	}
	if err := errors.Join(<-r1, <-r2); err != nil {
		t.Error(err)
	}
}

func TestQueueBoundedTimeoutCancel(t *testing.T) {
	q := newQueue(2, time.Minute, 0, func([]*endpoint.Endpoint) bool { return true })
	ctx, cancel := context.WithCancel(context.Background())
	r1 := enqueue(t, q, ctx, "a", 0, nil)
	r2 := enqueue(t, q, ctx, "b", 0, nil)
	if _, err := q.wait(context.Background(), "c", 9, 1, nil); !errors.Is(err, errQueueFull) {
		t.Errorf("third waiter in a queue of 2: %v, want errQueueFull", err)
	}
	cancel()
	for _, r := range []<-chan error{r1, r2} {
		if err := <-r; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled waiter: %v, want context.Canceled", err)
		}
	}
	if n := q.len(); n != 0 {
		t.Errorf("%d waiters left after cancellation", n)
	}
	q.configure(2, 5*time.Millisecond, func([]*endpoint.Endpoint) bool { return true })
	if _, err := q.wait(context.Background(), "a", 0, 1, nil); !errors.Is(err, errWaitedTooLong) {
		t.Errorf("saturated past max_wait: %v, want errWaitedTooLong", err)
	}
	if n := q.len(); n != 0 {
		t.Errorf("%d waiters left after the timeout", n)
	}
}

func TestQueueFastPath(t *testing.T) {
	q := newQueue(0, time.Minute, 0, nil) // no saturation predicate, no room: never waits
	if queued, err := q.wait(context.Background(), "a", 0, 1, nil); err != nil || queued {
		t.Errorf("unsaturated: queued %v, %v; want straight through", queued, err)
	}
}

// Requests that leave the queue unserved cost their tenant nothing: neither while the tenant
// still has others queued, nor once the queue has emptied.
func TestQueueLeftUnservedNotCharged(t *testing.T) {
	var saturated atomic.Bool
	saturated.Store(true)
	q := newQueue(100, time.Minute, 0, func([]*endpoint.Endpoint) bool { return saturated.Load() })
	bg := context.Background()
	pass := func(n int) []string {
		t.Helper()
		saturated.Store(false)
		defer saturated.Store(true)
		var order []string
		for range n {
			w := q.pass()
			if w == nil {
				t.Fatal("nothing admitted while not saturated")
			}
			order = append(order, w.tenant)
		}
		return order
	}

	// a queues three requests, b three; the clients of a's first two go away.
	var gone []context.CancelFunc
	var left []<-chan error
	for range 2 {
		ctx, cancel := context.WithCancel(bg)
		gone = append(gone, cancel)
		left = append(left, enqueue(t, q, ctx, "a", 0, nil))
	}
	rest := []<-chan error{enqueue(t, q, bg, "a", 0, nil)}
	for range 3 {
		rest = append(rest, enqueue(t, q, bg, "b", 0, nil))
	}
	for i, cancel := range gone {
		cancel()
		if err := <-left[i]; !errors.Is(err, context.Canceled) {
			t.Fatalf("a's request %d: %v, want context.Canceled", i, err)
		}
	}
	waitLen(t, q, 4)
	// a's remaining request is a's first served: it goes before b's (it arrived first).
	if diff := cmp.Diff([]string{"a", "b", "b", "b"}, pass(4)); diff != "" {
		t.Errorf("admission order after a's first two left (-want +got):\n%s", diff)
	}
	for _, r := range rest {
		if err := <-r; err != nil {
			t.Fatal(err)
		}
	}

	// The queue emptied by departures alone: a's five requests that left do not put its next
	// one behind b's backlog.
	ctx, cancel := context.WithCancel(bg)
	left = left[:0]
	for range 5 {
		left = append(left, enqueue(t, q, ctx, "a", 0, nil))
	}
	cancel()
	for _, r := range left {
		if err := <-r; !errors.Is(err, context.Canceled) {
			t.Fatalf("a's request whose client left: %v, want context.Canceled", err)
		}
	}
	waitLen(t, q, 0)
	rest = rest[:0]
	for range 3 {
		rest = append(rest, enqueue(t, q, bg, "b", 0, nil))
	}
	rest = append(rest, enqueue(t, q, bg, "a", 0, nil))
	if diff := cmp.Diff([]string{"b", "a", "b", "b"}, pass(4)); diff != "" {
		t.Errorf("admission order after a's requests left (-want +got):\n%s", diff)
	}
	for _, r := range rest {
		if err := <-r; err != nil {
			t.Fatal(err)
		}
	}
}
