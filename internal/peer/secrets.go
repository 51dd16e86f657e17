package peer

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/hashicorp/memberlist"
)

// Rotating the shared secret without a restart, and without replicas that cannot hear each
// other on the way: a replica signs with one secret and accepts two. The operator makes every
// replica accept the new secret (signing with the old), then sign with the new (accepting the
// old), then drop the old; at each step every replica accepts what every other one signs with.
// Gossip is encrypted with the signing secret's key and decrypted with either (memberlist's
// keyring); a stream is signed with the key its request was signed with, so that both ends use
// a key both accept, and a stream whose key is no longer accepted ends (its follower comes
// back under a key in force).

// keySet is the keys derived from the secrets in force.
type keySet struct {
	sign   []byte   // the message key this replica signs its requests with
	accept [][]byte // the message keys accepted: sign's first
	gossip [][]byte // memberlist's keys: the signing secret's first
}

func newKeySet(secret, accept []byte) *keySet {
	mac, gossip := keys(secret)
	ks := &keySet{sign: mac, accept: [][]byte{mac}, gossip: [][]byte{gossip}}
	if accept != nil {
		if mac2, gossip2 := keys(accept); !bytes.Equal(mac2, mac) {
			ks.accept = append(ks.accept, mac2)
			ks.gossip = append(ks.gossip, gossip2)
		}
	}
	return ks
}

// accepts says whether a message key is one of those in force.
func (ks *keySet) accepts(key []byte) bool {
	return slices.ContainsFunc(ks.accept, func(k []byte) bool { return bytes.Equal(k, key) })
}

func (ks *keySet) equal(o *keySet) bool {
	return slices.EqualFunc(ks.accept, o.accept, bytes.Equal)
}

// keyring is memberlist's keyring of the gossip keys.
func (ks *keySet) keyring() (*memberlist.Keyring, error) {
	return memberlist.NewKeyring(ks.gossip[1:], ks.gossip[0])
}

// checkSecrets checks the secrets' lengths.
func checkSecrets(secret, accept []byte) error {
	if len(secret) < 32 {
		return fmt.Errorf("peers: a secret of %d bytes, want at least 32", len(secret))
	}
	if accept != nil && len(accept) < 32 {
		return fmt.Errorf("peers: an accepted secret of %d bytes, want at least 32", len(accept))
	}
	return nil
}

// SetSecrets changes the secrets while the node runs: it signs with secret from now on and
// accepts secret and accept (nil: none). The streams under a key no longer accepted end, both
// ways; the others go on.
func (n *Node) SetSecrets(secret, accept []byte) error {
	if err := checkSecrets(secret, accept); err != nil {
		return err
	}
	n.secretMu.Lock()
	defer n.secretMu.Unlock()
	ks := newKeySet(secret, accept)
	if ks.equal(n.keys.Load()) {
		return nil
	}
	// The new keys go into the keyring before the primary changes and the old ones leave
	// after, so that gossip is never sealed with a key the keyring lacks.
	for _, k := range ks.gossip {
		if err := n.keyring.AddKey(k); err != nil {
			return fmt.Errorf("peers: %w", err)
		}
	}
	if err := n.keyring.UseKey(ks.gossip[0]); err != nil {
		return fmt.Errorf("peers: %w", err)
	}
	for _, k := range n.keyring.GetKeys() {
		if !slices.ContainsFunc(ks.gossip, func(g []byte) bool { return bytes.Equal(g, k) }) {
			if err := n.keyring.RemoveKey(k); err != nil {
				return fmt.Errorf("peers: %w", err)
			}
		}
	}
	n.keys.Store(ks)
	next := make(chan struct{})
	close(*n.rekeyed.Swap(&next))
	n.clock.cutStreams(ks.accepts)
	// The addresses that refused gossip sealed with the old secret may take the new one.
	n.joins.reset()
	n.log.Info("peers secrets changed", "accepting", len(ks.accept))
	return nil
}
