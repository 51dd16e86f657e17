package experiment

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/engine"
)

// TestForEach_FirstFailureCancelsTheRest: job 3 fails; the others, blocked until cancelled,
// end with ctx's error, which is left out; job 3's failure is what forEach returns.
func TestForEach_FirstFailureCancelsTheRest(t *testing.T) {
	boom := errors.New("boom")
	var ran atomic.Int32
	err := forEach(context.Background(), 6, "test", func(ctx context.Context, i int) error {
		ran.Add(1)
		if i == 3 {
			return boom
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, boom) {
		t.Errorf("err %v, want boom", err)
	}
	if ran.Load() != 6 {
		t.Errorf("%d jobs ran, want all 6", ran.Load())
	}
}

// TestForEach_LowestIndexWins: of two failures, that of the lowest index is returned.
func TestForEach_LowestIndexWins(t *testing.T) {
	first, second := errors.New("first"), errors.New("second")
	release := make(chan struct{})
	err := forEach(context.Background(), 2, "test", func(ctx context.Context, i int) error {
		if i == 1 {
			defer close(release)
			return second
		}
		<-release // job 1 fails first in time
		return first
	})
	if !errors.Is(err, first) {
		t.Errorf("err %v, want job 0's", err)
	}
}

func TestForEach_Interrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	err := forEach(ctx, 3, "simulation", func(ctx context.Context, i int) error {
		if i == 0 {
			cancel()
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "simulation interrupted: ") {
		t.Errorf("err %v, want simulation interrupted", err)
	}
	if err := forEach(context.Background(), 4, "test", func(context.Context, int) error { return nil }); err != nil {
		t.Errorf("all succeed: err %v", err)
	}
}

// TestSlots: no more simulations run at once than there are CPUs, and one that waits for a
// slot gives up when ctx ends.
func TestSlots(t *testing.T) {
	s := newSlots()
	if cap(s) != max(1, runtime.GOMAXPROCS(0)) {
		t.Errorf("%d slots, want one per CPU (%d)", cap(s), runtime.GOMAXPROCS(0))
	}
	for range cap(s) {
		s <- struct{}{} // every slot taken
	}
	fleet, w, p := tinySimulation(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, _, err := s.run(ctx, fleet, w, p); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("no free slot: err %v, want ctx's", err)
	}
	<-s
	res, wall, err := s.run(context.Background(), fleet, w, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 8 || res.Records[0].Policy != "round-robin" || wall <= 0 {
		t.Errorf("a free slot: %d records of %q, wall %v; want 8 of round-robin", len(res.Records), res.Records[0].Policy, wall)
	}
	if len(s) != cap(s)-1 {
		t.Errorf("%d slots taken after the run, want the slot given back", len(s))
	}
}

// tinySimulation is 8 requests of a generated workload on 2 engines, with round-robin.
func tinySimulation(t *testing.T) (des.Config, *des.Workload, Policy) {
	t.Helper()
	reqs, _, err := loadRequests("", "prefix-repetition:n=8", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("llama3-8b-h100-tp1")
	if err != nil {
		t.Fatal(err)
	}
	fleet := des.ProfileFleet(prof, 2)
	return fleet, des.Prepare(reqs, fleet.Model, fleet.BlockSize), Policy{Label: "round-robin", Name: "round-robin"}
}

// TestPoll: poll asks at once, then on every tick, and stops at the deadline or when ctx ends.
func TestPoll(t *testing.T) {
	calls := 0
	if err := poll(context.Background(), time.Millisecond, 10*time.Second, func(context.Context) bool { calls++; return calls == 3 }); err != nil || calls != 3 {
		t.Errorf("done on the third call: err %v after %d calls", err, calls)
	}
	calls = 0
	if err := poll(context.Background(), time.Millisecond, 0, func(context.Context) bool { calls++; return false }); !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Errorf("no time: err %v after %d calls, want the deadline after one call", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	err := poll(ctx, time.Millisecond, 10*time.Second, func(context.Context) bool { cancel(); return false })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err %v", err)
	}
}
