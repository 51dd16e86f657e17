package policy

import (
	"io"
	"strconv"

	"github.com/kvroute/kvroute/internal/endpoint"
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
// fleet's calibration). A snapshot (Snapshotter) carries the index alone, and a new picker's
// calibration would start again from the prior.
type Inheritor interface {
	// Inherit takes over old's learned state. old is the picker in force, built by New for the
	// same name with oldParams; the receiver is a new one built with params, not used yet. old
	// may still end the requests it routed (their ends count in the state both then share),
	// but must pick no more. ok is false when old is not of the receiver's kind: nothing was
	// taken.
	Inherit(old Picker, oldParams, params Params) (in Inherited, ok bool)
}

// Inherited is what Inheritor.Inherit took over, for the log.
type Inherited struct {
	// IndexEntries is the index's (block, endpoint) entries.
	IndexEntries int
	// IndexCopied: the index was copied into one of the new sizes (index_blocks or
	// max_index_entries changed), not shared; what old's requests in flight add to the old
	// one at their end is lost.
	IndexCopied bool
	// Endpoints is the endpoints whose state was kept; Calibrated, those of them with a speed
	// calibration of their own.
	Endpoints, Calibrated int
	// FleetCalibrated: the fleet's speed calibration was kept (it had one).
	FleetCalibrated bool
}

// indexParams are prefix-aware's parameters that size its index: a picker built with others
// cannot share its predecessor's index, which keeps the sizes it was built with.
var indexParams = []string{"index_blocks", "max_index_entries"}

// Inherit takes over old's index, endpoint states and calibrations (policy.Inheritor). The
// endpoint table is shared, slots and states alike, so that old's requests in flight, which
// hold their endpoint's state, release its queue and teach its calibration when they end, as
// they would have; an endpoint seen first from now on gets the receiver's state. The index is
// shared too, unless its sizes changed: it is then copied, oldest entry first, into the
// receiver's. The fleet's calibration, the pooled engine TTFTs and the replicas' placement
// rates are copied as they are now.
func (pa *prefixAware) Inherit(old Picker, oldParams, params Params) (Inherited, bool) {
	o, ok := old.(*prefixAware)
	if !ok || o == pa {
		return Inherited{}, false
	}
	var in Inherited
	same := true
	for _, k := range indexParams {
		same = same && oldParams[k] == params[k]
	}
	// The index pa's states clear a reused slot in (the table's fresh) is set before the
	// table makes pa's states; a copy takes the slots in use before then, so that one reused
	// meanwhile, which pa clears in its own index only, brings none of its last endpoint's
	// entries from o's.
	var ids []int
	if same {
		pa.index = o.index
	} else {
		ids = o.eps.ids()
	}
	o.eps.mu.Lock()
	o.eps.fresh = pa.eps.fresh // makes pa's state, in pa.index, whichever of the two asks
	o.eps.mu.Unlock()
	pa.eps = o.eps
	if !same {
		in.IndexCopied = true
		pa.copyIndex(o, ids)
	}
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

// copyIndex copies o's index into pa's (built with other sizes) through a snapshot of every
// entry of the slots in use in ids (the endpoint of each slot, -1 for a free one), slots named
// by their number: pa shares o's endpoint table. Each endpoint keeps the
// capacity the policy gave the old index (sizeIndex, which will not give it again while it is
// unchanged), also one that holds nothing yet and so is not in the snapshot; one never given a
// capacity takes pa's default (index_blocks), not the old default the snapshot carries.
func (pa *prefixAware) copyIndex(o *prefixAware, ids []int) {
	now := pa.clock.Now().UnixNano()
	pr, pw := io.Pipe()
	go func() {
		_, err := o.index.WriteSnapshot(pw, func(slot int) string {
			if slot < len(ids) && ids[slot] >= 0 {
				return strconv.Itoa(slot)
			}
			return ""
		}, now, 0)
		pw.CloseWithError(err)
	}()
	_, err := pa.index.ReadSnapshot(pr, func(name string) int {
		slot, err := strconv.Atoi(name)
		if err != nil {
			return -1
		}
		return slot
	}, now, 0)
	// Our own snapshot, read as written: an error leaves what was copied before it. The
	// writer ends either way once the reader is closed.
	_ = pr.CloseWithError(err)
	for slot, s := range pa.eps.view.Load().slots {
		if s.id < 0 {
			continue
		}
		blocks := 0 // the default
		if s.v.kvTokens.Load() > 0 {
			blocks = o.index.Capacity(slot)
		}
		pa.index.SetCapacity(slot, blocks)
	}
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
