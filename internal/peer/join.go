package peer

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Joining the addresses the sources give. memberlist's Join tries its addresses one after the
// other, each for up to its TCP timeout (2 s), and takes no context: an address that accepts
// connections and never answers (a stale pod IP, a frozen process, a Service that publishes
// addresses not ready) held up every address after it, at every round, and stopping the node
// waited for all of them (15 such addresses before a live one: joined after 30 s, and Run
// returned 29.5 s after its context ended). Here each address is joined on its own, a bounded
// number at a time; a round waits for its joins a bounded time, and not at all once the node
// stops (memberlist's shutdown then ends the joins in flight, and Run waits for them); an
// address that failed is tried again only after a back-off.

const (
	// joinConcurrency bounds the joins in flight, all rounds together: a live address listed
	// after k dead ones is joined within about k/joinConcurrency TCP timeouts, the first time.
	joinConcurrency = 16
	// joinRoundWait bounds a round's wait for its joins: the rejoin loop also announces this
	// replica once a second while peers place its name elsewhere (Node.reclaimName). A join
	// still in flight then goes on; the rounds after skip its address until it ends.
	joinRoundWait = 3 * time.Second
	// joinBackoffMin and joinBackoffMax bound the wait before an address whose join failed is
	// tried again; it doubles at each failure in a row. The most is the default rejoin
	// interval: a peer cut off for longer than its failure detection is joined again by these
	// tries when the partition ends, so a longer wait would be that much longer a split (a
	// dead address costs a socket a try, in flight at most a TCP timeout, and the rounds skip
	// it meanwhile).
	joinBackoffMin = 2 * time.Second
	joinBackoffMax = 10 * time.Second
)

// joiner is the node's account of its joins: a slot per join in flight, and the addresses in
// flight or whose last join failed.
type joiner struct {
	slots chan struct{}

	mu    sync.Mutex
	addrs map[string]*joinState
}

type joinState struct {
	busy  bool      // a join is in flight
	fails int       // failures in a row
	retry time.Time // not tried again before
}

func newJoiner() *joiner {
	return &joiner{slots: make(chan struct{}, joinConcurrency), addrs: map[string]*joinState{}}
}

// joinBackoff is the wait after the fails-th failure in a row.
func joinBackoff(fails int) time.Duration {
	d := joinBackoffMin
	for i := 1; i < fails && d < joinBackoffMax; i++ {
		d *= 2
	}
	return min(d, joinBackoffMax)
}

// due says whether addr may be tried at now: not in flight, and past its back-off.
func (j *joiner) due(addr string, now time.Time) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.addrs[addr]
	return st == nil || !st.busy && !now.Before(st.retry)
}

// begin marks addr in flight.
func (j *joiner) begin(addr string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	st := j.addrs[addr]
	if st == nil {
		st = &joinState{}
		j.addrs[addr] = st
	}
	st.busy = true
}

// end records how addr's join, ended at now, went: an address joined is forgotten, one that
// failed waits for its back-off.
func (j *joiner) end(addr string, err error, now time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err == nil {
		delete(j.addrs, addr)
		return
	}
	st := j.addrs[addr]
	if st == nil {
		st = &joinState{}
		j.addrs[addr] = st
	}
	st.busy = false
	st.fails++
	st.retry = now.Add(joinBackoff(st.fails))
}

// forget drops the failures of the addresses keep refuses (no source lists them any more, or
// they are members); those in flight are kept until their join ends.
func (j *joiner) forget(keep func(addr string) bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for a, st := range j.addrs {
		if !st.busy && !keep(a) {
			delete(j.addrs, a)
		}
	}
}

// reset forgets every failure: new secrets, and the addresses that refused this replica's
// gossip may take it now.
func (j *joiner) reset() {
	j.forget(func(string) bool { return false })
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, st := range j.addrs {
		st.fails = 0
	}
}

// joinRound joins those of addrs that are due, joinConcurrency at a time with the joins of
// earlier rounds still in flight, and returns how many it joined and the errors of those that
// failed. It returns once every join it started has ended, joinRoundWait after its start or
// when ctx ends, whichever comes first. A join still in flight then goes on, bounded by
// memberlist's TCP timeouts, and records its result; only the node's stop waits for it, once
// memberlist's shutdown has ended it (Node.exchanges). After ctx has ended it touches only
// memberlist (shutting down: a late join changes nothing anyone reads), the copy of the members
// and the joiner, which are safe to use at any time.
func (n *Node) joinRound(ctx context.Context, addrs []string) (int, []error) {
	ml := n.ml.Load()
	j := n.joins
	rctx, cancel := context.WithTimeout(ctx, joinRoundWait)
	defer cancel()
	// Room for every join started: one that ends after the round never blocks.
	results := make(chan error, len(addrs))
	started := 0
	for _, a := range addrs {
		if rctx.Err() != nil {
			break
		}
		if !j.due(a, time.Now()) {
			continue
		}
		select {
		case j.slots <- struct{}{}:
		case <-rctx.Done():
			continue
		}
		j.begin(a)
		started++
		n.exchanges.Go(func() {
			adv := n.advertised.Load()
			k, err := ml.Join([]string{a})
			if err == nil && k == 0 {
				err = errors.New("no address to join")
			}
			if err == nil && n.advertised.Load() != adv {
				// This replica's policy changed while the join was in flight: the state it
				// sent may predate it, and the update's gossip may be lost (advertise).
				n.advertiseAgain()
			}
			j.end(a, err, time.Now())
			<-j.slots
			if err != nil {
				n.log.Debug("joining a peer", "addr", a, "err", err)
			}
			results <- err
		})
	}
	joined := 0
	var errs []error
	for range started {
		select {
		case err := <-results:
			if err != nil {
				errs = append(errs, err)
			} else {
				joined++
			}
		case <-rctx.Done():
			return joined, errs
		}
	}
	return joined, errs
}

// sourceAddrs asks every source for addresses, and returns them, each once, and whether every
// source answered. A source that fails is counted (kvroute_peer_source_errors_total) at each
// failure, and logged as a warning at the first of a run of them; its next answer is logged.
// Only the rejoin loop calls it.
func (n *Node) sourceAddrs(ctx context.Context) (addrs []string, complete bool) {
	complete = true
	seen := map[string]bool{}
	for i, s := range n.cfg.Sources {
		got, err := s.Addrs(ctx)
		switch {
		case err != nil && (errors.Is(err, errWatchStarting) || ctx.Err() != nil):
			n.log.Debug("peer source not ready", "source", s.String(), "err", err)
			complete = false
			continue
		case err != nil:
			complete = false
			n.m.SourceErrors.WithLabelValues(sourceKind(s)).Inc()
			if !n.sourceFailing[i] {
				n.sourceFailing[i] = true
				n.log.Warn("peer source failed: the replicas it lists are not joined until it answers, the members known stay (logged again only after it has answered)",
					"source", s.String(), "err", err)
			}
			continue
		case n.sourceFailing[i]:
			n.sourceFailing[i] = false
			n.log.Info("peer source answers again", "source", s.String(), "addrs", got)
		}
		for _, a := range got {
			if !seen[a] {
				seen[a] = true
				addrs = append(addrs, a)
			}
		}
	}
	return addrs, complete
}

// sourceKind is a source's label in kvroute_peer_source_errors_total.
func sourceKind(s Source) string {
	switch s.(type) {
	case DNS, *DNS:
		return "dns"
	case *Kube:
		return "kubernetes"
	case Static:
		return "static"
	}
	return "other"
}
