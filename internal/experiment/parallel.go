package experiment

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/des"
)

// slots bounds the simulations that run at once: one per CPU, since each is one goroutine busy
// from start to end.
type slots chan struct{}

func newSlots() slots { return make(slots, max(1, runtime.GOMAXPROCS(0))) }

// run simulates p on the fleet in virtual time once a slot is free; wall is the time the run
// itself took, not counting the wait.
func (s slots) run(ctx context.Context, fleet des.Config, w *des.Workload, p Policy) (res *des.Result, wall time.Duration, err error) {
	select {
	case s <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	defer func() { <-s }()
	start := time.Now()
	res, err = des.Run(ctx, fleet, w, p.Label, des.Named(p.Name, p.Params))
	return res, time.Since(start), err
}

// forEach calls job(ctx, i) for every i in [0, n), all at once, and waits for them. The first
// failure cancels the others' ctx; forEach returns the failure of the lowest i, leaving out the
// cancellations it caused. When ctx ends first it returns "<what> interrupted" and ctx's error.
func forEach(ctx context.Context, n int, what string, job func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := job(ctx, i); err != nil {
				errs[i] = err
				cancel()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s interrupted: %w", what, err)
	}
	return nil
}
