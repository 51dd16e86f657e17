package peer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/internal/route"
)

// peerInfo is a peer as membership knows it.
type peerInfo struct {
	name string
	inc  uint64
	feed string // host:port of its event stream server
}

func (p peerInfo) origin() uint64 { return origin(p.name, p.inc) }

// following is the goroutine that follows one peer's events.
type following struct {
	p      peerInfo
	cancel context.CancelFunc
	done   chan struct{}
	heard  atomic.Int64 // unix nanoseconds of the last message from p (or of the start)
	// connected is set while a stream from p is open and has said hello.
	connected atomic.Bool
	// next is the number of the batch of p's feed this replica needs next (0: none known: no
	// stream yet, a peer of minor 3 or older, or a stream whose batch could not be decoded),
	// and dec the decoder that decoded those before, whose block lists the next batches may
	// refer to: a stream that breaks resumes from there (hub.subscribe). Only follow's
	// goroutine touches them.
	next uint64
	dec  *decoder
}

// keptResume is where the stream of a peer let go left off: the peer declared dead (paused, cut
// off for seconds) or this replica cut off (fault injection). A peer that comes back with the
// same incarnation (the same run: a pause, a network blip) is followed again from there, and its
// log (logAge) replays what it published meanwhile; before, its new stream started afresh and
// the requests routed in the gap were never counted here, their first tokens and ends dropped
// as before_stream. Its requests in flight are ended here all the same when it is let go
// (ForgetOrigin): their late events are ended_here.
type keptResume struct {
	inc   uint64
	next  uint64
	dec   *decoder
	heard time.Time // when the peer's stream last carried a message
}

// maxKeptResumes bounds the resume points kept: beyond, the oldest goes. Each holds a decoder
// (its last 16 block lists, which the lifecycle holds anyway, and up to 1,024 short strings).
// A point is kept logAge after its peer was last heard at most: the peer's log holds no longer,
// and its next stream would start afresh all the same.
const maxKeptResumes = 64

// keepResume keeps where f, let go, left off (n.mu held; f's goroutine has ended).
func (n *Node) keepResume(f *following) {
	if f.next == 0 || f.dec == nil {
		return
	}
	n.kept[f.p.name] = keptResume{inc: f.p.inc, next: f.next, dec: f.dec, heard: time.Unix(0, f.heard.Load())}
}

// pruneKept lets go of the resume points older than logAge, then of the oldest beyond
// maxKeptResumes (n.mu held).
func (n *Node) pruneKept(now time.Time) {
	for name, k := range n.kept {
		if now.Sub(k.heard) >= logAge {
			delete(n.kept, name)
		}
	}
	for len(n.kept) > maxKeptResumes {
		oldest := ""
		for name, k := range n.kept {
			if oldest == "" || k.heard.Before(n.kept[oldest].heard) {
				oldest = name
			}
		}
		delete(n.kept, oldest)
	}
}

// takeResume gives f, a new follower, the point its peer's run left off at, if one is kept,
// and says whether it did (n.mu held). A point of another run is dropped.
func (n *Node) takeResume(f *following) bool {
	k, ok := n.kept[f.p.name]
	if !ok {
		return false
	}
	delete(n.kept, f.p.name)
	if k.inc != f.p.inc {
		return false
	}
	f.next, f.dec = k.next, k.dec
	return true
}

// follow reads p's event stream until ctx ends, reconnecting after a pause that grows while
// it keeps failing.
func (n *Node) follow(ctx context.Context, f *following) {
	p := f.p
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := n.stream(ctx, p, f)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		n.log.Debug("peer stream broke, reconnecting", "from", p.name, "err", err, "after", backoff.String())
		// Jitter, so that peers that lost each other at once do not come back in step.
		wait := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// errStream is an ordinary end of a stream (the peer went, restarted or refused).
var errStream = errors.New("stream ended")

// stream reads one connection of p's event stream: it reconciles the attempts in flight with
// the hello, then replays every batch on the lifecycle in force, until the stream ends, falls
// silent, or carries a message that must be refused. When an earlier stream of p's run left
// off at a known batch, it asks to resume after it: the batches missed come first, and the
// hello's attempts in flight are reconciled once they are applied.
func (n *Node) stream(ctx context.Context, p peerInfo, f *following) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	key := n.keys.Load().sign
	req, nonce, err := n.newRequest(ctx, p, pathFeed, key)
	if err != nil {
		return err
	}
	asked := f.next
	if asked == 0 || f.dec == nil {
		asked, f.dec = 0, &decoder{}
	} else {
		askResume(req, key, p.inc, asked-1)
	}
	// A stream silent for longer than a few heartbeats is dead, even if its connection is not:
	// the node's clock checks when its last message came (to within a tick) and cancels it.
	w, unwatch := n.clock.watchStream(cancel, key)
	defer unwatch()
	resp, err := n.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %s answered %s", errStream, p.name, resp.Status)
	}
	n.m.Streams.Inc()
	defer n.m.Streams.Dec()
	defer f.connected.Store(false)
	in := n.newInbound(resp.Body, key)
	in.dec = f.dec
	var seq uint64
	var evs []route.Event // the batch's, reused
	orig := p.origin()
	// live is the first live batch of a resumed stream, and hello the attempts its hello said
	// in flight, reconciled once the batches before live are applied.
	var live uint64
	var hello map[uint64]bool
	numbered := false // the hello said which of the feed's batches come
	for {
		h, msg, err := in.next()
		if err != nil {
			return err
		}
		now := time.Now()
		w.last.Store(now.UnixNano())
		f.heard.Store(now.UnixNano())
		switch {
		case h.nonce != nonce || h.seq != seq+1:
			return n.refused(fmt.Errorf("%w: frame %d of a stream at %d, or of another stream", errReplayed, h.seq, seq))
		case h.from != p.name || h.inc != p.inc:
			// The peer restarted: membership will say so, and the next stream follows it.
			return fmt.Errorf("%w: %s/%d answered for %s/%d", errStream, h.from, h.inc, p.name, p.inc)
		}
		seq = h.seq
		switch h.kind {
		case kindHello:
			ids, next, lv, err := decodeHello(msg, h.trailing)
			if err != nil {
				return n.refused(err)
			}
			if next != asked || asked == 0 {
				// A stream that starts afresh: its references are to its own events.
				f.dec.ring.reset()
			}
			f.next, live, numbered = next, lv, next > 0
			if next < live {
				// The batches missed come first: an attempt that ended meanwhile ends with its
				// own done, not as one the hello leaves out.
				hello = ids
			} else {
				n.share.Load().Reconcile(orig, ids)
			}
			f.connected.Store(true)
		case kindBatch:
			// The whole batch is decoded before any of it is applied: a malformed message
			// changes nothing.
			cnt, _, _ := msgp.ReadArrayHeaderBytes(msg)
			evs, err = in.dec.batch(msg, orig, evs[:0])
			if err != nil {
				f.next = 0 // its block lists may hold part of the batch: the next stream starts afresh
				return n.refused(err)
			}
			if len(evs) > 0 {
				n.m.Lag.Observe(max(now.Sub(time.Unix(0, h.sentAt)).Seconds(), 0))
				n.in.events.Add(float64(len(evs)))
				n.lifecycle().ApplyBatch(evs, n.countDrop)
				clear(evs) // the blocks now belong to the lifecycle
			}
			switch {
			case cnt == 0:
				continue // a heartbeat
			case !numbered:
				f.next = 0 // a feed of minor 3 or older, or a batch before the hello
				continue
			}
			f.next++
			if hello != nil && f.next >= live {
				n.share.Load().Reconcile(orig, hello)
				hello = nil
			}
		}
		// Other kinds are a newer minor version's: skipped.
	}
}

// inbound reads a stream's messages.
type inbound struct {
	n     *Node
	br    *bufio.Reader
	mac   hash.Hash
	dec   *decoder
	buf   []byte
	bytes int // read so far
}

// newInbound reads messages signed with key.
func (n *Node) newInbound(body io.Reader, key []byte) *inbound {
	return &inbound{n: n, br: bufio.NewReaderSize(body, 64<<10), mac: hmac.New(sha256.New, key), dec: &decoder{}}
}

// next reads the next message: its header, and its payload (valid until the next call). An
// error of the wire is counted (refused).
func (in *inbound) next() (header, []byte, error) {
	msg, buf, err := readFrameMAC(in.br, in.mac, in.n.cfg.MaxMessageBytes, in.buf)
	in.buf = buf
	if err != nil {
		return header{}, nil, in.n.refused(err)
	}
	size := 4 + macSize + len(msg)
	in.bytes += size
	in.n.in.messages.Inc()
	in.n.in.bytes.Add(float64(size))
	h, payload, err := decodeHeader(msg)
	if err != nil {
		return h, nil, in.n.refused(err)
	}
	return h, payload, nil
}

// countDrop counts an event the lifecycle did not apply, by why.
func (n *Node) countDrop(d route.Drop) { n.m.Dropped.WithLabelValues(d.String()).Inc() }

// refused counts a message refused for a reason of the wire, and returns err.
func (n *Node) refused(err error) error {
	if r := reason(err); r != "" {
		n.m.Dropped.WithLabelValues(r).Inc()
		n.log.Warn("peer message refused", "reason", r, "err", err)
	}
	return err
}

// decodeHello decodes a hello's payload and the trailing fields after it: the IDs of the
// sender's attempts in flight, and (minor 4's, 0 from an older sender) the feed's numbers of
// the stream's first batch and of its first live one.
func decodeHello(payload []byte, trailing int) (ids map[uint64]bool, next, live uint64, err error) {
	cnt, b, err := arrayLen(payload, "hello")
	if err != nil {
		return nil, 0, 0, err
	}
	ids = make(map[uint64]bool, cnt)
	r := reader{b: b}
	for range cnt {
		ids[r.uint()] = true
	}
	if trailing >= 2 {
		next, live = r.uint(), r.uint()
		if r.err == nil && (next == 0 || live < next) {
			r.err = fmt.Errorf("feed from batch %d, live from %d", next, live)
		}
	}
	if r.err != nil {
		return nil, 0, 0, fmt.Errorf("%w: hello: %v", errMalformed, r.err)
	}
	return ids, next, live, nil
}

// snapshotResult is what a snapshot held; stale counts the events of attempts left out, their
// origin not alive here.
type snapshotResult struct {
	entries, flights, bytes, stale int
	taken                          int64
}

// ofLiveOrigins keeps, of a snapshot's attempts in flight, those whose origin is a replica
// alive here: the peer's own and its other peers'. A peer still counts the attempts of a
// replica that died until it sees it gone, and this replica may be that one restarted (a crash,
// a rolling restart), its previous life's attempts never to end: taken, each would count as
// load on its endpoint until request_ttl (5 minutes by default), steering requests off the
// instance that holds their prefix (TestReplicas saw 2 of 12 such misses after a restart).
func (n *Node) ofLiveOrigins(evs []route.Event) (kept []route.Event, dropped int) {
	live := map[uint64]bool{}
	for _, q := range n.alive() {
		live[q.origin()] = true
	}
	kept = evs[:0]
	for _, ev := range evs {
		if live[ev.Origin] {
			kept = append(kept, ev)
		}
	}
	return kept, len(evs) - len(kept)
}

// fetchSnapshot takes p's snapshot and applies it: the policy's state, then the attempts in
// flight. Nothing is applied unless the whole snapshot arrived.
func (n *Node) fetchSnapshot(ctx context.Context, p peerInfo) (snapshotResult, error) {
	var res snapshotResult
	// The answer's head must come within snapshotHeadWait: a peer that accepts the connection
	// and never answers (frozen, or not a kvroute) must not take the whole warm start while
	// the others wait their turn. The body then has the whole of ctx.
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	key := n.keys.Load().sign
	req, nonce, err := n.newRequest(hctx, p, pathSnapshot, key)
	if err != nil {
		return res, err
	}
	wait := n.snapshotHeadWait()
	head := time.AfterFunc(wait, func() { cancel(fmt.Errorf("no answer within %v", wait)) })
	resp, err := n.client.Do(req)
	head.Stop()
	if err != nil {
		if c := context.Cause(hctx); c != nil && ctx.Err() == nil {
			err = c
		}
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("%w: %s answered %s", errStream, p.name, resp.Status)
	}
	in := n.newInbound(resp.Body, key)
	var idx bytes.Buffer
	var flights []route.Event
	var seq uint64
	for {
		h, msg, err := in.next()
		res.bytes = in.bytes
		if err != nil {
			return res, err
		}
		if h.nonce != nonce || h.seq != seq+1 || h.from != p.name {
			return res, n.refused(fmt.Errorf("%w: snapshot frame %d after %d, or of another stream", errReplayed, h.seq, seq))
		}
		seq = h.seq
		res.taken = h.sentAt
		switch h.kind {
		case kindIndex:
			piece, _, err := msgp.ReadBytesZC(msg)
			if err != nil {
				return res, n.refused(fmt.Errorf("%w: index piece: %v", errMalformed, err))
			}
			if int64(idx.Len()+len(piece)) > n.cfg.SnapshotMaxBytes {
				return res, n.refused(fmt.Errorf("%w: snapshot over %d bytes", errOversized, n.cfg.SnapshotMaxBytes))
			}
			idx.Write(piece)
		case kindFlights:
			before := len(flights)
			if flights, err = in.dec.batch(msg, p.origin(), flights); err != nil {
				return res, n.refused(err)
			}
			if len(flights) > route.DefaultMaxRemote {
				return res, n.refused(fmt.Errorf("%w: %d attempts in flight", errMalformed, len(flights)-before))
			}
		case kindEnd:
			if idx.Len() > 0 {
				if res.entries, err = n.readIndex(&idx); err != nil {
					return res, fmt.Errorf("snapshot of %s: %w", p.name, err)
				}
			}
			flights, res.stale = n.ofLiveOrigins(flights)
			n.lifecycle().ApplyBatch(flights, func(route.Drop) { res.flights-- })
			res.flights += len(flights)
			return res, nil
		}
	}
}
