package endpoint

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ids(eps []*Endpoint) []int {
	out := []int{}
	for _, e := range eps {
		out = append(out, e.ID)
	}
	return out
}

func TestPool_UpdateDiffsByName(t *testing.T) {
	p := NewPool()
	changed := p.Changed()
	d, err := p.Update([]Spec{
		{Name: "http://b", Models: []string{"m1"}, Engine: "vllm"},
		{Name: "http://a", Models: []string{"m2"}, Engine: "vllm", CacheSalt: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Error("Changed channel not closed by Update")
	}
	if diff := cmp.Diff([]int{0, 1}, ids(d.Added)); diff != "" {
		t.Errorf("added IDs (-want +got):\n%s", diff)
	}
	a := p.ByName("http://a")
	b := p.ByName("http://b")
	if a == nil || b == nil || a.ID != 1 || b.ID != 0 {
		t.Fatalf("ByName: a=%v b=%v", a, b)
	}
	if !p.CacheSalt(a) || p.CacheSalt(b) {
		t.Errorf("cache salt: a=%v b=%v, want true false", p.CacheSalt(a), p.CacheSalt(b))
	}
	// engine auto: salted once the engine is found to be vLLM, not before, nor as another.
	q := NewPool()
	if _, err := q.Update([]Spec{{Name: "http://c", Engine: "auto", CacheSaltAuto: true}, {Name: "http://d", Engine: "auto", CacheSaltAuto: true}}); err != nil {
		t.Fatal(err)
	}
	c, e := q.ByName("http://c"), q.ByName("http://d")
	before := q.CacheSalt(c)
	// Until a check finds its kind, it is out of rotation: a tenant's request would go unsalted.
	if c.Healthy() || len(q.Candidates(nil, "", nil)) != 0 {
		t.Errorf("auto endpoint before detection: healthy %v, candidates %v; want out of rotation", c.Healthy(), q.Candidates(nil, "", nil))
	}
	c.SetKind("vllm")
	e.SetKind("sglang")
	if before || !q.CacheSalt(c) || q.CacheSalt(e) {
		t.Errorf("auto: before detection %v, as vllm %v, as sglang %v; want false true false", before, q.CacheSalt(c), q.CacheSalt(e))
	}
	a.Start(100) // load the router put on a must survive an unchanged update

	// Step 2: a unchanged, b's models change (new object), c added.
	d, err = p.Update([]Spec{
		{Name: "http://a", Models: []string{"m2"}, Engine: "vllm", CacheSalt: true},
		{Name: "http://b", Models: []string{"m1", "m3"}, Engine: "vllm"},
		{Name: "http://c", Engine: "sglang"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1}, ids(d.Kept)); diff != "" {
		t.Errorf("kept (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{2, 3}, ids(d.Added)); diff != "" {
		t.Errorf("added (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0}, ids(d.Removed)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	if p.ByName("http://a") != a || a.InFlight() != 1 || a.PendingPrefill() != 100 {
		t.Errorf("a lost its object or counters: in-flight %d pending %d", a.InFlight(), a.PendingPrefill())
	}
	if b.Available() || !b.Draining() || a.Draining() {
		t.Errorf("old b should be draining and a not: b available %v, draining %v; a draining %v", b.Available(), b.Draining(), a.Draining())
	}
	if diff := cmp.Diff([]int{1, 2, 3}, ids(p.All())); diff != "" {
		t.Errorf("All (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"m1", "m2", "m3"}, p.Models()); diff != "" {
		t.Errorf("Models (-want +got):\n%s", diff)
	}
	if !p.HasModel("m2") || p.HasModel("m4") || p.HasModel("") {
		t.Errorf("HasModel: m2 %v, m4 %v, empty %v; want true, false, false", p.HasModel("m2"), p.HasModel("m4"), p.HasModel(""))
	}

	// Step 3: remove everything, then bring a back: a fresh ID, never a reused one.
	d, err = p.Update(nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1, 2, 3}, ids(d.Removed)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	d, _ = p.Update([]Spec{{Name: "http://a", Models: []string{"m2"}, Engine: "vllm", CacheSalt: true}})
	if diff := cmp.Diff([]int{4}, ids(d.Added)); diff != "" {
		t.Errorf("re-added (-want +got):\n%s", diff)
	}
	if _, ok := p.Spec(a); ok {
		t.Error("Spec of a removed object should report false")
	}
}

func TestPool_UpdateRejectsBadSpecs(t *testing.T) {
	p := NewPool()
	if _, err := p.Update([]Spec{{Name: "x"}}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Update([]Spec{{Name: "y"}, {Name: ""}, {Name: "y"}})
	if err == nil {
		t.Fatal("want an error")
	}
	if p.Len() != 1 || p.ByName("x") == nil {
		t.Errorf("a rejected update changed the pool: %v", ids(p.All()))
	}
}

func TestPool_Candidates(t *testing.T) {
	p := NewPool()
	_, err := p.Update([]Spec{
		{Name: "e0", Models: []string{"m"}, Labels: map[string]string{"pool": "gold"}},
		{Name: "e1", Models: []string{"m"}},
		{Name: "e2"}, // any model
		{Name: "e3", Models: []string{"other"}},
		{Name: "e4", Models: []string{"m"}, Labels: map[string]string{"pool": "gold", "gpu": "h200"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.ByName("e1").SetHealthy(false)
	dst := make([]*Endpoint, 0, 8)
	tests := []struct {
		model  string
		labels map[string]string
		want   []int
	}{
		{"m", nil, []int{0, 2, 4}},
		{"other", nil, []int{2, 3}},
		{"m", map[string]string{"pool": "gold"}, []int{0, 4}},
		{"m", map[string]string{"pool": "gold", "gpu": "h200"}, []int{4}},
		{"m", map[string]string{"pool": "silver"}, []int{}},
	}
	for _, tc := range tests {
		got := p.Candidates(dst, tc.model, tc.labels)
		if diff := cmp.Diff(tc.want, ids(got)); diff != "" {
			t.Errorf("Candidates(%q, %v) (-want +got):\n%s", tc.model, tc.labels, diff)
		}
	}
	allocs := testing.AllocsPerRun(100, func() { dst = p.Candidates(dst, "m", map[string]string{"pool": "gold"}) })
	if allocs != 0 {
		t.Errorf("Candidates allocates %v times per call, want 0", allocs)
	}
}

func TestPool_ConcurrentReadsAndUpdates(t *testing.T) {
	p := NewPool()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			dst := make([]*Endpoint, 0, 16)
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, e := range p.Candidates(dst, "m", nil) {
					if !e.Serves("m") {
						t.Errorf("candidate %s does not serve m", e.Name)
						return
					}
				}
			}
		})
	}
	for i := range 200 {
		specs := make([]Spec, 1+i%5)
		for j := range specs {
			specs[j] = Spec{Name: fmt.Sprintf("e%d", (i+j)%7), Models: []string{"m"}}
		}
		if _, err := p.Update(specs); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkPool_Candidates(b *testing.B) {
	p := NewPool()
	specs := make([]Spec, 64)
	for i := range specs {
		specs[i] = Spec{Name: fmt.Sprintf("http://10.0.0.%d:8000", i), Models: []string{"m"}}
	}
	if _, err := p.Update(specs); err != nil {
		b.Fatal(err)
	}
	dst := make([]*Endpoint, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = p.Candidates(dst, "m", nil)
	}
}

// closed reports whether ch is closed (a nil channel is not).
func closed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestPool_FirstCheck, step by step: an engine auto endpoint without cache_salt is out of
// rotation until its first health check, and says so (FirstCheck); the pool finds it for the
// models and labels it would serve. The first check recorded ends the wait, whether it passed
// or not; an endpoint of a named kind, or one that left the pool, has nothing to wait for.
func TestPool_FirstCheck(t *testing.T) {
	p := NewPool()
	if _, err := p.Update([]Spec{
		{Name: "http://auto", Models: []string{"m"}, Labels: map[string]string{"pool": "a"}, Engine: "auto", CacheSaltAuto: true},
		{Name: "http://vllm", Models: []string{"m"}, Engine: "vllm", CacheSalt: true},
	}); err != nil {
		t.Fatal(err)
	}
	auto, named := p.ByName("http://auto"), p.ByName("http://vllm")
	wait := auto.FirstCheck()
	if wait == nil || closed(wait) || auto.Available() {
		t.Fatalf("auto endpoint: waits %v, closed %v, available %v; want a first check awaited, out of rotation", wait != nil, closed(wait), auto.Available())
	}
	if named.FirstCheck() != nil || !named.Available() {
		t.Errorf("vllm endpoint: waits %v, available %v; want nothing awaited, in rotation", named.FirstCheck() != nil, named.Available())
	}
	for _, tc := range []struct {
		model  string
		labels map[string]string
		want   bool
	}{
		{"m", nil, true},
		{"m", map[string]string{"pool": "a"}, true},
		{"m", map[string]string{"pool": "b"}, false}, // not its labels
		{"other", nil, false},                        // not its model
	} {
		if got := p.FirstCheck(tc.model, tc.labels) == wait; got != tc.want {
			t.Errorf("Pool.FirstCheck(%q, %v) is the auto endpoint's: %v, want %v", tc.model, tc.labels, got, tc.want)
		}
	}

	// Its first check fails: the wait ends, out of rotation still; a second check closes nothing twice.
	auto.SetHealthy(false)
	if !closed(wait) || auto.FirstCheck() != nil || p.FirstCheck("m", nil) != nil || auto.Available() {
		t.Errorf("after a failed first check: closed %v, FirstCheck %v, Pool.FirstCheck %v, available %v; want true, nil, nil, false",
			closed(wait), auto.FirstCheck(), p.FirstCheck("m", nil), auto.Available())
	}
	auto.SetHealthy(true)
	if !auto.Available() {
		t.Error("after a check that passed: out of rotation")
	}

	// A new auto endpoint that leaves the pool before its first check is not waited for.
	if _, err := p.Update([]Spec{{Name: "http://auto2", Models: []string{"m"}, Engine: "auto", CacheSaltAuto: true}}); err != nil {
		t.Fatal(err)
	}
	gone := p.ByName("http://auto2")
	if p.FirstCheck("m", nil) == nil {
		t.Fatal("the new auto endpoint is not awaited")
	}
	if _, err := p.Update(nil); err != nil {
		t.Fatal(err)
	}
	if p.FirstCheck("m", nil) != nil || gone.FirstCheck() == nil {
		t.Errorf("after it left: Pool.FirstCheck %v (want nil), its own FirstCheck %v (want still awaited)", p.FirstCheck("m", nil), gone.FirstCheck())
	}
}
