package policy

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Router replicas that hear of each other's placements late (SetReplicas).
//
// Replicas that share their events see the same fleet, a sync delay behind. Requests that
// arrive together (a trace's timestamps are often quantised: ten at one instant) are split
// among the replicas, and each places its share knowing nothing of the others' shares: with
// the same picture, they all pick the same apparent best endpoint and herd there, the classic
// failure of load balancing on stale information (Mitzenmacher, "How useful is old
// information?", 2000). Worst is a short request sent, at the same instant, to the endpoint
// where a peer is sending a long new prefill: it waits seconds behind it. prefix-aware answers
// with three things, all off with one replica or with a delay of zero:
//
//   - a request larger than the fleet's recent mean is held a few sync delays (Defer), so
//     that it is placed knowing what the peers placed at its instant, short ones first, and
//     the replicas take turns with their long ones of one size, a delay apart.
//   - each replica takes its own place in the order one router would have filled the fleet:
//     the n replicas' simultaneous requests, taken as like this one, go one after the other
//     where each costs least with the ones before it counted, and the replica of rank r takes
//     the r-th of those places (spread). A request whose prefix one endpoint holds costs little
//     there, so all n places are that endpoint and it stays there.
//   - the requests the peers are placing unseen at this moment are counted where they
//     probably go, in proportion to where the fleet's recent requests went: half of them wait
//     for this request's work, this request waits for half of theirs (paUnseen.delay). That
//     keeps a long prefill off an endpoint that many short requests are heading for.
//
// How many the peers place unseen is measured: this replica's own placements come in clumps
// (each less than the sync delay after the one before), and a balancer that gives every
// replica its share of the same arrivals gives each peer a clump as large at the same time.

// placedWindow is the time constant, in seconds, of the placement rates that say where the
// peers' unseen requests probably go: long enough to span many bursts, short enough to follow
// where conversations live now (the affinity window's default).
const placedWindow = 60.0

// paReplicas is what prefix-aware knows of the replicas it places alongside.
type paReplicas struct {
	peers atomic.Int32 // the other replicas while they hear of placements late, else 0
	rank  atomic.Int32 // this replica's place among them, 0 to n-1
	lag   atomic.Int64 // how late a placement reaches the others, nanoseconds

	placed     decayed // requests routed by any replica, per second over placedWindow
	placedWork decayed // their uncached work, token-equivalents per second

	held      sync.Map     // *Request -> int64: held to its turn (Defer) -> that turn, unix nanoseconds
	heldSwept atomic.Int64 // when held was last swept of requests never placed, unix nanoseconds

	mu        sync.Mutex
	clumpLast int64   // the last own placement, unix nanoseconds
	clumpN    int     // own placements in the clump that clumpLast ends
	clumpMean float64 // the size of the clump an own placement belongs to, averaged; 0: none yet (1)
}

// SetReplicas tells the policy that it is one of n router replicas (itself included), of rank
// rank among them (0 to n-1, each a different one: the live transport orders its members by
// name), each hearing of the others' placements lag late (policy.Replicated). One replica
// (n <= 1), or lag 0 (each hears of the others before it places again), changes nothing.
func (pa *prefixAware) SetReplicas(n, rank int, lag time.Duration) {
	r := &pa.replicas
	peers := 0
	if lag > 0 && n > 1 {
		peers = min(n-1, math.MaxInt32-1)
	}
	r.lag.Store(int64(lag))
	r.rank.Store(int32(min(max(rank, 0), math.MaxInt32)))
	r.peers.Store(int32(peers))
}

// routed counts a request routed to s at now by this replica or, replayed, by another one.
func (r *paReplicas) routed(s *paState, req *Request, work, now int64) {
	r.held.Delete(req)
	if r.peers.Load() == 0 {
		return
	}
	s.placedWork.add(float64(work), now, placedWindow)
	s.placedN.add(1, now, placedWindow)
	r.placed.add(1, now, placedWindow)
	r.placedWork.add(float64(work), now, placedWindow)
	if req.Remote {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.clumpN > 0 && now-r.clumpLast < r.lag.Load() {
		r.clumpN++
	} else {
		if c := float64(r.clumpN); c > 0 {
			// Averaged per placement, a clump of c counting c times, from 1 (no clumps).
			r.clumpMean = max(r.clumpMean, 1)
			r.clumpMean += (1 - math.Pow(1-learnWeight, c)) * (c - r.clumpMean)
		}
		r.clumpN = 1
	}
	r.clumpLast = now
}

// Defer holds a request larger than the fleet's recent mean (policy.Deferrer) until its turn
// in the order one router would have placed a burst, long prefills after short ones: its
// size level is one for each doubling of its uncached work over the mean, the first
// included, and within a level the n replicas take turns by rank, a sync delay apart, since a
// placement reaches the others one delay later. It is held ((level-1) x n + rank + 1) delays,
// and always less than its own prefill takes. Such a request costs an unseen peer request
// that lands with it more than that one costs it (the one behind waits for the one ahead).
// Held, it is placed once this replica has heard of what the peers placed at the moment it
// arrived, of the smaller ones held with it and of the ones of its size held by the replicas
// of lower rank: the way one router that saw a burst whole would have it, short prefills not
// queued behind long ones, and two long ones not placed blind to each other (at one slot per
// size level, as before, the replicas' long requests of one level met at the same instant).
// One replica holds a request only for the step it would share with the tail of a queue
// (stepHold); replicas with a delay of 0 hold nothing.
func (pa *prefixAware) Defer(req *Request, c []*endpoint.Endpoint) time.Duration {
	r := &pa.replicas
	if r.peers.Load() == 0 {
		return pa.stepHold(req, c) // one router
	}
	lag := time.Duration(r.lag.Load())
	if lag <= 0 || len(c) == 0 {
		return 0
	}
	now := pa.clock.Now().UnixNano()
	n := r.placed.get(now, placedWindow)
	if n <= 0 {
		return 0 // nothing routed yet: no mean to compare with
	}
	mean := r.placedWork.get(now, placedWindow) / n
	if float64(pa.work(req, 0)) <= mean {
		return 0 // not larger than the mean even with nothing cached (work falls as cached rises): no index match
	}
	sc := pa.getScratch(c)
	defer pa.scratch.Put(sc)
	pa.index.MatchAmong(sc.runs, sc.ids, req.Blocks)
	best := 0
	for i := range c {
		if !sc.states[i].blind.Load() {
			best = max(best, int(sc.runs[i]))
		}
	}
	own := float64(pa.work(req, cachedTokens(req, best))) // where its prefix is
	if own <= mean {
		return 0
	}
	levels := math.Floor(math.Log2(own/mean)) + 1
	replicas := float64(r.peers.Load()) + 1
	slots := (levels-1)*replicas + float64(r.rank.Load()) + 1
	slots = min(slots, math.Ceil(own/prefillRate*pa.fleet.get()/lag.Seconds())-1)
	if slots < 1 {
		return 0
	}
	d := time.Duration(slots) * lag
	r.hold(req, now, now+int64(d))
	return d
}

// heldForget is how long after its turn a held request that was never placed is forgotten:
// its client left while it was held (a live replica), so no pick will ask for it. Any
// request still wanted is placed at its turn, a scheduling delay late at most.
const heldForget = int64(time.Minute)

// hold notes that req is held to its turn at `turn`, forgetting, at most once a heldForget,
// the held requests whose turn is that long past.
func (r *paReplicas) hold(req *Request, now, turn int64) {
	r.held.Store(req, turn)
	if last := r.heldSwept.Load(); now-last > heldForget && r.heldSwept.CompareAndSwap(last, now) {
		r.held.Range(func(k, v any) bool {
			if now-v.(int64) > heldForget {
				r.held.Delete(k)
			}
			return true
		})
	}
}

// paUnseen is what one placement assumes of the peers' unseen requests.
type paUnseen struct {
	peers, rank int
	count       float64 // requests the peers are placing at this moment, unseen
	placed      float64 // the fleet's recent requests, per second
}

// unseen returns the peers' unseen placements at now for req; peers is 0 when there are
// none. A request held to its turn (Defer) has none: at its turn the peers have placed the
// burst's smaller requests, and their long ones of its size at the turns of lower ranks, a
// sync delay or more before, so this replica knows of them; the higher ranks place theirs
// later, knowing of this one. Counting unseen peers then, or taking a rank's place apart
// from them, would only send it away from where one router would put it.
func (r *paReplicas) unseen(req *Request, now int64) paUnseen {
	peers := int(r.peers.Load())
	if peers == 0 {
		return paUnseen{}
	}
	if _, held := r.held.Load(req); held {
		return paUnseen{}
	}
	r.mu.Lock()
	clump := max(r.clumpMean, 1)
	r.mu.Unlock()
	return paUnseen{peers: peers, rank: int(r.rank.Load()), count: float64(peers) * clump, placed: r.placed.get(now, placedWindow)}
}

// delay is the work, in token-equivalents, that the peers' unseen requests heading for s
// and a request of work own cost each other: the requests among them that go to s (in
// proportion to where the fleet's recent ones went) each wait for half of own, and own waits
// for half of their work (which of simultaneous requests goes first is a toss).
func (u paUnseen) delay(s *paState, own float64, now int64) float64 {
	if u.peers == 0 || u.placed <= 0 {
		return 0
	}
	n := s.placedN.get(now, placedWindow)
	w := s.placedWork.get(now, placedWindow)
	return u.count * (n*own + w) / u.placed / 2
}

// spread moves to the front the place among the first `places` of the fleet that this
// replica, of rank rank, takes: the endpoints within the load bound are filled one request
// like this one at a time, each where it costs least with the ones before it counted (its
// work queued there), and the rank-th request's endpoint is this replica's.
func spread(sc *paScratch, places, rank int) {
	m := len(sc.scored)
	for m > 1 && sc.scored[m-1].eligible != sc.scored[0].eligible {
		m--
	}
	if cap(sc.costs) < m {
		sc.costs = make([]float64, m)
	}
	costs := sc.costs[:m]
	for k := range m {
		costs[k] = sc.scored[k].cost
	}
	pick := 0
	for range rank%places + 1 {
		pick = 0
		for k := 1; k < m; k++ {
			if costs[k] < costs[pick] {
				pick = k
			}
		}
		x := sc.scored[pick]
		costs[pick] += x.own / prefillRate * x.speed
	}
	if pick > 0 {
		x := sc.scored[pick]
		copy(sc.scored[1:pick+1], sc.scored[:pick])
		sc.scored[0] = x
	}
}

// decayed is an exponentially decayed sum; over its time constant, a rate per second. Adds
// serialize on mu; get reads without it, on the scoring path (a get between an add's two
// stores sees the new sum at the old time: one request's decay off, at most).
type decayed struct {
	mu  sync.Mutex
	sum atomic.Uint64 // float64 bits, as of at
	at  atomic.Int64  // unix nanoseconds; 0: nothing added yet
}

func (d *decayed) add(v float64, now int64, tau float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	at := d.at.Load()
	d.sum.Store(math.Float64bits(decay(math.Float64frombits(d.sum.Load()), at, now, tau) + v))
	d.at.Store(max(at, now))
}

// get returns the sum at now, per second of the time constant tau.
func (d *decayed) get(now int64, tau float64) float64 {
	return decay(math.Float64frombits(d.sum.Load()), d.at.Load(), now, tau) / tau
}

// decay is sum, as of at, decayed to now.
func decay(sum float64, at, now int64, tau float64) float64 {
	if at == 0 || now <= at {
		return sum
	}
	return sum * math.Exp(-float64(now-at)/1e9/tau)
}
