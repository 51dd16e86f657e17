package policy

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// rotate returns candidates ranked starting at index first, wrapping around.
func rotate(c []*endpoint.Endpoint, first int) []*endpoint.Endpoint {
	out := make([]*endpoint.Endpoint, 0, len(c))
	out = append(out, c[first:]...)
	return append(out, c[:first]...)
}

// roundRobin sends each request to the next candidate in turn.
type roundRobin struct{ next atomic.Uint64 }

func newRoundRobin(_ Env, p Params) (Picker, error) {
	if err := readParams(p).Check(); err != nil {
		return nil, err
	}
	return &roundRobin{}, nil
}

func (r *roundRobin) Pick(_ *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	if len(c) == 0 {
		return nil, ErrNoCandidate
	}
	n := r.next.Add(1) - 1
	return rotate(c, int(n%uint64(len(c)))), nil
}

// lockedRand is a seeded rand shared by concurrent picks.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(env Env) *lockedRand {
	r := env.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(1, 2))
	}
	return &lockedRand{r: r}
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// random picks a uniformly random candidate.
type random struct{ r *lockedRand }

func newRandom(env Env, p Params) (Picker, error) {
	if err := readParams(p).Check(); err != nil {
		return nil, err
	}
	return &random{r: newLockedRand(env)}, nil
}

func (r *random) Pick(_ *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	if len(c) == 0 {
		return nil, ErrNoCandidate
	}
	return rotate(c, r.r.IntN(len(c))), nil
}

// leastRequest picks the candidate with the fewest in-flight requests (SageMaker
// LEAST_OUTSTANDING_REQUESTS, KubeAI LeastLoad); ties go to the lowest ID after the previous
// winner, so equal load still spreads.
type leastRequest struct{ next atomic.Uint64 }

func newLeastRequest(_ Env, p Params) (Picker, error) {
	if err := readParams(p).Check(); err != nil {
		return nil, err
	}
	return &leastRequest{}, nil
}

func (l *leastRequest) Pick(_ *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	if len(c) == 0 {
		return nil, ErrNoCandidate
	}
	start := int(l.next.Add(1) % uint64(len(c)))
	out := rotate(c, start)
	// Stable insertion sort by in-flight: candidates are few, and it keeps the rotation order
	// among equals.
	load := make([]int, len(out))
	for i, e := range out {
		load[i] = e.InFlight()
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && load[j] < load[j-1]; j-- {
			load[j], load[j-1] = load[j-1], load[j]
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out, nil
}

// powerOfTwo draws two distinct random candidates and ranks the one with fewer in-flight
// requests first (Ray Serve's default), then the other, then the rest in order.
type powerOfTwo struct{ r *lockedRand }

func newPowerOfTwo(env Env, p Params) (Picker, error) {
	if err := readParams(p).Check(); err != nil {
		return nil, err
	}
	return &powerOfTwo{r: newLockedRand(env)}, nil
}

func (p *powerOfTwo) Pick(_ *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	if n == 1 {
		return []*endpoint.Endpoint{c[0]}, nil
	}
	a := p.r.IntN(n)
	b := p.r.IntN(n - 1)
	if b >= a {
		b++
	}
	if c[b].InFlight() < c[a].InFlight() {
		a, b = b, a
	}
	out := make([]*endpoint.Endpoint, 0, n)
	out = append(out, c[a], c[b])
	for i, e := range c {
		if i != a && i != b {
			out = append(out, e)
		}
	}
	return out, nil
}
