package prefix

import (
	"container/heap"
	"errors"
	"fmt"
	"io"

	"github.com/vmihailenco/msgpack/v5"
)

// A snapshot of an Index is what a new router replica takes from a running one, so that it
// starts knowing which endpoint holds which blocks: every (block, endpoint) entry with its age,
// oldest first across all endpoints, so that importing them in order rebuilds each endpoint's
// LRU in the same recency order (and keeps what each holds a set of whole prefixes). Endpoints
// are named, not numbered: IDs are local to a replica.
//
// It is a msgpack stream: a header array [version, [endpoint names], [capacities in blocks],
// entries], then chunks, each an array of up to snapshotChunk triples flattened (endpoint
// index, block hash, age in nanoseconds), and an empty array at the end.

// SnapshotVersion is the snapshot format's version; a reader refuses others.
const SnapshotVersion = 1

const snapshotChunk = 4096

// SnapshotEntryBytes is about what one entry takes in a snapshot: for sizing one in bytes.
const SnapshotEntryBytes = 20

// ErrSnapshot is wrapped by every error about a snapshot's content.
var ErrSnapshot = errors.New("bad index snapshot")

type snapEntry struct {
	stamp int64
	hash  uint64
	ep    int32 // index into the snapshot's endpoint list
}

// WriteSnapshot writes the newest maxEntries entries (0: all) of the endpoints that name
// gives a name to ("" leaves an endpoint out), with their ages as of now (the clock the
// index's stamps come from), and returns how many it wrote. The index is read-locked only
// while the entries are copied, not while they are written.
func (x *Index) WriteSnapshot(w io.Writer, name func(ep int) string, now int64, maxEntries int) (int, error) {
	var names []string
	var caps []int
	var lists [][]snapEntry // per snapshot endpoint, newest first
	x.mu.RLock()
	for ep := range x.eps {
		n := name(ep)
		if n == "" || x.eps[ep].n == 0 {
			continue
		}
		k := int32(len(names))
		names = append(names, n)
		caps = append(caps, x.capOf(ep))
		limit := x.eps[ep].n
		if maxEntries > 0 {
			limit = min(limit, maxEntries)
		}
		l := make([]snapEntry, 0, limit)
		for ni := x.eps[ep].head; ni != 0 && len(l) < limit; ni = x.node(ni).next { // from the most recent on
			nd := x.node(ni)
			l = append(l, snapEntry{stamp: nd.stamp, hash: x.entry(nd.entry).hash, ep: k})
		}
		lists = append(lists, l)
	}
	x.mu.RUnlock()

	entries := mergeNewest(lists, maxEntries) // newest first
	enc := msgpack.NewEncoder(w)
	if err := writeSnapHeader(enc, names, caps, len(entries)); err != nil {
		return 0, err
	}
	for end := len(entries); end > 0; end -= snapshotChunk {
		start := max(end-snapshotChunk, 0)
		if err := enc.EncodeArrayLen(3 * (end - start)); err != nil {
			return 0, err
		}
		for i := end - 1; i >= start; i-- { // oldest first
			e := entries[i]
			age := max(now-e.stamp, 0)
			if err := errors.Join(enc.EncodeUint(uint64(e.ep)), enc.EncodeUint64(e.hash), enc.EncodeInt(age)); err != nil {
				return 0, err
			}
		}
	}
	if err := enc.EncodeArrayLen(0); err != nil {
		return 0, err
	}
	return len(entries), nil
}

func writeSnapHeader(enc *msgpack.Encoder, names []string, caps []int, entries int) error {
	errs := []error{enc.EncodeArrayLen(4), enc.EncodeInt(SnapshotVersion), enc.EncodeArrayLen(len(names))}
	for _, n := range names {
		errs = append(errs, enc.EncodeString(n))
	}
	errs = append(errs, enc.EncodeArrayLen(len(caps)))
	for _, c := range caps {
		errs = append(errs, enc.EncodeInt(int64(c)))
	}
	errs = append(errs, enc.EncodeInt(int64(entries)))
	return errors.Join(errs...)
}

// mergeNewest merges per-endpoint lists, each newest first, into one newest first, keeping at
// most limit entries (0: all).
func mergeNewest(lists [][]snapEntry, limit int) []snapEntry {
	total := 0
	for _, l := range lists {
		total += len(l)
	}
	if limit > 0 {
		total = min(total, limit)
	}
	out := make([]snapEntry, 0, total)
	h := &snapHeap{}
	for i, l := range lists {
		if len(l) > 0 {
			h.items = append(h.items, snapCursor{list: i})
		}
	}
	h.lists = lists
	heap.Init(h)
	for h.Len() > 0 && len(out) < total {
		c := &h.items[0]
		out = append(out, lists[c.list][c.pos])
		c.pos++
		if c.pos == len(lists[c.list]) {
			heap.Pop(h)
		} else {
			heap.Fix(h, 0)
		}
	}
	return out
}

type snapCursor struct{ list, pos int }

// snapHeap orders cursors by their current entry's stamp, newest on top.
type snapHeap struct {
	items []snapCursor
	lists [][]snapEntry
}

func (h *snapHeap) Len() int { return len(h.items) }
func (h *snapHeap) Less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return h.lists[a.list][a.pos].stamp > h.lists[b.list][b.pos].stamp
}
func (h *snapHeap) Swap(i, j int) { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *snapHeap) Push(x any)    { h.items = append(h.items, x.(snapCursor)) }
func (h *snapHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}

// ReadSnapshot imports a snapshot written by WriteSnapshot: each entry of an endpoint that id
// knows (id returns -1 for a name this replica does not have) is inserted as last touched its
// age before now, oldest first, and each such endpoint takes the snapshot's capacity. It reads
// at most maxEntries entries (0: no limit) and returns how many it inserted. A snapshot that
// is cut short or malformed leaves what was inserted before the fault and returns an error
// wrapping ErrSnapshot.
func (x *Index) ReadSnapshot(r io.Reader, id func(name string) int, now int64, maxEntries int) (int, error) {
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeArrayLen()
	if err != nil || n != 4 {
		return 0, snapErr("header: want an array of 4, got %d (%v)", n, err)
	}
	v, err := dec.DecodeInt()
	if err != nil || v != SnapshotVersion {
		return 0, snapErr("version %d, want %d (%v)", v, SnapshotVersion, err)
	}
	names, err := decodeStrings(dec)
	if err != nil {
		return 0, err
	}
	nc, err := dec.DecodeArrayLen()
	if err != nil || nc != len(names) {
		return 0, snapErr("capacities: %d for %d endpoints (%v)", nc, len(names), err)
	}
	local := make([]int, len(names))
	for i := range names {
		c, err := dec.DecodeInt()
		if err != nil || c < 0 {
			return 0, snapErr("capacity %d (%v)", c, err)
		}
		local[i] = id(names[i])
		if local[i] >= 0 && c > 0 {
			x.SetCapacity(local[i], c)
		}
	}
	if _, err := dec.DecodeInt(); err != nil {
		return 0, snapErr("entry count: %v", err)
	}
	inserted, read := 0, 0
	lastAge := int64(-1)
	for {
		n, err := dec.DecodeArrayLen()
		if err != nil || n < 0 || n%3 != 0 || n > 3*snapshotChunk {
			return inserted, snapErr("chunk of %d values (%v)", n, err)
		}
		if n == 0 {
			return inserted, nil
		}
		chunk := make([]snapEntry, 0, n/3)
		for range n / 3 {
			k, err1 := dec.DecodeUint64()
			h, err2 := dec.DecodeUint64()
			age, err3 := dec.DecodeInt64()
			if err := errors.Join(err1, err2, err3); err != nil {
				return inserted, snapErr("entry: %v", err)
			}
			if k >= uint64(len(local)) || age < 0 {
				return inserted, snapErr("entry of endpoint %d of %d, age %d", k, len(local), age)
			}
			// Oldest first: a younger entry before an older one would break the recency
			// order, so it takes the age of the one before it.
			if lastAge >= 0 && age > lastAge {
				age = lastAge
			}
			lastAge = age
			read++
			if maxEntries > 0 && read > maxEntries {
				return inserted, snapErr("more than %d entries", maxEntries)
			}
			if ep := local[k]; ep >= 0 {
				chunk = append(chunk, snapEntry{stamp: now - age, hash: h, ep: int32(ep)})
			}
		}
		x.load(chunk)
		inserted += len(chunk)
	}
}

// load inserts entries, oldest first, each as one touch.
func (x *Index) load(entries []snapEntry) {
	if len(entries) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range entries {
		ep := int(e.ep)
		x.endpoint(ep)
		x.touch(ep, x.findOrAdd(e.hash), x.stamp(e.stamp))
		x.trim(ep)
	}
}

func decodeStrings(dec *msgpack.Decoder) ([]string, error) {
	n, err := dec.DecodeArrayLen()
	if err != nil || n < 0 || n > 1<<16 {
		return nil, snapErr("endpoint names: %d (%v)", n, err)
	}
	out := make([]string, n)
	for i := range out {
		if out[i], err = dec.DecodeString(); err != nil {
			return nil, snapErr("endpoint name: %v", err)
		}
	}
	return out, nil
}

func snapErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSnapshot, fmt.Sprintf(format, args...))
}
