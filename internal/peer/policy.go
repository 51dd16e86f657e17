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
//
// Replicas that hash prompts into blocks otherwise (another prefix.block_tokens, other
// normalisation, other cache salts) key the shared index apart: the entries one makes can miss
// the other's requests (all of them at another block size), and the fleet's hit rate drops
// without anything failing. So each replica advertises a fingerprint of its hashing too
// (SetHashing; the router computes it) and compares it in the same way, apart from the policy.

// Bounds of what SetPolicy and SetHashing advertise, so that the metadata stays far below
// memberlist's limit (memberlist.MetaMaxSize, 512 bytes) whatever it is given: a policy name is
// a few words, a fingerprint a few bytes.
const (
	maxPolicyName        = 64
	maxPolicyFingerprint = 64
)

// updateWait bounds the wait for the live peers to take a policy update handed to them
// (advertise): one that does not answer in time has it from gossip, or from the state
// exchange every 30 s.
const updateWait = 500 * time.Millisecond

// advertiseSettle is how long an advertisement waits after the change that asked for it, so
// that the changes of one reload go out together: the router sets the hashing, then the
// policy (app.advertisePolicy), microseconds apart, and each advertisement is a gossip round
// and a state exchange with every peer. Far longer than the gap, far shorter than anything
// that waits for the peers to know.
const advertiseSettle = 20 * time.Millisecond

// policyID is a replica's routing policy as it advertises it: the policy's name and the
// fingerprint of its effective parameters; or its hashing of prompts: a fingerprint, no name.
// The zero value is a replica that advertises none.
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

// SetHashing sets the fingerprint of this replica's hashing of prompts into blocks that it
// advertises to its peers (the router's, of what shapes a request's block hashes: the block
// size, the normalisation, where cache salts come from). As SetPolicy: call it at start and
// after every reload; an unchanged fingerprint changes nothing; a change is gossiped, and a
// peer whose fingerprint differs is logged and counted in kvroute_peers_hashing_mismatch.
// "" advertises nothing, as a replica of an older build.
func (n *Node) SetHashing(fingerprint string) {
	id := policyID{fp: clip(fingerprint, maxPolicyFingerprint)}
	if old := n.hashing.Swap(&id); old != nil && *old == id {
		return
	}
	n.advertiseAgain()
	n.changed()
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

// Hashing returns the hashing fingerprint this replica advertises ("" before SetHashing).
func (n *Node) Hashing() string { return n.ownHashing().fp }

func (n *Node) ownHashing() policyID {
	if p := n.hashing.Load(); p != nil {
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

// advertise gossips this replica's metadata again at each change of its policy or hashing
// (the changes made within advertiseSettle of one another at once), until ctx ends, and hands
// it to each live peer at once (handState): memberlist's gossip of an
// update alone can lose it for good. Its queue of news (memberlist v0.7.0's TransmitLimitedQueue,
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
		// The metadata is read when the update is made (delegate.NodeMeta): every change made
		// while this waits goes out with it, and their requests are taken back.
		t := time.NewTimer(advertiseSettle)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		select {
		case <-n.readvertise:
		default:
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

// peerAdvertised returns the policy and the hashing each live member of this major version
// advertises (the zero policyID for one that advertises none), itself left out: both from one
// read of the members, so that both watches compare the same peers.
func (n *Node) peerAdvertised() (policies, hashings map[string]policyID) {
	policies, hashings = map[string]policyID{}, map[string]policyID{}
	n.members.each(n.cfg.Name, func(name string, m member) {
		var mt meta
		if err := msgpack.Unmarshal(m.meta, &mt); err != nil || mt.Major != Major || mt.Feed <= 0 {
			return
		}
		pol, hash := policyID{name: mt.Policy, fp: mt.PolicyFP}, policyID{fp: mt.HashingFP}
		if !pol.known() {
			pol = policyID{}
		}
		policies[name], hashings[name] = pol, hash
	})
	return policies, hashings
}

// mismatchGrace is how long a peer's policy or hashing may differ from this replica's before
// the difference is logged at WARN (INFO until then). A rolling reload of a fleet makes the
// replicas differ for as long as it takes to reach them all: in a soak, a policy parameter
// reloaded on three replicas one after another made 8 warnings in 1.7 s, each followed by the
// agreement at once. Reloads driven one replica at a time (SIGHUP over a list of hosts, a
// file pushed to each) reach a small fleet within a few seconds; 10 s leaves room for that, and
// a mismatch that lasts is still warned of within seconds. A Kubernetes ConfigMap volume
// reaches the pods up to a minute or more apart (the kubelet's sync period): such a rollout may
// still warn, once per peer, and its agreement follows. The gauges count a difference at
// once, whatever its age: they say what is, and an alert on them takes its own `for:`.
const mismatchGrace = 10 * time.Second

// checkPolicies compares the peers' policies and hashings with this replica's (the manager
// calls it at each change of the members or of what this replica advertises, and at each tick
// of the node's clock, which is when a difference that outlasts mismatchGrace is warned of).
func (n *Node) checkPolicies() {
	policies, hashings := n.peerAdvertised()
	now := time.Now()
	n.m.PolicyMismatch.Set(float64(n.policies.check(n.ownPolicy(), policies, n.log, now)))
	n.m.HashingMismatch.Set(float64(n.hashings.check(n.ownHashing(), hashings, n.log, now)))
}

// subject is what a policyWatch compares, the routing policy or the hashing of prompts, and
// how its log lines say it.
type subject struct {
	differs, agrees, gone string // the messages of a difference, of its end, of a differing peer gone
	named                 bool   // the lines name the policy besides its fingerprint
	// likeThis, likePeer and even say, in the side to fix, which side more replicas are on.
	likeThis, likePeer, even string
}

// Log lines of the comparisons.
const (
	policyDiffersMsg  = "a peer replica routes by another policy or other parameters: replicas should run the same policy and parameters; compare their configs' `policy:`"
	policyAgreesMsg   = "a peer replica routes by the same policy and parameters as this one again"
	policyGoneMsg     = "a peer replica that routed by another policy or other parameters is gone (it left or was declared dead)"
	hashingDiffersMsg = "a peer replica hashes prompts into blocks otherwise: the index entries one makes can miss the other's requests (every one of them at another prefix.block_tokens); compare their configs' `prefix.block_tokens`, `normalize` and `auth` (the tenants' salt secret)"
	hashingAgreesMsg  = "a peer replica hashes prompts as this one again"
	hashingGoneMsg    = "a peer replica that hashed prompts otherwise is gone (it left or was declared dead)"
)

var (
	policySubject = &subject{differs: policyDiffersMsg, agrees: policyAgreesMsg, gone: policyGoneMsg, named: true,
		likeThis: "more replicas run this one's policy", likePeer: "more replicas run the peer's policy",
		even: "as many replicas run each policy"}
	hashingSubject = &subject{differs: hashingDiffersMsg, agrees: hashingAgreesMsg, gone: hashingGoneMsg,
		likeThis: "more replicas hash prompts as this one", likePeer: "more replicas hash prompts as the peer",
		even: "as many replicas hash prompts each way"}
)

// policyWatch remembers, for each member, what it advertised of its subject (its policy, or
// its hashing) when last compared, whether it differed from this replica's and which side to
// fix, so that a difference is logged once per peer and per change, its end once, and a
// differing peer's departure once.
type policyWatch struct {
	about *subject
	// grace is how long a difference is logged at INFO before it is at WARN (mismatchGrace;
	// 0: at WARN at once).
	grace time.Duration
	mu    sync.Mutex
	peers map[string]peerPolicy
}

// peerPolicy is a member's policy (or hashing) as policyWatch last compared it.
type peerPolicy struct {
	id     policyID
	differ bool      // it differed from own
	own    policyID  // this replica's then
	fix    string    // which side to fix, where it differed (whichSide)
	since  time.Time // when it began to differ, where it differs
	warned bool      // its difference, as it is, was logged at WARN
}

// check compares peers (what each member advertises, by name) with own, this replica's, at
// now, logs what changed and returns how many peers differ. A peer or a replica that
// advertises nothing differs from none. A difference is logged again when either side
// changes, and when the side to fix does (the members changed: the first lines of a fleet that
// starts are written before every replica has joined): at INFO while the peer has differed for
// less than w.grace, at WARN after (logged once more at WARN when the grace ends, with how long
// it has lasted). A peer that differed and is no longer a member (it left, or was declared
// dead) is logged at INFO, once: it is no longer counted.
func (w *policyWatch) check(own policyID, peers map[string]policyID, log *slog.Logger, now time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.peers == nil {
		w.peers = map[string]peerPolicy{}
	}
	var gone []string
	for name, p := range w.peers {
		if _, ok := peers[name]; !ok {
			if p.differ {
				gone = append(gone, name)
			} else {
				delete(w.peers, name) // gone: if it comes back differing, that is news again
			}
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
			fix, same, other, total = w.about.whichSide(own, id, peers)
		}
		since, warned := now, false
		if d && seen && prev.differ {
			since, warned = prev.since, prev.warned
		}
		changed := d && (!seen || !prev.differ || prev.id != id || prev.own != own || prev.fix != fix)
		lasted := now.Sub(since)
		switch {
		case d && lasted >= w.grace && (changed || !warned):
			log.Warn(w.about.differs, w.about.attrs(name, own, id,
				"fix", fix, "replicas_like_this", same, "replicas_like_peer", other, "replicas", total,
				"for", lasted.Round(time.Second).String())...)
			warned = true
		case changed:
			// Perhaps a rolling reload under way: a warning if it outlasts the grace.
			log.Info(w.about.differs, w.about.attrs(name, own, id,
				"fix", fix, "replicas_like_this", same, "replicas_like_peer", other, "replicas", total,
				"warn_after", w.grace.String())...)
			warned = false
		case !d && seen && prev.differ && own.known() && id.known():
			log.Info(w.about.agrees, w.about.attrs(name, own, policyID{})...)
		}
		if d {
			differ++
		}
		w.peers[name] = peerPolicy{id: id, differ: d, own: own, fix: fix, since: since, warned: warned}
	}
	slices.Sort(gone)
	for _, name := range gone {
		p := w.peers[name]
		delete(w.peers, name)
		log.Info(w.about.gone, w.about.attrs(name, own, p.id, "mismatches", differ)...)
	}
	return differ
}

// attrs are a log line's attributes: the peer, this replica's fingerprint (and policy), the
// peer's where known (not the zero policyID), then more.
func (s *subject) attrs(peer string, own, id policyID, more ...any) []any {
	out := []any{"peer", peer}
	if s.named {
		out = append(out, "policy", own.name)
	}
	out = append(out, "fingerprint", own.fp)
	if id != (policyID{}) {
		if s.named {
			out = append(out, "peer_policy", id.name)
		}
		out = append(out, "peer_fingerprint", id.fp)
	}
	return append(out, more...)
}

// whichSide says which of two replicas that differ to fix, by what the group's replicas that
// advertise one (this one included) advertise: the side fewer of them are on. It also returns
// how many are on own's side, how many on the peer's (id), and how many advertise one.
func (s *subject) whichSide(own, id policyID, peers map[string]policyID) (fix string, same, other, total int) {
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
		fix = "the peer: " + s.likeThis
	case other > same:
		fix = "this replica: " + s.likePeer
	default:
		fix = "either: " + s.even + "; the fleet's intended config decides"
	}
	return fix, same, other, total
}

// PeerPolicy is a member's policy and hashing in /debug/peers.
type PeerPolicy struct {
	Name string `json:"name"`
	// Policy and Fingerprint are what the member advertises of its policy: "" for a replica of
	// an older build, which advertises none.
	Policy      string `json:"policy,omitempty"`
	Fingerprint string `json:"policy_fingerprint,omitempty"`
	// Matches says whether they are this replica's; null while either side advertises none
	// (unknown).
	Matches *bool `json:"policy_matches"`
	// Hashing is the fingerprint of the member's hashing of prompts (SetHashing), "" for a
	// replica of an older build; HashingMatches says whether it is this replica's, null while
	// either side advertises none.
	Hashing        string `json:"hashing_fingerprint,omitempty"`
	HashingMatches *bool  `json:"hashing_matches"`
}

// PolicyStatus is this replica's policy in /debug/peers, as it advertises it.
type PolicyStatus struct {
	Name        string `json:"name,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	// Mismatches counts the peers whose policy differs (kvroute_peers_policy_mismatch).
	Mismatches int `json:"mismatches"`
}

// HashingStatus is this replica's hashing of prompts in /debug/peers, as it advertises it.
type HashingStatus struct {
	Fingerprint string `json:"fingerprint,omitempty"`
	// Mismatches counts the peers whose hashing differs (kvroute_peers_hashing_mismatch).
	Mismatches int `json:"mismatches"`
}

// status sets, in into's entry of each member as last compared (made where missing), what
// the member advertises of w's subject and whether it matches; it returns how many differed.
func (w *policyWatch) status(into map[string]*PeerPolicy) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	differ := 0
	for name, p := range w.peers {
		pp := into[name]
		if pp == nil {
			pp = &PeerPolicy{Name: name}
			into[name] = pp
		}
		var m *bool
		if p.own.known() && p.id.known() {
			m = new(!p.differ)
		}
		if w.about.named {
			pp.Policy, pp.Fingerprint, pp.Matches = p.id.name, p.id.fp, m
		} else {
			pp.Hashing, pp.HashingMatches = p.id.fp, m
		}
		if p.differ {
			differ++
		}
	}
	return differ
}

// peerPolicies lists the entries of byName, by name.
func peerPolicies(byName map[string]*PeerPolicy) []PeerPolicy {
	out := make([]PeerPolicy, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, *byName[name])
	}
	return out
}
