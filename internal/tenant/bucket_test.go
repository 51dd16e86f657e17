package tenant

import (
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBucket(60, t0) // one per second, 60 at most
	if ok, _ := b.take(t0, 60); !ok {
		t.Fatal("a full bucket refused its whole capacity")
	}
	ok, wait := b.take(t0, 2)
	if ok || wait != 2*time.Second {
		t.Fatalf("empty bucket: take(2) = %v, %v; want false, 2s", ok, wait)
	}
	if n, reset := b.remaining(t0); n != 0 || reset != time.Minute {
		t.Errorf("remaining = %d, reset %v; want 0, 1m0s", n, reset)
	}
	t1 := t0.Add(2500 * time.Millisecond)
	if ok, _ := b.take(t1, 2); !ok {
		t.Fatal("after 2.5s two units should be there")
	}
	if n, _ := b.remaining(t1); n != 0 {
		t.Errorf("remaining after the take = %d, want 0 (0.5 left)", n)
	}
	// Settlement beyond the estimate leaves a debt that delays the next request.
	b.adjust(t1, -10)
	if ok, wait := b.take(t1, 0); ok || wait != 9500*time.Millisecond {
		t.Errorf("in debt: take(0) = %v, %v; want false, 9.5s", ok, wait)
	}
	// A refund never fills beyond the limit.
	b.adjust(t1, 1000)
	if n, reset := b.remaining(t1); n != 60 || reset != 0 {
		t.Errorf("after a large refund: %d, reset %v; want 60, 0", n, reset)
	}
	// Time running backwards (a clock step) neither adds nor removes units.
	if n, _ := b.remaining(t0); n != 60 {
		t.Errorf("earlier time: %d, want 60", n)
	}
}

func TestBucketUnlimitedAndReload(t *testing.T) {
	t0 := time.Unix(0, 0)
	u := newBucket(0, t0)
	if ok, _ := u.take(t0, 1e12); !ok {
		t.Error("an unlimited bucket refused")
	}
	b := newBucket(100, t0)
	b.take(t0, 50)
	b.setLimit(t0, 200) // half used stays half used
	if n, _ := b.remaining(t0); n != 100 {
		t.Errorf("after raising the limit: %d, want 100", n)
	}
	b.setLimit(t0, 0)
	if !b.unlimited() {
		t.Error("limit 0 should be unlimited")
	}
	b.setLimit(t0, 10)
	if n, _ := b.remaining(t0); n != 10 {
		t.Errorf("from unlimited to 10: %d, want a full bucket of 10", n)
	}
}
