package peer

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/route"
)

// hub is the sending side: the lifecycle's events, encoded as they happen into the pending
// batch, handed to each subscriber's bounded queue one batch interval after the batch's first
// event (or when it is full). No event, no timer: an idle replica wakes for nothing.
type hub struct {
	maxBatch int
	queue    int
	interval time.Duration
	dropped  prometheus.Counter // queue_full
	nsubs    atomic.Int32
	timer    *time.Timer // flushes the pending batch; armed by its first event

	free sync.Pool // *batch, whose buffer every stream has written: the next pending one

	mu     sync.Mutex
	pend   []byte // encoded events
	count  int    // events in pend
	blocks int    // the block hashes of pend's events, whole (maxBatchBlocks)
	first  int64  // when the oldest of them happened, unix nanoseconds
	subs   map[*sub]struct{}
	// ring is the block lists of the last routed events encoded, which the next ones refer
	// to. Every stream carries every batch encoded since it subscribed (a stream that loses
	// one is sent no more, and ends), so a reference back to the last few means the same
	// event at every receiver; a new stream starts it empty.
	ring blockRing
}

// batch is encoded events, shared read-only by every subscriber's stream.
type batch struct {
	events []byte
	n      int
	first  int64
	refs   atomic.Int32 // streams that have yet to write it: the last gives the buffer back
}

// maxPooled bounds the buffers kept for reuse: a burst's large batch is left to the GC.
const maxPooled = 256 << 10

// sub is one peer's stream: its queue, and a signal that it lost a batch (the stream must end
// so that the peer reconnects and reconciles).
type sub struct {
	ch     chan *batch
	broken chan struct{}
	once   sync.Once
	lost   bool // a batch did not fit its queue: it gets no more (hub.mu)
}

func (s *sub) breakOff() { s.once.Do(func() { close(s.broken) }) }

func newHub(maxBatch, queue int, interval time.Duration, m *metrics.Peers) *hub {
	h := &hub{maxBatch: maxBatch, queue: queue, interval: interval, subs: map[*sub]struct{}{},
		dropped: m.Dropped.WithLabelValues("queue_full")}
	h.timer = time.AfterFunc(time.Hour, h.flush)
	h.timer.Stop()
	return h
}

// publish encodes ev into the pending batch. It never blocks on a peer: with nobody
// subscribed it does nothing at all.
func (h *hub) publish(ev *route.Event) {
	if h.nsubs.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev.Kind == route.EventRouted && h.count > 0 && h.blocks+len(ev.Blocks) > maxBatchBlocks {
		h.flushLocked()
	}
	b, err := h.ring.appendEvent(h.pend, ev)
	if err != nil {
		return
	}
	h.pend = b
	if ev.Kind == route.EventRouted {
		h.blocks += len(ev.Blocks)
	}
	if h.count == 0 {
		// The clock is read for a batch's first event only: the lag a receiver measures is
		// that of the batch's oldest event.
		h.first = time.Now().UnixNano()
		h.timer.Reset(h.interval)
	}
	h.count++
	if len(h.pend) >= h.maxBatch {
		h.flushLocked()
	}
}

// flush hands the pending batch to the subscribers.
func (h *hub) flush() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.flushLocked()
}

func (h *hub) flushLocked() {
	if h.count == 0 {
		return
	}
	// The batch takes the buffer (the streams read it while the next one fills); the next
	// fills the buffer of a batch that every stream has written, when there is one.
	b, _ := h.free.Get().(*batch)
	if b == nil {
		b = &batch{}
	}
	b.events, h.pend = h.pend, b.events[:0]
	b.n, b.first = h.count, h.first
	b.refs.Store(int32(len(h.subs)))
	h.count, h.blocks = 0, 0
	for s := range h.subs {
		if s.lost {
			// Its stream may still be writing what its queue holds: nothing after the gap,
			// whose references would name other events at the receiver.
			h.dropped.Add(float64(b.n))
			h.written(b)
			continue
		}
		select {
		case s.ch <- b:
		default:
			// The peer does not keep up: its stream ends, and it reconciles when it comes back.
			s.lost = true
			s.breakOff()
			h.dropped.Add(float64(b.n))
			h.written(b)
		}
	}
}

// written tells the hub that a stream is done with b (written, or not to be).
func (h *hub) written(b *batch) {
	if b.refs.Add(-1) == 0 && cap(b.events) <= maxPooled {
		h.free.Put(b)
	}
}

func (h *hub) subscribe() *sub {
	s := &sub{ch: make(chan *batch, h.queue), broken: make(chan struct{})}
	h.mu.Lock()
	// The new stream's receiver knows none of the events encoded so far: the pending ones go
	// to the others, and the next refer to none of them.
	h.flushLocked()
	h.ring.reset()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	h.nsubs.Add(1)
	return s
}

func (h *hub) unsubscribe(s *sub) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
	h.nsubs.Add(-1)
}

// breakAll ends every stream (the replica is cut off from its peers).
func (h *hub) breakAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		s.breakOff()
	}
}

// frameWriter writes one stream's frames: its nonce, its sequence, a deadline on each write.
type frameWriter struct {
	n     *Node
	key   []byte    // the key the frames are signed with
	mac   hash.Hash // nil until the first frame
	w     io.Writer
	rc    *http.ResponseController
	nonce [nonceSize]byte
	seq   uint64
	buf   []byte // the frame being written, reused
	// last is when the last frame was written; renew is when the write deadline is to be
	// moved on. Setting a deadline arms a timer in the runtime's poller: it is set for half
	// as long again as writeTimeout and renewed once half of that has passed, rather than
	// set anew for every frame, so that a write may always wait writeTimeout at least.
	last, renew time.Time
}

// write sends one message of kind: the header, then what extra appends (the payload's start,
// such as an array's length), then payload, as one frame written at once.
func (f *frameWriter) write(kind int, sentAt int64, extra func([]byte) []byte, payload []byte) error {
	f.seq++
	b := append(f.buf[:0], make([]byte, frameStart)...)
	b = appendHeader(b, &header{from: f.n.cfg.Name, inc: f.n.cfg.Incarnation, nonce: f.nonce, seq: f.seq, sentAt: sentAt, kind: kind})
	if extra != nil {
		b = extra(b)
	}
	b = append(b, payload...)
	f.buf = b
	if f.mac == nil {
		f.mac = hmac.New(sha256.New, f.key)
	}
	sealFrame(b, f.mac)
	f.last = time.Now()
	if f.rc != nil && !f.last.Before(f.renew) {
		_ = f.rc.SetWriteDeadline(f.last.Add(3 * writeTimeout / 2))
		f.renew = f.last.Add(writeTimeout / 2)
	}
	if _, err := f.w.Write(b); err != nil {
		return err
	}
	if f.rc != nil {
		if err := f.rc.Flush(); err != nil {
			return err
		}
	}
	f.n.out.messages.Inc()
	f.n.out.bytes.Add(float64(len(b)))
	return nil
}

func (f *frameWriter) writeBatch(b *batch) error {
	err := f.write(kindBatch, b.first, func(p []byte) []byte { return msgp.AppendArrayHeader(p, uint32(b.n)) }, b.events)
	if err == nil {
		f.n.out.events.Add(float64(b.n))
	}
	return err
}

// Timing of the streams.
const (
	// heartbeat: an idle stream carries an empty batch this often, so that the receiver can
	// tell a quiet peer from a dead connection.
	heartbeat = time.Second
	// streamSilence: a stream with no message for this long is given up and reopened.
	streamSilence = 5 * heartbeat
	// writeTimeout bounds each write to a peer: one that does not read is cut off.
	writeTimeout = 5 * time.Second
)

// serveFeed streams this replica's events to a peer: a hello with the attempts in flight
// here, then every batch, with heartbeats while idle, until the peer goes, falls behind, or
// this replica is cut off.
func (n *Node) serveFeed(w http.ResponseWriter, r *http.Request) {
	nonce, key, ok := n.authorize(w, r, pathFeed)
	if !ok {
		return
	}
	rekeyed := *n.rekeyed.Load()
	s := n.hub.subscribe()
	defer n.hub.unsubscribe(s)
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	f := &frameWriter{n: n, w: w, rc: http.NewResponseController(w), nonce: nonce, key: key}
	var ids []uint64
	if sh := n.share.Load(); sh != nil {
		ids = sh.LocalIDs()
	}
	err := f.write(kindHello, time.Now().UnixNano(), func(b []byte) []byte {
		b = msgp.AppendArrayHeader(b, uint32(len(ids)))
		for _, id := range ids {
			b = msgp.AppendUint64(b, id)
		}
		return b
	}, nil)
	if err != nil {
		return
	}
	// A heartbeat goes out at a tick of the node's clock (once a beat) when the stream has
	// carried nothing for half a beat, so that an idle stream carries one a beat and one in use
	// none, and an idle replica wakes once a beat for all its streams and its other work.
	beat := n.clock.beats()
	for {
		select {
		case b := <-s.ch:
			err = f.writeBatch(b)
			n.hub.written(b)
		case <-beat:
			beat = n.clock.beats()
			if time.Since(f.last) < n.beat/2 {
				continue
			}
			err = f.writeBatch(&batch{first: time.Now().UnixNano()})
		case <-s.broken:
			return
		case <-rekeyed:
			rekeyed = *n.rekeyed.Load()
			if !n.keys.Load().accepts(key) {
				n.log.Info("peer stream ended: its key is no longer accepted", "peer", r.URL.Query().Get("from"))
				return
			}
			continue
		case <-r.Context().Done():
			return
		case <-n.stopping:
			return
		}
		if err != nil {
			n.log.Debug("peer stream ended", "err", err)
			return
		}
	}
}

// serveSnapshot sends what a new replica starts from: the policy's snapshot in pieces, the
// attempts in flight (local and remote), the engines found stalled and those ejected for
// failures of their own doing, and an end that counts them.
func (n *Node) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	nonce, key, ok := n.authorize(w, r, pathSnapshot)
	if !ok {
		return
	}
	taken := time.Now().UnixNano()
	var idx bytes.Buffer
	entries, err := n.writeIndex(&idx)
	if err != nil {
		n.log.Warn("snapshot for a peer failed", "err", err)
		http.Error(w, "snapshot failed", http.StatusInternalServerError)
		return
	}
	var flights []route.Event
	if sh := n.share.Load(); sh != nil {
		flights = sh.InFlight()
		// The engines found stalled here, and not heard since: the new replica does not send
		// them a request first to find out (route's stalled event, as a probe would tell it).
		for _, e := range n.endpoints() {
			if from := e.StalledSince(); from > 0 {
				flights = append(flights, route.Event{Kind: route.EventStalled, Origin: sh.Self(), Endpoint: e.Name,
					Silent: time.Duration(max(taken-from, 0))})
			}
		}
		// The engines ejected here: the new replica does not send them requests that would
		// fail until it had counted its own (a failure to connect, which may be this
		// replica's path alone, is not told).
		for _, e := range n.lifecycle().Ejections() {
			flights = append(flights, route.Event{Kind: route.EventEjected, Origin: sh.Self(), Endpoint: e.Endpoint.Name, Rest: e.Rest})
		}
	}
	total := len(flights)
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	f := &frameWriter{n: n, w: w, rc: http.NewResponseController(w), nonce: nonce, key: key}
	data := idx.Bytes()
	for len(data) > 0 {
		k := min(len(data), snapshotPiece)
		piece := data[:k]
		data = data[k:]
		if err := f.write(kindIndex, taken, func(b []byte) []byte { return msgp.AppendBytesHeader(b, uint32(len(piece))) }, piece); err != nil {
			return
		}
	}
	for len(flights) > 0 {
		k := min(len(flights), snapshotFlights)
		part := flights[:k]
		flights = flights[k:]
		err := f.write(kindFlights, taken, func(b []byte) []byte {
			b = msgp.AppendArrayHeader(b, uint32(len(part)))
			for i := range part {
				b, _ = appendEvent(b, &part[i]) // a lifecycle's events: of kinds it knows
			}
			return b
		}, nil)
		if err != nil {
			return
		}
	}
	_ = f.write(kindEnd, taken, func(b []byte) []byte {
		b = msgp.AppendArrayHeader(b, 2)
		return appendInt(appendInt(b, int64(entries)), int64(total))
	}, nil)
}

// Snapshot pieces: index bytes per message, in-flight events per message.
const (
	snapshotPiece   = 256 << 10
	snapshotFlights = 512
)

// authorize checks a peer's request: its signature under a secret accepted here, addressed to
// this replica, recent; it returns the nonce and the key to sign the answer with. It answers
// the refusal itself.
func (n *Node) authorize(w http.ResponseWriter, r *http.Request, path string) (nonce [nonceSize]byte, key []byte, ok bool) {
	if n.isolated.Load() {
		http.Error(w, "cut off from peers", http.StatusServiceUnavailable)
		return nonce, nil, false
	}
	nonce, key, err := n.verifyRequest(r, path, time.Now())
	if err != nil {
		n.m.Dropped.WithLabelValues("unauthenticated").Inc()
		n.log.Debug("peer request refused", "remote", r.RemoteAddr, "err", err)
		http.Error(w, "not a peer", http.StatusForbidden)
		return nonce, nil, false
	}
	return nonce, key, true
}

// Paths of the peer API.
const (
	pathFeed     = "/peer/v1/feed"
	pathSnapshot = "/peer/v1/snapshot"
	contentType  = "application/x-kvroute-peer"
)
