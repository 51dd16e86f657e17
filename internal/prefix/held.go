package prefix

// What one endpoint holds of a chain, found by bisection rather than block by block: on a
// 100k-token prompt (6,250 blocks) the walk costs a table probe per block, twice per request
// (the prediction and the routing record), which was most of the index's share of the
// router's CPU. Both rely on the invariant Match relies on: what an endpoint holds is a set of
// whole prefixes, so whether it holds block i falls from true to false once along a chain, and
// its stamps fall along the chain (a parent is always touched after its children).

// StampRun is a run of consecutive stamps along a chain: block From+k carries Stamp-k, up to
// the next run's From. One Insert stamps a whole chain this way, so a chain that a request
// re-inserts is one run however long it is.
type StampRun struct {
	From  int
	Stamp int64
}

// StampAt returns the stamp of block i from runs (MatchRuns' answer); ok is false when the
// runs do not reach block i.
func StampAt(runs []StampRun, i, held int) (stamp int64, ok bool) {
	if i < 0 || i >= held {
		return 0, false
	}
	for k := len(runs) - 1; k >= 0; k-- {
		if runs[k].From <= i {
			return runs[k].Stamp - int64(i-runs[k].From), true
		}
	}
	return 0, false
}

// Holds returns how many leading blocks endpoint ep holds: MatchOne's count in O(log n)
// lookups.
func (x *Index) Holds(ep int, blocks []uint64) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.held(ep, blocks)
}

// MatchRuns returns how many leading blocks endpoint ep holds and appends to runs their
// stamps as runs of consecutive stamps (see StampRun): MatchOne's answer in O(r log n)
// lookups for r runs.
func (x *Index) MatchRuns(ep int, blocks []uint64, runs []StampRun) (int, []StampRun) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	n := x.held(ep, blocks)
	if n == 0 {
		return 0, runs
	}
	return n, x.stampRuns(ep, blocks, 0, n-1, x.stampOf(ep, blocks[0]), x.stampOf(ep, blocks[n-1]), runs)
}

// held is the length of ep's run along blocks. The lock is held.
func (x *Index) held(ep int, blocks []uint64) int {
	lo, hi := 0, len(blocks) // ep holds blocks[:lo]; it does not hold blocks[hi] (or hi is the end)
	for lo < hi {
		mid := lo + (hi-lo)/2
		if x.stampOf(ep, blocks[mid]) != 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// stampOf returns the stamp of (h, ep), 0 when ep does not hold h. Stamps start at 1: a
// stamp is the insertion time in nanoseconds or a counter above the last one.
func (x *Index) stampOf(ep int, h uint64) int64 {
	ei := x.find(h)
	if ei == 0 {
		return 0
	}
	for ni := x.entry(ei).head; ni != 0; ni = x.node(ni).nextHolder {
		if n := x.node(ni); int(n.ep) == ep {
			return n.stamp
		}
	}
	return 0
}

// stampRuns appends the runs of blocks[lo..hi], whose end stamps are sLo and sHi.
func (x *Index) stampRuns(ep int, blocks []uint64, lo, hi int, sLo, sHi int64, runs []StampRun) []StampRun {
	if sLo-sHi == int64(hi-lo) {
		// Strictly falling stamps that fall by exactly the distance are consecutive.
		if k := len(runs) - 1; k >= 0 && runs[k].Stamp-int64(lo-runs[k].From) == sLo {
			return runs // continues the previous run
		}
		return append(runs, StampRun{From: lo, Stamp: sLo})
	}
	mid := lo + (hi-lo)/2
	sMid := x.stampOf(ep, blocks[mid])
	runs = x.stampRuns(ep, blocks, lo, mid, sLo, sMid, runs)
	return x.stampRuns(ep, blocks, mid+1, hi, x.stampOf(ep, blocks[mid+1]), sHi, runs)
}
