package policy

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// epTable is what a policy keeps per endpoint, by slot: a small integer that names the endpoint
// in the policy's slices and its prefix.Index while the policy knows it, and is handed to
// another endpoint once this one has left (Removed). Endpoint IDs are never reused, so a slice
// indexed by ID, or an index named by IDs, grows with every endpoint the pool has ever had (a
// router that runs for months through rollouts and autoscaling sees hundreds of thousands);
// slots grow with the endpoints known at once.
//
// A released slot waits slotQuarantine before it is handed out again: a call that looked the
// endpoint up just before it left (a Pick, a Done) may still use its slot, and must not reach
// the endpoint that takes it next.
//
// Lookups, on every request, read an immutable view without a lock; an endpoint that joins or
// leaves, a few times a second at most, replaces the view with a copy. Safe for concurrent use.
type epTable[T any] struct {
	clock Clock
	// fresh makes a joining endpoint's value for slot; reused says that the slot served an
	// endpoint before (what a late call wrote there must go).
	fresh func(slot int, reused bool) T

	view atomic.Pointer[epView[T]]

	mu   sync.Mutex  // serialises changes of the view
	free []freedSlot // released slots, oldest first
}

// epView is the table at one moment; never changed once published.
type epView[T any] struct {
	of    map[int]int // endpoint ID -> slot
	slots []epSlot[T]
}

type epSlot[T any] struct {
	id int // the endpoint's ID, -1 while the slot is free
	v  T
}

type freedSlot struct {
	slot int
	at   int64 // when it was released, unix nanoseconds
}

// slotQuarantine is how long a released slot stays unused: far longer than any one call of a
// policy takes, however long its goroutine waits for a CPU.
const slotQuarantine = 10 * time.Second

func newEPTable[T any](clock Clock, fresh func(slot int, reused bool) T) *epTable[T] {
	if clock == nil {
		clock = WallClock{}
	}
	t := &epTable[T]{clock: clock, fresh: fresh}
	t.view.Store(&epView[T]{of: map[int]int{}})
	return t
}

// find returns endpoint id's slot and value; ok is false when the table does not know it.
func (t *epTable[T]) find(id int) (slot int, v T, ok bool) {
	w := t.view.Load()
	if slot, ok = w.of[id]; ok {
		v = w.slots[slot].v
	}
	return slot, v, ok
}

// get returns ep's slot and value, adding ep when the table does not know it, unless it has
// left the pool (endpoint.Draining): ok is false then, and nothing is added.
func (t *epTable[T]) get(ep *endpoint.Endpoint) (slot int, v T, ok bool) {
	if slot, v, ok = t.find(ep.ID); ok || ep.Draining() {
		return slot, v, ok
	}
	var slots [1]int
	var vals [1]T
	t.insert([]*endpoint.Endpoint{ep}, slots[:], vals[:])
	return slots[0], vals[0], slots[0] >= 0
}

// insert adds the endpoints eps that the table does not know, in one new view, and writes each
// one's slot and value into slots and vals. An endpoint that left the pool (Draining, read
// under the lock: the pool marks an endpoint before the router releases it, so it is refused
// here or added before release finds it) gets slot -1 and the zero value.
func (t *epTable[T]) insert(eps []*endpoint.Endpoint, slots []int, vals []T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.view.Load()
	var w *epView[T]
	now := t.clock.Now().UnixNano()
	for i, e := range eps {
		id := e.ID
		cur := old
		if w != nil {
			cur = w
		}
		if slot, ok := cur.of[id]; ok {
			slots[i], vals[i] = slot, cur.slots[slot].v
			continue
		}
		if e.Draining() {
			var zero T
			slots[i], vals[i] = -1, zero
			continue
		}
		if w == nil {
			w = &epView[T]{of: maps.Clone(old.of), slots: slices.Clone(old.slots)}
		}
		slot, reused := len(w.slots), false
		if len(t.free) > 0 && now-t.free[0].at >= int64(slotQuarantine) {
			slot, reused = t.free[0].slot, true
			t.free = t.free[:copy(t.free, t.free[1:])]
		} else {
			w.slots = append(w.slots, epSlot[T]{})
		}
		v := t.fresh(slot, reused)
		w.slots[slot] = epSlot[T]{id: id, v: v}
		w.of[id] = slot
		slots[i], vals[i] = slot, v
	}
	if w != nil {
		t.view.Store(w)
	}
}

// gather writes each candidate's slot into slots, and its value into vals unless vals is nil
// (both as long as c), adding the candidates the table does not know (get). One that left
// the pool and is not known gets slot -1 and the zero value: it matches nothing.
func (t *epTable[T]) gather(c []*endpoint.Endpoint, slots []int, vals []T) {
	w := t.view.Load()
	missing := 0
	for i, e := range c {
		slot, ok := w.of[e.ID]
		if !ok {
			slots[i] = -1
			missing++
			continue
		}
		slots[i] = slot
		if vals != nil {
			vals[i] = w.slots[slot].v
		}
	}
	if missing == 0 {
		return
	}
	// The candidates first seen: added together, in one new view.
	eps := make([]*endpoint.Endpoint, 0, missing)
	for i, e := range c {
		if slots[i] < 0 {
			eps = append(eps, e)
		}
	}
	got := make([]int, missing)
	gotV := make([]T, missing)
	t.insert(eps, got, gotV)
	k := 0
	for i := range c {
		if slots[i] >= 0 {
			continue
		}
		slots[i] = got[k]
		if vals != nil {
			vals[i] = gotV[k]
		}
		k++
	}
}

// each calls f with each candidate's position and value, while f returns true, skipping the
// candidates the table does not know.
func (t *epTable[T]) each(c []*endpoint.Endpoint, f func(i int, v T) bool) {
	w := t.view.Load()
	for i, e := range c {
		if slot, ok := w.of[e.ID]; ok && !f(i, w.slots[slot].v) {
			return
		}
	}
}

// release forgets endpoint id: it returns the slot and value it had, and ok false when the
// table did not know it. The slot is handed out again after slotQuarantine.
func (t *epTable[T]) release(id int) (slot int, v T, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.view.Load()
	if slot, ok = old.of[id]; !ok {
		return slot, v, false
	}
	v = old.slots[slot].v
	w := &epView[T]{of: maps.Clone(old.of), slots: slices.Clone(old.slots)}
	delete(w.of, id)
	w.slots[slot] = epSlot[T]{id: -1}
	t.view.Store(w)
	t.free = append(t.free, freedSlot{slot: slot, at: t.clock.Now().UnixNano()})
	return slot, v, true
}

// ids returns the endpoint ID of each slot, -1 for a free one.
func (t *epTable[T]) ids() []int {
	w := t.view.Load()
	out := make([]int, len(w.slots))
	for i, s := range w.slots {
		out[i] = s.id
	}
	return out
}

// len returns the endpoints the table knows and the slots it has made.
func (t *epTable[T]) len() (known, slots int) {
	w := t.view.Load()
	return len(w.of), len(w.slots)
}
