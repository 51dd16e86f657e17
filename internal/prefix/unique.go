package prefix

import (
	"math"
	"time"
)

// What one endpoint's cache is worth to the fleet: the blocks it holds that no other endpoint
// holds. Losing the endpoint (a scale-in) loses exactly those; a block another endpoint also
// holds is still there. Each counts by how recently a request used it, the index's stamp being
// the time of the last request that touched it: a block used a minute ago will probably be used
// again, one last used an hour ago probably not, and only reuse makes a lost block cost a
// recompute.

// uniqueChunk is how many entries Unique reads per hold of the read lock. Walking an endpoint
// of 150,000 entries (an 8 x H200 engine's KV cache in 16-token blocks) costs a few
// milliseconds, and a writer waiting for the lock (a request being routed) would wait that
// long, and every reader behind it too: the walk lets go between chunks.
const uniqueChunk = 2048

// uniqueRestarts bounds how often a walk whose place was lost (its entry was touched or
// evicted while the lock was let go) starts again from the most recent entry; past it, the
// rest is walked under one hold.
const uniqueRestarts = 4

// Unique returns what endpoint ep holds that no other endpoint holds: the number of such
// blocks, and their sum weighted by recency, each block counting exp(-(now - stamp) / window)
// (1 for a block touched at now, 1/e for one touched a window earlier). now is on the clock the
// stamps were given with (Insert's now). A window of 0 or less counts every block 1.
//
// The walk lets go of the lock every uniqueChunk entries (see there), so a busy index may
// change under it: an entry touched during a pause is counted once or, if the walk had not
// reached it yet, not at all; the answer is exact for an index that does not change.
func (x *Index) Unique(ep int, now int64, window time.Duration) (blocks int, value float64) {
	return x.unique(ep, now, window, uniqueChunk, nil)
}

// unique is Unique reading chunk entries per hold, calling pause (when not nil) while the lock
// is let go: tests change the index there.
func (x *Index) unique(ep int, now int64, window time.Duration, chunk int, pause func()) (blocks int, value float64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if ep < 0 || ep >= len(x.eps) {
		return 0, 0
	}
	inv := 0.0
	if window > 0 {
		inv = 1 / float64(window)
	}
	// An endpoint's list runs from the most recent entry to the least, with strictly falling
	// stamps (Insert and touch stamp what they put in front). counted is the stamp of the last
	// entry counted: after a restart, entries at or above it were counted already, or were
	// touched during a pause.
	counted := int64(math.MaxInt64)
	restarts, steps := 0, 0
	for ni := x.eps[ep].head; ni != 0; {
		n := x.node(ni)
		at, stamp := ni, n.stamp
		if stamp < counted {
			counted = stamp
			if x.entry(n.entry).n == 1 {
				blocks++
				value += math.Exp(-float64(max(now-stamp, 0)) * inv)
			}
		}
		ni = n.next
		if steps++; steps%chunk != 0 || ni == 0 {
			continue
		}
		x.mu.RUnlock()
		if pause != nil {
			pause()
		}
		x.mu.RLock()
		// Node memory is never freed (chunks only grow), so reading it is safe; stamps are
		// never reused, so an entry with the same endpoint and stamp is the same entry, still
		// in place.
		if c := x.node(at); int(c.ep) == ep && c.stamp == stamp && ep < len(x.eps) {
			ni = c.next
			continue
		}
		if ep >= len(x.eps) {
			return blocks, value
		}
		ni = x.eps[ep].head
		if restarts++; restarts >= uniqueRestarts {
			chunk = math.MaxInt
		}
	}
	return blocks, value
}
