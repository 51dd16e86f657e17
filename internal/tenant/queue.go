package tenant

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// errQueueFull and errWaitedTooLong are the queue's refusals; the gate turns them into 503s.
var (
	errQueueFull     = errors.New("admission queue full")
	errWaitedTooLong = errors.New("waited too long for admission")
)

// queue holds requests back while every endpoint that could serve them is saturated, and lets
// them go one at a time as capacity frees: highest priority first, and within a priority by
// self-clocked weighted fair queuing (each tenant's requests get virtual finish times one
// cost apart, starting no earlier than the virtual time of the last request let go), so a
// tenant that queues a hundred requests does not make another tenant's one request wait behind
// all of them. Nothing admitted is dropped: a waiter leaves only admitted, or with an error
// (queue full, waited too long, its client gone).
type queue struct {
	saturated func([]*endpoint.Endpoint) bool // nil: never saturated
	size      int
	maxWait   time.Duration
	poll      time.Duration // 0: no dispatcher goroutine (tests call pass)

	mu         sync.Mutex
	waiters    []*waiter
	vtime      float64
	lastFinish map[string]float64 // tenant -> virtual finish of its last queued request
	seq        uint64
	running    bool // the dispatcher goroutine is alive
	kick       chan struct{}
	// waiting counts each tenant's waiters, told to counted (nil: nobody) at each change,
	// under mu so that the counts arrive in order.
	waiting map[string]int
	counted func(tenant string, n int)
}

type waiter struct {
	tenant string
	prio   int
	cost   float64
	vstart float64 // the virtual time when it arrived: the earliest it may start
	finish float64
	seq    uint64
	cands  []*endpoint.Endpoint
	ready  chan struct{} // closed when admitted
}

func newQueue(size int, maxWait, poll time.Duration, saturated func([]*endpoint.Endpoint) bool) *queue {
	return &queue{saturated: saturated, size: size, maxWait: maxWait, poll: poll,
		lastFinish: map[string]float64{}, kick: make(chan struct{}, 1), waiting: map[string]int{}}
}

// configure changes the queue's settings for requests that arrive from now on.
func (q *queue) configure(size int, maxWait time.Duration, saturated func([]*endpoint.Endpoint) bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.size, q.maxWait, q.saturated = size, maxWait, saturated
	q.signal()
}

func (q *queue) isSaturated(cands []*endpoint.Endpoint) bool {
	return q.saturated != nil && q.saturated(cands)
}

// wait returns nil once the request may go to one of cands; queued says whether it had to
// wait in the queue (false: it went at once, or was refused at once). cost is the request's
// share (1 per request).
func (q *queue) wait(ctx context.Context, tenant string, prio int, cost float64, cands []*endpoint.Endpoint) (queued bool, err error) {
	q.mu.Lock()
	if len(q.waiters) == 0 && !q.isSaturated(cands) {
		q.mu.Unlock()
		return false, nil
	}
	if len(q.waiters) >= q.size {
		q.mu.Unlock()
		return false, errQueueFull
	}
	q.seq++
	start := max(q.vtime, q.lastFinish[tenant])
	w := &waiter{tenant: tenant, prio: prio, cost: cost, vstart: q.vtime, finish: start + cost, seq: q.seq, cands: cands, ready: make(chan struct{})}
	q.lastFinish[tenant] = w.finish
	q.waiters = append(q.waiters, w)
	q.countLocked(tenant, 1)
	if q.poll > 0 && !q.running {
		q.running = true
		go q.dispatch()
	}
	q.signal()
	maxWait := q.maxWait
	q.mu.Unlock()

	timer := time.NewTimer(maxWait)
	defer timer.Stop()
	select {
	case <-w.ready:
		return true, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = errWaitedTooLong
	}
	if q.remove(w) {
		return true, err
	}
	return true, nil // admitted meanwhile: the caller goes on (and fails fast if its client left)
}

// remove takes w out of the queue unserved; false when it was admitted already. Its tenant is
// not charged for it: its cost comes off the virtual finish times of the tenant's later
// waiters (none earlier than its own arrival allows) and off the tenant's last finish, so that
// requests that left (their client gone, or max_wait) do not push the tenant's next ones behind
// the other tenants.
func (q *queue) remove(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.waiters, w)
	if i < 0 {
		return false
	}
	q.waiters = slices.Delete(q.waiters, i, i+1)
	q.countLocked(w.tenant, -1)
	last := q.lastFinish[w.tenant] - w.cost
	for _, x := range q.waiters {
		if x.tenant == w.tenant && x.seq > w.seq {
			x.finish = max(x.finish-w.cost, x.vstart+x.cost)
			last = max(last, x.finish)
		}
	}
	q.lastFinish[w.tenant] = last
	q.emptiedLocked()
	return true
}

// emptiedLocked forgets the tenants' finish times once nobody waits: a tenant with nothing
// queued starts at the virtual time reached, whatever it had queued before (and the map does
// not grow with tenants). The caller holds q.mu.
func (q *queue) emptiedLocked() {
	if len(q.waiters) == 0 {
		clear(q.lastFinish)
	}
}

// signal wakes the dispatcher (without blocking).
func (q *queue) signal() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// dispatch lets waiters go while there are any: on every signal (a request ended, one
// arrived) and every poll interval (scraped engine state changes on its own).
func (q *queue) dispatch() {
	t := time.NewTicker(q.poll)
	defer t.Stop()
	for {
		select {
		case <-q.kick:
		case <-t.C:
		}
		q.mu.Lock()
		q.passLocked()
		if len(q.waiters) == 0 {
			q.running = false // passLocked or remove forgot the finish times
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// pass admits the first waiter in order whose candidates are not all saturated, and returns
// it (nil when none may go). One per pass: the saturation signals (in-flight counts, the
// engines' queues) only see an admitted request once it has been forwarded.
func (q *queue) pass() *waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.passLocked()
}

func (q *queue) passLocked() *waiter {
	order := slices.Clone(q.waiters)
	slices.SortFunc(order, func(a, b *waiter) int {
		switch {
		case a.prio != b.prio:
			return b.prio - a.prio
		case a.finish < b.finish:
			return -1
		case a.finish > b.finish:
			return 1
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for _, w := range order {
		if q.isSaturated(w.cands) {
			continue
		}
		q.waiters = slices.DeleteFunc(q.waiters, func(x *waiter) bool { return x == w })
		q.countLocked(w.tenant, -1)
		q.vtime = max(q.vtime, w.finish)
		close(w.ready)
		q.emptiedLocked()
		return w
	}
	return nil
}

// countLocked adds delta to tenant's waiters and tells counted. The caller holds q.mu.
func (q *queue) countLocked(tenant string, delta int) {
	n := q.waiting[tenant] + delta
	if n <= 0 {
		delete(q.waiting, tenant) // the map does not grow with tenants that waited once
		n = 0
	} else {
		q.waiting[tenant] = n
	}
	if q.counted != nil {
		q.counted(tenant, n)
	}
}

// recount tells counted the waiters of every tenant that has some again: a reload makes the
// series of a tenant added back anew, at 0.
func (q *queue) recount() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.counted == nil {
		return
	}
	for tenant, n := range q.waiting {
		q.counted(tenant, n)
	}
}

// len returns how many requests wait.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}
