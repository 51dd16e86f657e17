package peer

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/vmihailenco/msgpack/v5"
)

// Replicas that route by different policies, or by one policy with other parameters, place the
// same prompts apart and read the shared index each with its own scores: nothing breaks, but the
// fleet routes as neither would alone. So each replica advertises its policy in its memberlist
// metadata (a name and a fingerprint of the effective parameters, which the router computes)
// and compares the others' with its own. A replica of an older build advertises none: it is
// unknown, neither a match nor a mismatch.

// Bounds of what SetPolicy advertises, so that the metadata stays far below memberlist's limit
// (memberlist.MetaMaxSize, 512 bytes) whatever it is given: a policy name is a few words, a
// fingerprint a few bytes.
const (
	maxPolicyName        = 64
	maxPolicyFingerprint = 64
)

// updateWait bounds the wait for the live peers to take a policy update handed to them
// (advertise): one that does not answer in time has it from gossip, or from the state
// exchange every 30 s.
const updateWait = 500 * time.Millisecond

// policyID is a replica's routing policy as it advertises it: the policy's name and the
// fingerprint of its effective parameters. The zero value is a replica that advertises none.
type policyID struct {
	name, fp string
}

func (p policyID) known() bool { return p.fp != "" }

// SetPolicy sets the routing policy this replica advertises to its peers: the policy's name and
// a fingerprint of its effective parameters (defaults included, so that replicas whose configs
// write a default out and leave it out match). Call it at start (before or after Run) and
// after every reload that may change the policy; an unchanged policy changes nothing. While
// the node runs, a change is gossiped to the peers (memberlist's UpdateNode), and each compares
// it with its own: a difference is logged and counted in kvroute_peers_policy_mismatch.
// A fingerprint of "" advertises nothing, as a replica of an older build.
func (n *Node) SetPolicy(name, fingerprint string) {
	id := policyID{name: clip(name, maxPolicyName), fp: clip(fingerprint, maxPolicyFingerprint)}
	if id.fp == "" {
		id = policyID{}
	}
	if old := n.policy.Swap(&id); old != nil && *old == id {
		return
	}
	n.advertiseAgain()
	n.changed() // compare the peers' with this one's
}

// advertiseAgain asks Run to advertise this replica's metadata anew (advertise).
func (n *Node) advertiseAgain() {
	select {
	case n.readvertise <- struct{}{}:
	default:
	}
}

// Policy returns the policy name and fingerprint this replica advertises ("" before SetPolicy).
func (n *Node) Policy() (name, fingerprint string) {
	if p := n.policy.Load(); p != nil {
		return p.name, p.fp
	}
	return "", ""
}

func (n *Node) ownPolicy() policyID {
	if p := n.policy.Load(); p != nil {
		return *p
	}
	return policyID{}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// advertise gossips this replica's metadata again at each change of its policy, until ctx
// ends, and hands it to each live peer at once (handState): memberlist's gossip of an update
// alone can lose it for good. Its queue of news (memberlist v0.7.0's TransmitLimitedQueue,
// hashicorp/memberlist#263, open) numbers its items afresh from 0 when it empties, also when
// an item is replaced by a newer one (this replica's state by the update), and a later item
// that happens to take the same number, tier and length (another replica's state of the same
// size, merged from a join) replaces the update in the queue: it is never sent, and the peers
// kept the old policy until the state exchange every 30 s (TestPolicyMismatch waited 10 s in
// vain about one run in 70). That is what happened to an update made while this replica's join
// was in flight: the join had sent the state before the update, and nobody was alive to hand
// it to yet, so the join, once done, asks for another advertisement (joinRound, n.advertised).
func (n *Node) advertise(ctx context.Context, ml *memberlist.Memberlist) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.readvertise:
		}
		n.advertised.Add(1)
		// It only waits for the gossip to be sent; queued at once, the update goes with it all
		// the same.
		_ = ml.UpdateNode(time.Nanosecond)
		if told, peers := n.handState(ctx, ml, n.peerAddrs(), updateWait, "handing this replica's policy to the peers"); told < peers {
			n.log.Debug("a policy update not taken by every peer: gossip and the state exchange every 30 s carry it", "told", told, "peers", peers)
		}
	}
}

// peerPolicies returns the policy each live member of this major version advertises (the
// zero policyID for one that advertises none), itself left out.
func (n *Node) peerPolicies() map[string]policyID {
	out := map[string]policyID{}
	n.members.each(n.cfg.Name, func(name string, m member) {
		var mt meta
		if err := msgpack.Unmarshal(m.meta, &mt); err != nil || mt.Major != Major || mt.Feed <= 0 {
			return
		}
		id := policyID{name: mt.Policy, fp: mt.PolicyFP}
		if !id.known() {
			id = policyID{}
		}
		out[name] = id
	})
	return out
}

// checkPolicies compares the peers' policies with this replica's (the manager calls it at
// each change of the members or of this replica's policy).
func (n *Node) checkPolicies() {
	k := n.policies.check(n.ownPolicy(), n.peerPolicies(), n.log)
	n.m.PolicyMismatch.Set(float64(k))
}

// policyWatch remembers, for each member, the policy it advertised when last compared, whether
// it differed from this replica's and which side to fix, so that a difference is logged once per
// peer and per change, and its end once.
type policyWatch struct {
	mu    sync.Mutex
	peers map[string]peerPolicy
}

// peerPolicy is a member's policy as policyWatch last compared it.
type peerPolicy struct {
	id     policyID
	differ bool     // it differed from own
	own    policyID // this replica's policy then
	fix    string   // which side to fix, where it differed (whichSide)
}

// Log lines of the policy comparison.
const (
	policyDiffersMsg = "a peer replica routes by another policy or other parameters: replicas should run the same policy and parameters; compare their configs' `policy:`"
	policyAgreesMsg  = "a peer replica routes by the same policy and parameters as this one again"
)

// check compares peers (each member's policy, by name) with own, this replica's, logs what
// changed and returns how many peers differ. A peer or a replica that advertises no policy
// differs from none. A difference is logged again when either side's policy changes, and when
// the side to fix does (the members changed: the first lines of a fleet that starts are
// written before every replica has joined).
func (w *policyWatch) check(own policyID, peers map[string]policyID, log *slog.Logger) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.peers == nil {
		w.peers = map[string]peerPolicy{}
	}
	for name := range w.peers {
		if _, ok := peers[name]; !ok {
			delete(w.peers, name) // gone: if it comes back differing, that is news again
		}
	}
	differ := 0
	for _, name := range slices.Sorted(maps.Keys(peers)) {
		id := peers[name]
		prev, seen := w.peers[name]
		d := own.known() && id.known() && id != own
		var fix string
		var same, other, total int
		if d {
			fix, same, other, total = whichSide(own, id, peers)
		}
		switch {
		case d && (!seen || !prev.differ || prev.id != id || prev.own != own || prev.fix != fix):
			log.Warn(policyDiffersMsg, "peer", name, "policy", own.name, "fingerprint", own.fp,
				"peer_policy", id.name, "peer_fingerprint", id.fp, "fix", fix,
				"replicas_like_this", same, "replicas_like_peer", other, "replicas", total)
		case !d && seen && prev.differ && own.known() && id.known():
			log.Info(policyAgreesMsg, "peer", name, "policy", own.name, "fingerprint", own.fp)
		}
		if d {
			differ++
		}
		w.peers[name] = peerPolicy{id: id, differ: d, own: own, fix: fix}
	}
	return differ
}

// whichSide says which of two replicas that differ to fix, by the policies of the group's
// replicas that advertise one (this one included): the side whose policy fewer of them run.
// It also returns how many run own's, how many the peer's (id), and how many advertise one.
func whichSide(own, id policyID, peers map[string]policyID) (fix string, same, other, total int) {
	same, total = 1, 1
	for _, p := range peers {
		if !p.known() {
			continue
		}
		total++
		switch p {
		case own:
			same++
		case id:
			other++
		}
	}
	switch {
	case same > other:
		fix = "the peer: more replicas run this one's policy"
	case other > same:
		fix = "this replica: more replicas run the peer's policy"
	default:
		fix = "either: as many replicas run each policy; the fleet's intended config decides"
	}
	return fix, same, other, total
}

// PeerPolicy is a member's policy in /debug/peers.
type PeerPolicy struct {
	Name string `json:"name"`
	// Policy and Fingerprint are what the member advertises: "" for a replica of an older
	// build, which advertises none.
	Policy      string `json:"policy,omitempty"`
	Fingerprint string `json:"policy_fingerprint,omitempty"`
	// Matches says whether they are this replica's; null while either side advertises none
	// (unknown).
	Matches *bool `json:"policy_matches"`
}

// PolicyStatus is this replica's policy in /debug/peers, as it advertises it.
type PolicyStatus struct {
	Name        string `json:"name,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Mismatches counts the peers whose policy differs (kvroute_peers_policy_mismatch).
	Mismatches int `json:"mismatches"`
}

// status lists the members as last compared, by name, and counts those that differed.
func (w *policyWatch) status() ([]PeerPolicy, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]PeerPolicy, 0, len(w.peers))
	differ := 0
	for _, name := range slices.Sorted(maps.Keys(w.peers)) {
		p := w.peers[name]
		pp := PeerPolicy{Name: name, Policy: p.id.name, Fingerprint: p.id.fp}
		if p.own.known() && p.id.known() {
			m := !p.differ
			pp.Matches = &m
		}
		if p.differ {
			differ++
		}
		out = append(out, pp)
	}
	return out, differ
}
