package policy

import (
	"math"
	"slices"
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
// information?", 2000). prefix-aware answers with two things, both off with one replica or
// with a delay of zero:
//
//   - each replica takes its own place in the order one router would have filled the fleet:
//     the n replicas' simultaneous requests, taken as like this one, go one after the other
//     where each costs least with the ones before it counted, and the replica of rank r takes
//     the r-th of those places (spread). A request whose prefix one endpoint holds costs little
//     there, so all n places are that endpoint and it stays there.
//   - the requests the peers are placing unseen at this moment are counted where the peers
//     place them (paUnseen.expect): they are like the fleet's recent requests (as many of
//     each size of uncached work), and a peer of rank r' sends one of them to the r'-th place
//     of its own fill, on the picture this replica has too. Half of those that land on an
//     endpoint wait for this request's work there, this request waits for half of their work
//     (which of simultaneous requests goes first is a toss). That keeps a short request off
//     the endpoint where a peer is sending, at the same instant, a long new prefill, and a
//     long one off the endpoint that many short ones are heading for.
//
// How many the peers place unseen is measured: this replica's own placements come in clumps
// (each less than the sync delay after the one before), and a balancer that gives every
// replica its share of the same arrivals gives each peer a clump as large at the same time.

// placedWindow is the time constant, in seconds, of the fleet's mix of requests that says
// what the peers' unseen requests are like: long enough to span many bursts, short enough to
// follow the traffic (the affinity window's default).
const placedWindow = 60.0

// workClasses sorts requests by their uncached work, in token-equivalents, in powers of two:
// class k holds work from 2^k up to 2^(k+1) (the last everything above). A class's requests
// are placed alike: a fill moves by no more than a factor of two within one.
const workClasses = 24

// paReplicas is what prefix-aware knows of the replicas it places alongside.
type paReplicas struct {
	peers atomic.Int32 // the other replicas while they hear of placements late, else 0
	rank  atomic.Int32 // this replica's place among them, 0 to n-1
	lag   atomic.Int64 // how late a placement reaches the others, nanoseconds

	mu        sync.Mutex
	clumpLast int64   // the last own placement, unix nanoseconds
	clumpN    int     // own placements in the clump that clumpLast ends
	clumpMean float64 // the size of the clump an own placement belongs to, averaged; 0: none yet (1)
	mix       workMix // the requests routed by any replica, by uncached work
	// This replica's placements that the peers have not heard of yet (less than lag ago),
	// oldest first: what its picture has that theirs lacks.
	recent []ownPlacement
}

// ownPlacement is one of this replica's placements.
type ownPlacement struct {
	at   int64 // unix nanoseconds
	s    *paState
	work float64
}

// maxRecent bounds the placements kept as unheard by the peers; beyond it, the oldest are
// taken as heard (a bound on memory: at 1,000 requests/s, a 50 ms delay keeps 50).
const maxRecent = 1024

// workMix is the fleet's recent requests by class of uncached work: their number and their
// work, exponentially decayed sums over placedWindow as of at.
type workMix struct {
	at      int64 // unix nanoseconds; 0: nothing added yet
	n, work [workClasses]float64
}

// workClass is the class of a request of uncached work w.
func workClass(w float64) int {
	if w < 2 {
		return 0
	}
	return min(int(math.Log2(w)), workClasses-1)
}

// decayTo brings the sums to now.
func (m *workMix) decayTo(now int64) {
	if m.at != 0 && now > m.at {
		f := math.Exp(-float64(now-m.at) / 1e9 / placedWindow)
		for k := range m.n {
			m.n[k] *= f
			m.work[k] *= f
		}
	}
	m.at = max(m.at, now)
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

// routed counts a request of uncached work routed to s at now by this replica or, replayed,
// by another one.
func (r *paReplicas) routed(s *paState, req *Request, work, now int64) {
	if r.peers.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mix.decayTo(now)
	k := workClass(float64(work))
	r.mix.n[k]++
	r.mix.work[k] += float64(work)
	if req.Remote {
		return
	}
	r.forget(now)
	if len(r.recent) == maxRecent {
		r.recent = slices.Delete(r.recent, 0, 1)
	}
	r.recent = append(r.recent, ownPlacement{at: now, s: s, work: float64(work)})
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

// forget drops the own placements the peers have heard of by now. The caller holds mu.
func (r *paReplicas) forget(now int64) {
	lag := r.lag.Load()
	k := 0
	for k < len(r.recent) && now-r.recent[k].at >= lag {
		k++
	}
	r.recent = slices.Delete(r.recent, 0, k)
}

// unheard sets heard[j] to the queued work the peers know of on candidate j (scored, in
// candidate order): its queued work less this replica's placements there that the peers have
// not heard of at now.
func (r *paReplicas) unheard(sc *paScratch, heard []float64, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forget(now)
	for j, x := range sc.scored {
		w := x.q
		for _, p := range r.recent {
			if p.s == sc.states[x.i] {
				w -= p.work
			}
		}
		heard[j] = max(w, 0)
	}
}

// meanWork is the mean uncached work of the fleet's recent requests at now (0: none yet).
// The caller holds mu.
func (r *paReplicas) meanWork(now int64) float64 {
	r.mix.decayTo(now)
	var n, w float64
	for k := range r.mix.n {
		n += r.mix.n[k]
		w += r.mix.work[k]
	}
	if n <= 0 {
		return 0
	}
	return w / n
}

// Defer holds a request larger than the fleet's recent mean (policy.Deferrer): one sync
// delay for each doubling of its uncached work over the mean, the first included, and always
// less than its own prefill takes. Such a request costs an unseen peer request that lands
// with it more than that one costs it (the one behind waits for the one ahead). Held, it is
// placed once this replica has heard of what the peers placed at the moment it arrived, and
// after the smaller ones held with it: the way one router that saw a burst whole would have
// it, short prefills not queued behind long ones. One replica, or a delay of 0, holds nothing.
func (pa *prefixAware) Defer(req *Request, c []*endpoint.Endpoint) time.Duration {
	r := &pa.replicas
	lag := time.Duration(r.lag.Load())
	if r.peers.Load() == 0 || lag <= 0 || len(c) == 0 {
		return 0
	}
	maxID := 0
	for _, e := range c {
		maxID = max(maxID, e.ID)
	}
	sc := pa.getScratch(len(c), maxID)
	defer pa.scratch.Put(sc)
	pa.index.Match(sc.runs, req.Blocks)
	best := 0
	for _, e := range c {
		if !pa.state(e.ID).blind.Load() {
			best = max(best, int(sc.runs[e.ID]))
		}
	}
	own := float64(pa.work(req, cachedTokens(req, best))) // where its prefix is
	now := pa.clock.Now().UnixNano()
	r.mu.Lock()
	mean := r.meanWork(now)
	r.mu.Unlock()
	if own <= mean {
		return 0
	}
	levels := math.Floor(math.Log2(own/mean)) + 1
	levels = min(levels, math.Ceil(own/prefillRate*pa.fleet.get()/lag.Seconds())-1)
	if levels < 1 {
		return 0
	}
	return time.Duration(levels) * lag
}

// paUnseen is what one placement assumes of the peers' unseen requests.
type paUnseen struct {
	peers, rank int
	clump       float64 // requests each peer is placing at this moment, unseen
	// The fleet's recent requests by class of uncached work: the share of each class in
	// their number, and its mean work.
	share, work [workClasses]float64
	r           *paReplicas
	now         int64
}

// unseen returns the peers' unseen placements at now; peers is 0 when there are none.
func (r *paReplicas) unseen(now int64) paUnseen {
	peers := int(r.peers.Load())
	if peers == 0 {
		return paUnseen{}
	}
	u := paUnseen{peers: peers, rank: int(r.rank.Load()), r: r, now: now}
	r.mu.Lock()
	defer r.mu.Unlock()
	u.clump = max(r.clumpMean, 1)
	r.mix.decayTo(now)
	var total float64
	for k, n := range r.mix.n {
		total += n
		if n > 0 {
			u.work[k] = r.mix.work[k] / n
		}
	}
	if total > 0 {
		for k, n := range r.mix.n {
			u.share[k] = n / total
		}
	}
	return u
}

// expect adds to each scored candidate's cost (in candidate order, not yet ranked) what the
// peers' unseen requests larger than this one cost it, and it them, where they probably land;
// the ones like it are spread's. Each peer is placing clump requests, share[k] of them of
// class k, on the picture this replica has less its own placements they have not heard of.
// One router would place a burst's largest first: a request of class k, no part of it cached
// (the new content that makes a long prefill), goes to one of the places of a fill with
// requests of its work (spread), the larger ones before it counted, each place as likely
// (which peer has it, and what that peer has placed unseen before it, is not known). Of
// those that land on an endpoint, half wait for this request's work there, and this request
// waits for half of theirs: which of simultaneous requests goes first is a toss.
func (u *paUnseen) expect(sc *paScratch) {
	if u.peers == 0 {
		return
	}
	m := len(sc.scored)
	// The peers fill the endpoints within the load bound, or all when none is.
	eligible := slices.ContainsFunc(sc.scored, func(x paScore) bool { return x.eligible })
	if cap(sc.costs) < 4*m {
		sc.costs = make([]float64, 4*m)
	}
	costs, count, work, q := sc.costs[:m], sc.costs[m:2*m], sc.costs[2*m:3*m], sc.costs[3*m:4*m]
	clear(count)
	clear(work)
	u.r.unheard(sc, q, u.now)
	own := math.Inf(1) // this request's work where it is least: where it probably goes
	for _, x := range sc.scored {
		own = min(own, x.own)
	}
	places := u.peers + 1
	perPlace := float64(u.peers) / float64(places) // of a peer's request, at each place
	for k := workClasses - 1; k > workClass(own); k-- {
		if u.share[k] == 0 {
			continue
		}
		w, n := u.work[k], u.clump*u.share[k]*perPlace
		for j, x := range sc.scored {
			costs[j] = math.Inf(1)
			if x.eligible == eligible {
				costs[j] = x.base + x.speed*(q[j]+w*x.weight+x.aff*w*(q[j]+w/2)+(count[j]*w+work[j])/2)/prefillRate
			}
		}
		for range places {
			pick := 0
			for j := 1; j < m; j++ {
				if costs[j] < costs[pick] {
					pick = j
				}
			}
			count[pick] += n
			work[pick] += n * w
			costs[pick] += w / prefillRate * sc.scored[pick].speed
		}
	}
	for j := range sc.scored {
		x := &sc.scored[j]
		x.cost += (count[j]*x.own + work[j]) / 2 / prefillRate * x.speed
	}
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
