package des

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/route"
)

// ReplicaSync is how router replicas share what their lifecycles do (Config.ReplicaSync):
// each replica's events (an attempt routed, its first token, its end) reach every other
// replica Delay later, through route.Lifecycle.Apply as the live transport delivers them, so
// that every replica's policy learns the whole fleet's traffic. The zero value is off: each
// replica knows only what it routed.
type ReplicaSync struct {
	// On turns sharing on.
	On bool
	// Delay is the time from an event at one replica to its replay at another.
	Delay time.Duration
	// Loss is the probability that an event does not reach one replica, drawn for each event
	// and receiver alike (a lost end leaves the attempt in flight there until route's TTL).
	Loss float64
	// Batch, when above 0, sends each replica's events in batches as the live transport does
	// (peers.batch_interval): a batch opens at the first event after the last one left and
	// leaves Batch later with every event since, each then Delay on its way (the transit).
	// The policy is told Batch as the lag, as the live transport tells it its interval. At 0
	// every event leaves on its own, Delay after it happened.
	Batch time.Duration
}

// String returns the setting as ParseReplicaSync reads it.
func (r ReplicaSync) String() string {
	if !r.On {
		return "off"
	}
	s := r.Delay.String()
	if r.Batch > 0 {
		s += fmt.Sprintf(", batches of %v", r.Batch)
	}
	if r.Loss > 0 {
		s += fmt.Sprintf(", loss %g", r.Loss)
	}
	return s
}

// ParseReplicaSync reads a --replica-sync value, "off" or a delay such as 1ms, a loss
// probability and a batch interval (0: none).
func ParseReplicaSync(delay string, loss float64, batch time.Duration) (ReplicaSync, error) {
	var errs []string
	rs := ReplicaSync{Loss: loss, Batch: batch}
	if d := strings.TrimSpace(delay); d != "off" && d != "" {
		v, err := time.ParseDuration(d)
		if err != nil || v < 0 {
			errs = append(errs, fmt.Sprintf("--replica-sync %q: want off or a delay such as 1ms or 50ms", delay))
		}
		rs.On, rs.Delay = true, v
	}
	if loss < 0 || loss >= 1 {
		errs = append(errs, fmt.Sprintf("--replica-sync-loss %g: want a probability from 0 to below 1", loss))
	} else if loss > 0 && !rs.On {
		errs = append(errs, "--replica-sync-loss needs --replica-sync DELAY")
	}
	if batch < 0 || batch > time.Second {
		errs = append(errs, fmt.Sprintf("--replica-sync-batch %v: want 0 (each event on its own) or an interval up to 1s, such as 10ms", batch))
	} else if batch > 0 && !rs.On {
		errs = append(errs, "--replica-sync-batch needs --replica-sync DELAY (the transit after a batch leaves, such as 0s or 1ms)")
	}
	if len(errs) > 0 {
		return ReplicaSync{}, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return rs, nil
}

func (r ReplicaSync) check() error {
	if r.Delay < 0 || r.Loss < 0 || r.Loss >= 1 || r.Batch < 0 {
		return fmt.Errorf("replica sync: delay %v, loss %g, batch %v: want a delay and batch >= 0 and a loss in [0, 1)", r.Delay, r.Loss, r.Batch)
	}
	return nil
}

// syncState is the simulation's side of replica sync: the events on their way.
type syncState struct {
	rand    *rand.Rand
	pending []delivery      // indexed by the evSync event's req
	free    []int32         // free slots of pending
	leaves  []time.Duration // per replica, when its open batch leaves (ReplicaSync.Batch)
}

// delivery is one event on its way to one replica.
type delivery struct {
	to int
	ev route.Event
}

// share returns replica k's route.Share, or nil when replicas share nothing.
func (s *sim) share(k int) *route.Share {
	if !s.cfg.ReplicaSync.On || len(s.routers) < 2 {
		return nil
	}
	if s.sync.rand == nil {
		s.sync.rand = rand.New(rand.NewPCG(s.cfg.Seed, 0x73796e63))
	}
	byName := map[string]*endpoint.Endpoint{}
	sh := route.NewShare(route.ShareConfig{
		Self:  uint64(k) + 1,
		Out:   &syncOut{s: s, from: k},
		Clock: &s.clock,
		Endpoint: func(name string) *endpoint.Endpoint {
			if len(byName) == 0 {
				for _, e := range s.routers[k].eps {
					byName[e.Name] = e
				}
			}
			return byName[name]
		},
	})
	// As a live replica's transport does: every replica hears of the others Delay late, or
	// is told the batch interval when events go in batches.
	lag := s.cfg.ReplicaSync.Delay
	if s.cfg.ReplicaSync.Batch > 0 {
		lag = s.cfg.ReplicaSync.Batch
	}
	sh.SetReplicas(len(s.routers), k, lag)
	return sh
}

// syncOut sends replica from's events to the others, each after the delay unless lost. The
// events' blocks are the workload's, which no run changes: they are kept without a copy.
type syncOut struct {
	s    *sim
	from int
}

func (o *syncOut) Publish(ev *route.Event) {
	s := o.s
	at := s.clock.now
	if b := s.cfg.ReplicaSync.Batch; b > 0 {
		if s.sync.leaves == nil {
			s.sync.leaves = make([]time.Duration, len(s.routers))
		}
		if at >= s.sync.leaves[o.from] {
			s.sync.leaves[o.from] = at + b // the first event of a new batch
		}
		at = s.sync.leaves[o.from]
	}
	at += s.cfg.ReplicaSync.Delay
	for to := range s.routers {
		if to == o.from || (s.cfg.ReplicaSync.Loss > 0 && s.sync.rand.Float64() < s.cfg.ReplicaSync.Loss) {
			continue
		}
		d := delivery{to: to, ev: *ev}
		d.ev.Origin = uint64(o.from) + 1
		var slot int32
		if n := len(s.sync.free); n > 0 {
			slot = s.sync.free[n-1]
			s.sync.free = s.sync.free[:n-1]
			s.sync.pending[slot] = d
		} else {
			slot = int32(len(s.sync.pending))
			s.sync.pending = append(s.sync.pending, d)
		}
		s.push(event{at: at, kind: evSync, req: slot})
	}
}

// deliver replays an event on the replica it was sent to.
func (s *sim) deliver(slot int32) {
	d := &s.sync.pending[slot]
	s.routers[d.to].lc.Apply(&d.ev)
	*d = delivery{}
	s.sync.free = append(s.sync.free, slot)
}
