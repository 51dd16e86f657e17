package policy

import (
	"encoding/binary"
	"slices"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// consistentHash is KubeAI's PrefixHash load balancing: consistent hashing with bounded loads
// (CHWBL). The key (the first 100 characters of the prompt in KubeAI) is hashed onto a ring
// that holds virtual_nodes points per endpoint; walking clockwise from it, the first endpoint
// whose in-flight load is at most (total in flight + 1) / n x load_factor takes the request.
// Published defaults: 256 virtual nodes, load factor 1.25.
//
// Difference from the original: kvroute does not see the prompt text at this point, so the key
// is the request's first block hash (its first 64 bytes, about 100 characters, seeded with the
// model and tenant salt); a prompt shorter than one block is keyed by its session key or ID.
type consistentHash struct {
	vnodes     int
	loadFactor float64

	mu   sync.Mutex
	ring hashRing
}

// hashRing is a ring built for one candidate set.
type hashRing struct {
	sig    string
	points []ringPoint
}

type ringPoint struct {
	h   uint64
	idx int // index into the candidate slice the ring was built for
}

func newConsistentHash(env Env, p Params) (Picker, error) {
	r := env.params(p)
	ch := &consistentHash{
		vnodes:     r.Int("virtual_nodes", 256),
		loadFactor: r.Float("load_factor", 1.25),
	}
	r.Require(ch.vnodes >= 1 && ch.vnodes <= 1<<16, "virtual_nodes=%d must be in 1..65536", ch.vnodes)
	r.Require(ch.loadFactor >= 1, "load_factor=%g must be at least 1", ch.loadFactor)
	if err := r.Check(); err != nil {
		return nil, err
	}
	return ch, nil
}

// requestKey is the routing key of peers that hash one prefix: the hash of the first n blocks
// (the chain makes the n-th block's hash cover all of them), or of the session key or ID when
// the prompt has fewer blocks.
func requestKey(req *Request, n int) uint64 {
	if n > len(req.Blocks) {
		n = len(req.Blocks)
	}
	if n > 0 {
		return req.Blocks[n-1]
	}
	if req.SessionKey != "" {
		return xxhash.Sum64String("session\x00" + req.SessionKey)
	}
	return xxhash.Sum64String("id\x00" + req.ID)
}

func candidateSig(c []*endpoint.Endpoint) string {
	var b strings.Builder
	for _, e := range c {
		b.WriteString(e.Name)
		b.WriteByte(0)
	}
	return b.String()
}

func (ch *consistentHash) buildRing(c []*endpoint.Endpoint) []ringPoint {
	sig := candidateSig(c)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.ring.sig == sig {
		return ch.ring.points
	}
	pts := make([]ringPoint, 0, len(c)*ch.vnodes)
	var buf [8]byte
	for i, e := range c {
		d := xxhash.New()
		for v := 0; v < ch.vnodes; v++ {
			d.Reset()
			_, _ = d.WriteString(e.Name)
			binary.LittleEndian.PutUint64(buf[:], uint64(v))
			_, _ = d.Write(buf[:])
			pts = append(pts, ringPoint{h: d.Sum64(), idx: i})
		}
	}
	slices.SortFunc(pts, func(a, b ringPoint) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return a.idx - b.idx
	})
	ch.ring = hashRing{sig: sig, points: pts}
	return pts
}

// Pick walks the ring from the request's key: the first endpoint within the load bound first,
// then the others in the order the walk meets them.
func (ch *consistentHash) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	n := len(c)
	if n == 0 {
		return nil, ErrNoCandidate
	}
	pts := ch.buildRing(c)
	key := requestKey(req, 1)
	start, _ := slices.BinarySearchFunc(pts, key, func(p ringPoint, k uint64) int {
		if p.h < k {
			return -1
		}
		if p.h > k {
			return 1
		}
		return 0
	})
	total := 0
	for _, e := range c {
		total += e.InFlight()
	}
	bound := float64(total+1) / float64(n) * ch.loadFactor
	order := make([]*endpoint.Endpoint, 0, n)
	seen := make([]bool, n)
	chosen := -1
	for k := 0; k < len(pts) && len(order) < n; k++ {
		i := pts[(start+k)%len(pts)].idx
		if seen[i] {
			continue
		}
		seen[i] = true
		order = append(order, c[i])
		if chosen < 0 && float64(c[i].InFlight()) <= bound {
			chosen = len(order) - 1
		}
	}
	if chosen > 0 {
		e := order[chosen]
		copy(order[1:chosen+1], order[:chosen])
		order[0] = e
	}
	return order, nil
}
