package policy

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/prefix"
)

// prefixSpill is Amazon SageMaker's PREFIX_AWARE routing strategy: a hash of the first
// PrefixLength bytes of the prompt (1024..65536) picks the instance; once that instance has
// ConcurrencyThreshold (1..1024) requests in flight, the request goes to the least loaded
// instance instead.
//
// SageMaker publishes the valid ranges but no defaults (both fields are required); kvroute uses
// prefix_length=1024 (the smallest allowed) and concurrency_threshold=16. Differences from the
// original: the key is the hash of the request's first ceil(prefix_length / block bytes) blocks
// (chained hashes, so one hash covers them all; a shorter prompt uses all its full blocks), and
// the instance is chosen by rendezvous hashing, since SageMaker does not say how the hash maps
// to an instance. The PrefixAwareId header override is not modelled.
type prefixSpill struct {
	prefixLength int
	threshold    int
}

func newPrefixSpill(env Env, p Params) (Picker, error) {
	r := env.params(p)
	ps := &prefixSpill{
		prefixLength: r.Int("prefix_length", 1024),
		threshold:    r.Int("concurrency_threshold", 16),
	}
	r.Require(ps.prefixLength >= 1024 && ps.prefixLength <= 65536, "prefix_length=%d must be in 1024..65536 bytes", ps.prefixLength)
	r.Require(ps.threshold >= 1 && ps.threshold <= 1024, "concurrency_threshold=%d must be in 1..1024", ps.threshold)
	if err := r.Check(); err != nil {
		return nil, err
	}
	return ps, nil
}

// rendezvous returns the index of the candidate with the highest hash of (key, name).
func rendezvous(c []*endpoint.Endpoint, key uint64) int {
	best, bestH := 0, uint64(0)
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], key)
	for i, e := range c {
		d := xxhash.New()
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(e.Name)
		if h := d.Sum64(); i == 0 || h > bestH {
			best, bestH = i, h
		}
	}
	return best
}

// Pick sends the request to its prefix's instance unless that one is at the threshold; the
// rest follow by in-flight load.
func (ps *prefixSpill) Pick(req *Request, c []*endpoint.Endpoint) ([]*endpoint.Endpoint, error) {
	if len(c) == 0 {
		return nil, ErrNoCandidate
	}
	bt := req.BlockTokens
	if bt <= 0 {
		bt = prefix.DefaultBlockTokens
	}
	size := prefix.BlockBytes(bt)
	home := rendezvous(c, requestKey(req, (ps.prefixLength+size-1)/size))
	load := make([]float64, len(c))
	for i, e := range c {
		load[i] = float64(e.InFlight())
	}
	first := home
	if c[home].InFlight() >= ps.threshold {
		first = -1
	}
	return rankByScore(c, load, false, first), nil
}
