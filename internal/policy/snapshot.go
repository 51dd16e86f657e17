package policy

import (
	"io"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// Snapshotter is implemented by policies whose learned picture of the fleet a new router
// replica can take from a running one, so that it starts warm instead of empty (prefix-aware:
// its index of which endpoint holds which blocks). Endpoints are named in a snapshot, as IDs
// are local to a replica.
type Snapshotter interface {
	// WriteSnapshot writes the policy's state, the endpoints named by name ("" leaves an
	// endpoint out), at most maxEntries entries (0: all), the newest first to stay; it
	// returns the entries written.
	WriteSnapshot(w io.Writer, name func(id int) string, maxEntries int) (int, error)
	// ReadSnapshot adds a snapshot's state to the policy's, the endpoints found by ep (nil
	// for a name this replica does not have), reading at most maxEntries entries (0: no
	// limit); it returns the entries taken. An endpoint that has left the pool
	// (endpoint.Draining), also while the snapshot is read, takes nothing: the policy forgot it
	// (Observer.Removed) or will, and must not learn it again. A bad snapshot is an error;
	// what was taken before the fault stays.
	ReadSnapshot(r io.Reader, ep func(name string) *endpoint.Endpoint, maxEntries int) (int, error)
}

// Inheritor is implemented by policies that can take over what a picker of their own kind,
// built with other parameters, has learned: a config reload that changes a parameter then
// keeps the policy's picture of the fleet instead of starting it empty (prefix-aware: its
// index, each endpoint's calibration, queue, rates, failures and learned capacity, and the
// fleet's calibration; cache-aware, overlap-cost and scorer-weighted: their index and each
// endpoint's requests in flight). A snapshot (Snapshotter) carries the index alone, and a new
// picker's calibration would start again from the prior.
type Inheritor interface {
	// Inherit takes over old's learned state. old is the picker in force, built by New for the
	// same name with oldParams; the receiver is a new one built with params, not used yet. old
	// may still end the requests it routed (their ends count in the state both then share),
	// and may pick while Inherit runs and until the receiver takes its place: what it learns
	// then is kept where the two share it (the index, the endpoints' states), and is old's
	// alone elsewhere (prefix-aware's fleet calibration, copied as Inherit found it). ok is
	// false when old is not of the receiver's kind: nothing was taken.
	Inherit(old Picker, oldParams, params Params) (in Inherited, ok bool)
}

// Inherited is what Inheritor.Inherit took over, for the log.
type Inherited struct {
	// IndexEntries is the index's (block, endpoint) entries.
	IndexEntries int
	// IndexResized: the index, shared, was given the receiver's sizes (index_blocks,
	// max_index_entries, max_tree_size or lru_blocks changed); IndexEvicted is the entries that
	// did not fit them.
	IndexResized bool
	IndexEvicted int
	// Endpoints is the endpoints whose state was kept; Calibrated, those of them with a speed
	// calibration of their own.
	Endpoints, Calibrated int
	// FleetCalibrated: the fleet's speed calibration was kept (it had one).
	FleetCalibrated bool
}

// resizeShared gives old, the index of the picker in force, which a picker of its kind built
// with other parameters shares from now on, that one's sizes (want) where they differ: in
// place (prefix.Index.Resize, reset as there), never copied. A copy took 2.5 s for a million
// entries, and what old learned while it ran (the requests it routed meanwhile, and the ends of
// those it routed before) went to the index left behind: with one index, nothing is lost, and
// a request routed meanwhile waits for one step of the resize at most. It returns whether the
// sizes differed and the entries evicted to fit.
func resizeShared(old *prefix.Index, want prefix.IndexConfig, reset func(slot int) bool) (resized bool, evicted int) {
	if old.Sizes() == want {
		return false, 0
	}
	return true, old.Resize(want, reset)
}

// Inherit takes over old's index, endpoint states and calibrations (policy.Inheritor). The
// endpoint table is shared, slots and states alike, so that old's requests in flight, which
// hold their endpoint's state, release its queue and teach its calibration when they end, as
// they would have; an endpoint seen first from now on gets the receiver's state. The index is
// shared too, given the receiver's sizes where they changed (resizeShared): each endpoint keeps
// the capacity the policy gave it (sizeIndex, which will not give it again while it is
// unchanged), and one never given a capacity takes the receiver's default (index_blocks), also
// one whose capacity came with a peer's snapshot. The fleet's calibration, the pooled engine
// TTFTs and the replicas' placement rates are copied as they are now.
func (pa *prefixAware) Inherit(old Picker, _, _ Params) (Inherited, bool) {
	o, ok := old.(*prefixAware)
	if !ok || o == pa {
		return Inherited{}, false
	}
	var in Inherited
	// The index pa's states clear a reused slot in (the table's fresh) is old's before the
	// table makes pa's states.
	want := pa.index.Sizes() // (pa's own index, never used, says its sizes)
	pa.index = o.index
	o.eps.mu.Lock()
	o.eps.fresh = pa.eps.fresh // makes pa's state, in the shared index, whichever of the two asks
	o.eps.mu.Unlock()
	pa.eps = o.eps
	// Read under the index's lock: a capacity the policy gives meanwhile (kvTokens set, then
	// the index's) is either seen here or set after.
	slots := pa.eps.view.Load().slots
	in.IndexResized, in.IndexEvicted = resizeShared(pa.index, want, func(slot int) bool {
		return slot < len(slots) && slots[slot].id >= 0 && slots[slot].v.kvTokens.Load() == 0
	})
	in.IndexEntries, _ = pa.index.Size()
	for _, slot := range pa.eps.view.Load().slots {
		if slot.id < 0 {
			continue
		}
		in.Endpoints++
		if slot.v.speed.learned.Load() {
			in.Calibrated++
		}
	}
	pa.fleet.copyFrom(&o.fleet)
	in.FleetCalibrated = pa.fleet.learned.Load()
	o.pooled.mu.Lock()
	pa.pooled.engineSum, pa.pooled.engineN = o.pooled.engineSum, o.pooled.engineN
	pa.pooled.routerSum, pa.pooled.routerN = o.pooled.routerSum, o.pooled.routerN
	o.pooled.mu.Unlock()
	r, or := &pa.replicas, &o.replicas
	r.peers.Store(or.peers.Load())
	r.rank.Store(or.rank.Load())
	r.lag.Store(or.lag.Load())
	r.placed.copyFrom(&or.placed)
	r.placedWork.copyFrom(&or.placedWork)
	or.mu.Lock()
	r.clumpLast, r.clumpN, r.clumpMean = or.clumpLast, or.clumpN, or.clumpMean
	or.mu.Unlock()
	return in, true
}

// inheritShared is Inherit for the policies whose whole state is an index and an endpoint
// table whose values any picker of the kind can use (cache-aware, overlap-cost,
// scorer-weighted): the receiver, not used yet, shares old's table and index, given its own
// sizes where they differ (resizeShared; an endpoint's capacity is always the default).
func inheritShared[T any](index **prefix.Index, eps **epTable[T], oldIndex *prefix.Index, oldEPs *epTable[T]) Inherited {
	var in Inherited
	want := (*index).Sizes()
	*index, *eps = oldIndex, oldEPs
	in.IndexResized, in.IndexEvicted = resizeShared(oldIndex, want, nil)
	in.IndexEntries, _ = oldIndex.Size()
	in.Endpoints, _ = oldEPs.len()
	return in
}

// Inherit shares old's trees (policy.Inheritor).
func (ca *cacheAware) Inherit(old Picker, _, _ Params) (Inherited, bool) {
	o, ok := old.(*cacheAware)
	if !ok || o == ca {
		return Inherited{}, false
	}
	return inheritShared(&ca.index, &ca.eps, o.index, o.eps), true
}

// Inherit shares old's index and each endpoint's active blocks (policy.Inheritor): old's
// requests in flight take theirs off when they end.
func (oc *overlapCost) Inherit(old Picker, _, _ Params) (Inherited, bool) {
	o, ok := old.(*overlapCost)
	if !ok || o == oc {
		return Inherited{}, false
	}
	oc.expired.Store(o.expired.Load())
	return inheritShared(&oc.index, &oc.eps, o.index, o.eps), true
}

// Inherit shares old's index (policy.Inheritor).
func (sw *scorerWeighted) Inherit(old Picker, _, _ Params) (Inherited, bool) {
	o, ok := old.(*scorerWeighted)
	if !ok || o == sw {
		return Inherited{}, false
	}
	return inheritShared(&sw.index, &sw.eps, o.index, o.eps), true
}

// copyFrom sets f to o's calibration as it is now. f is not in use yet.
func (f *speedFit) copyFrom(o *speedFit) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f.n, f.observed, f.prior, f.last = o.n, o.observed, o.prior, o.last
	f.factor.Store(o.factor.Load())
	f.learned.Store(o.learned.Load())
	f.staleAt.Store(o.staleAt.Load())
	f.horizon.Store(o.horizon.Load())
}

// copyFrom sets d to o's sum as it is now. d is not in use yet.
func (d *decayed) copyFrom(o *decayed) {
	o.mu.Lock()
	defer o.mu.Unlock()
	d.sum.Store(o.sum.Load())
	d.at.Store(o.at.Load())
}
