package prefix

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// lru lists endpoint ep's blocks from the most recent to the least.
func lru(x *Index, ep int) []uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []uint64
	if ep >= len(x.eps) {
		return nil
	}
	for ni := x.eps[ep].head; ni != 0; ni = x.node(ni).next {
		out = append(out, x.entry(x.node(ni).entry).hash)
	}
	return out
}

// filled is an index of three endpoints after random conversations, and the chains inserted.
func filled(t *testing.T, seed uint64) (*Index, [][]uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	x := NewIndex(IndexConfig{DefaultCapacity: 300})
	var chains [][]uint64
	for i := range 400 {
		keys := []uint64{uint64(r.IntN(6))}
		for range r.IntN(12) {
			keys = append(keys, uint64(r.IntN(40)))
		}
		c := chain(keys...)
		chains = append(chains, c)
		x.Insert(r.IntN(3), c, int64(1000+10*i))
	}
	return x, chains
}

var names = []string{"a", "b", "c"}

func nameOf(ep int) string {
	if ep < len(names) {
		return names[ep]
	}
	return ""
}

// TestSnapshotRoundTrip: the importing index holds the same blocks per endpoint, in the same
// recency order, under its own IDs, and evicts as the original would.
func TestSnapshotRoundTrip(t *testing.T) {
	x, chains := filled(t, 1)
	var buf bytes.Buffer
	n, err := x.WriteSnapshot(&buf, nameOf, 5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	total, _ := x.Size()
	if n != total {
		t.Errorf("wrote %d entries of %d", n, total)
	}
	ids := map[string]int{"a": 2, "b": 0, "c": 1} // another replica's IDs
	y := NewIndex(IndexConfig{DefaultCapacity: 10})
	got, err := y.ReadSnapshot(bytes.NewReader(buf.Bytes()), func(name string) int { return ids[name] }, 9000, 0)
	if err != nil || got != total {
		t.Fatalf("read %d entries, err %v; want %d", got, err, total)
	}
	for ep, name := range names {
		if diff := cmp.Diff(lru(x, ep), lru(y, ids[name])); diff != "" {
			t.Errorf("endpoint %s: LRU order (-original +imported):\n%s", name, diff)
		}
		if y.Capacity(ids[name]) != 300 {
			t.Errorf("endpoint %s: capacity %d, want the original's 300", name, y.Capacity(ids[name]))
		}
	}
	perm := func(runs []int32) []int32 { return []int32{runs[ids["a"]], runs[ids["b"]], runs[ids["c"]]} }
	for _, c := range chains {
		if diff := cmp.Diff(match(x, 3, c), perm(match(y, 3, c))); diff != "" {
			t.Fatalf("match (-original +imported):\n%s", diff)
		}
	}
	// The same new traffic evicts the same entries.
	extra := chain(99, 98, 97, 96, 95, 94, 93, 92, 91, 90)
	for i := range 40 {
		x.Insert(0, extra[:1+i%10], int64(20000+i))
		y.Insert(ids["a"], extra[:1+i%10], int64(20000+i))
	}
	if diff := cmp.Diff(lru(x, 0), lru(y, ids["a"])); diff != "" {
		t.Errorf("after more traffic (-original +imported):\n%s", diff)
	}
}

// TestSnapshotNewestOnly: a bounded snapshot keeps the newest entries of all endpoints
// together, each endpoint's still a set of whole prefixes; unknown endpoints are skipped.
func TestSnapshotNewestOnly(t *testing.T) {
	x, chains := filled(t, 2)
	var buf bytes.Buffer
	if n, err := x.WriteSnapshot(&buf, nameOf, 5000, 100); err != nil || n != 100 {
		t.Fatalf("wrote %d, %v; want 100", n, err)
	}
	y := NewIndex(IndexConfig{DefaultCapacity: 1000})
	got, err := y.ReadSnapshot(&buf, func(name string) int {
		if name == "c" {
			return -1
		}
		return map[string]int{"a": 0, "b": 1}[name]
	}, 5000, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The newest 100 of x overall: the entries with the highest stamps.
	var all []int64
	for ep := range 3 {
		x.mu.RLock()
		for ni := x.eps[ep].head; ni != 0; ni = x.node(ni).next {
			all = append(all, x.node(ni).stamp)
		}
		x.mu.RUnlock()
	}
	slices.Sort(all)
	edge := all[len(all)-100] // the 100th highest stamp; entries of one insert share theirs
	kept := 0
	for ep := range 2 {
		l := lru(y, ep)
		kept += len(l)
		if want := lru(x, ep)[:len(l)]; !cmp.Equal(want, l) {
			t.Errorf("endpoint %d: kept %d entries that are not its newest", ep, len(l))
		}
		// Kept: every entry newer than the edge, and none older.
		above, atOrAbove := 0, 0
		x.mu.RLock()
		for ni := x.eps[ep].head; ni != 0; ni = x.node(ni).next {
			if s := x.node(ni).stamp; s > edge {
				above++
			} else if s == edge {
				atOrAbove++
			}
		}
		x.mu.RUnlock()
		if atOrAbove += above; len(l) < above || len(l) > atOrAbove {
			t.Errorf("endpoint %d: kept %d entries, want the %d to %d among the 100 newest of all endpoints", ep, len(l), above, atOrAbove)
		}
	}
	if kept != got || kept >= 100 || kept == 0 {
		t.Errorf("kept %d entries of a and b (read %d), want some of the 100", kept, got)
	}
	runs, lin := make([]int32, 2), make([]int32, 2)
	for _, c := range chains {
		y.Match(runs, c)
		y.MatchLinear(lin, c)
		if !cmp.Equal(runs, lin) {
			t.Fatalf("Match %v, MatchLinear %v: the imported entries are not whole prefixes", runs, lin)
		}
	}
}

// TestSnapshotBad: cut, wrong version, nonsense: an error naming a bad snapshot, never a
// panic, and what came before the fault stays.
func TestSnapshotBad(t *testing.T) {
	x, _ := filled(t, 3)
	var buf bytes.Buffer
	if _, err := x.WriteSnapshot(&buf, nameOf, 5000, 0); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	id := func(name string) int { return map[string]int{"a": 0, "b": 1, "c": 2}[name] }
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"cut in the header", good[:5]},
		{"cut in a chunk", good[:len(good)/2]},
		{"no end", good[:len(good)-1]},
		{"version 2", append([]byte{0x94, 0x02}, good[2:]...)},
		{"not msgpack", []byte("hello")},
	} {
		y := NewIndex(IndexConfig{})
		_, err := y.ReadSnapshot(bytes.NewReader(c.data), id, 5000, 0)
		if !errors.Is(err, ErrSnapshot) {
			t.Errorf("%s: err %v, want ErrSnapshot", c.name, err)
		}
	}
	y := NewIndex(IndexConfig{})
	if _, err := y.ReadSnapshot(bytes.NewReader(good), id, 5000, 10); !errors.Is(err, ErrSnapshot) {
		t.Errorf("over maxEntries: err %v", err)
	}
}

func FuzzReadSnapshot(f *testing.F) {
	x, _ := filled(&testing.T{}, 4)
	var buf bytes.Buffer
	if _, err := x.WriteSnapshot(&buf, nameOf, 5000, 50); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte{0x94, 0x01, 0x91, 0xa1, 'a', 0x91, 0x05, 0x01, 0x93, 0x00, 0x07, 0x01, 0x90})
	f.Fuzz(func(t *testing.T, data []byte) {
		y := NewIndex(IndexConfig{DefaultCapacity: 64, MaxEntries: 1000})
		n, _ := y.ReadSnapshot(bytes.NewReader(data), func(name string) int {
			if len(name) == 1 {
				return int(name[0] % 4)
			}
			return -1
		}, 1<<40, 10_000)
		if total, _ := y.Size(); total > 1000 || n < 0 {
			t.Fatalf("%d entries held, %d read", total, n)
		}
	})
}
