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
//
// The batches are numbered (the feed's sequence, from 1 in each run) and the recent ones kept
// in a log, so that a peer whose stream broke is sent, when it comes back, what it missed
// (docs/replicas.md, "Reconnecting"). The log is kept while a peer subscribes and for logAge
// after the last one left; with no peer for that long, publishing does nothing at all again.
type hub struct {
	maxBatch int
	queue    int
	interval time.Duration
	dropped  prometheus.Counter // queue_full
	nsubs    atomic.Int32
	// logging is keep, read without the lock: with no subscriber and no logging, publish
	// returns at once.
	logging atomic.Bool
	timer   *time.Timer // flushes the pending batch; armed by its first event
	sweeper *time.Timer // ages the log out, and ends its keeping logAge after the last stream

	free sync.Pool // *batch, whose buffer every stream and the log have let go: the next pending one

	mu     sync.Mutex
	pend   []byte // encoded events
	count  int    // events in pend
	blocks int    // the block hashes of pend's events, whole (maxBatchBlocks)
	first  int64  // when the oldest of them happened, unix nanoseconds
	subs   map[*sub]struct{}
	// ring is the block lists of the last routed events encoded, which the next ones refer
	// to. Every stream carries every batch encoded since it subscribed (a stream that loses
	// one is sent no more, and ends), so a reference back to the last few means the same
	// event at every receiver; a new stream starts it empty. A resumed stream's receiver
	// keeps its ring from the stream before: it has decoded every batch up to the point it
	// resumes from, so it holds every list a resent batch may refer to (a reference never
	// reaches past a reset, and the ring was reset when that receiver's first stream began).
	ring blockRing
	log  feedLog
	// keep: the log records the feed (a stream subscribes, or the last one left less than
	// logAge ago, at left); sweeping: the sweeper is armed.
	keep, sweeping bool
	left           time.Time
	// resumed, refused and resent count streams that resumed, resumes refused for want of
	// history (or of another run) and batches resent (Status).
	resumed, refused, resent atomic.Int64
}

// The feed's log bounds. A follower's stream ends after 5 to 6 s of silence (its watchdog), a
// write that waits 5 to 7.5 s (the origin's deadline), a refused message or a queue_full cut,
// and the follower reconnects within its backoff (at most 5 s); a peer that stops answering
// for longer is declared dead by membership (some 5 to 10 s), and then its requests end
// anyway and its next stream starts afresh. 30 s covers the longest of those gaps twice over,
// and is how long a replica whose peers all went keeps paying for the log. The bytes: at
// 1,000 requests/s a replica sends some 110 kB/s (docs/sync-cost.md), 3.3 MB in 30 s; 8 MiB
// of buffers holds that with the slack of their capacity, and at higher rates some 70,000
// requests' events (a reconnection takes well under a second).
const (
	logAge   = 30 * time.Second
	logBytes = 8 << 20
)

// feedLog is the feed's recent batches, oldest first: every batch after base up to seq. Each
// holds one of its batch's refs, given back when it leaves the log, so that no buffer in the
// log goes back to the pool.
type feedLog struct {
	seq, base uint64
	buf       []*batch // a ring: the oldest at head
	head, n   int
	bytes     int // the capacity of the batches' buffers, and batchSize for each
	maxBytes  int
	maxAge    time.Duration
}

// batchSize is what the log counts for a batch beside its buffer: the struct and its slot.
const batchSize = 64

// at returns the log's i-th batch, oldest first.
func (l *feedLog) at(i int) *batch { return l.buf[(l.head+i)%len(l.buf)] }

// push appends b, the feed's next batch.
func (l *feedLog) push(b *batch) {
	if l.n == len(l.buf) {
		buf := make([]*batch, max(2*l.n, 64))
		for i := range l.n {
			buf[i] = l.at(i)
		}
		l.buf, l.head = buf, 0
	}
	l.buf[(l.head+l.n)%len(l.buf)] = b
	l.n++
	l.seq++
	l.bytes += cap(b.events) + batchSize
}

// pop takes the oldest batch out (the caller gives its ref back).
func (l *feedLog) pop() *batch {
	b := l.at(0)
	l.buf[l.head] = nil
	l.head = (l.head + 1) % len(l.buf)
	l.n--
	l.base++
	l.bytes -= cap(b.events) + batchSize
	return b
}

// since returns the batches after after, a ref taken on each for the stream that sends them;
// ok is false when the log does not hold all of them (or after is past seq).
func (l *feedLog) since(after uint64) (out []*batch, ok bool) {
	if after < l.base || after > l.seq {
		return nil, false
	}
	out = make([]*batch, 0, l.seq-after)
	for i := int(after - l.base); i < l.n; i++ {
		b := l.at(i)
		b.refs.Add(1)
		out = append(out, b)
	}
	return out, true
}

// batch is encoded events, shared read-only by every subscriber's stream.
type batch struct {
	events []byte
	n      int
	first  int64
	refs   atomic.Int32 // streams that have yet to write it, and the log while it holds it: the last gives the buffer back
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
	// backlog is what a resumed stream sends before ch: the batches its receiver missed,
	// from the log, each with a ref taken. The stream's goroutine alone takes from it.
	backlog []*batch
}

// feedStart is where a new stream starts in the feed: its backlog is the batches next to
// live-1, then come those from live on. resumed: its receiver asked to resume and the log
// held what it missed (next is then the batch after the one it asked after).
type feedStart struct {
	next, live uint64
	resumed    bool
}

func (s *sub) breakOff() { s.once.Do(func() { close(s.broken) }) }

func newHub(maxBatch, queue int, interval time.Duration, m *metrics.Peers) *hub {
	h := &hub{maxBatch: maxBatch, queue: queue, interval: interval, subs: map[*sub]struct{}{},
		dropped: m.Dropped.WithLabelValues("queue_full"), log: feedLog{maxBytes: logBytes, maxAge: logAge}}
	h.timer = time.AfterFunc(time.Hour, h.flush)
	h.timer.Stop()
	h.sweeper = time.AfterFunc(time.Hour, h.sweep)
	h.sweeper.Stop()
	return h
}

// publish encodes ev into the pending batch. It never blocks on a peer: with nobody
// subscribed for logAge (or ever), it does nothing at all.
func (h *hub) publish(ev *route.Event) {
	if h.nsubs.Load() == 0 && !h.logging.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.keep {
		return // the log's keeping ended since logging was read
	}
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
	// The batch takes the buffer (the streams read it while the next one fills, the log
	// keeps it); the next fills the buffer of a batch that every stream has written and the
	// log has let go, when there is one.
	b, _ := h.free.Get().(*batch)
	if b == nil {
		b = &batch{}
	}
	b.events, h.pend = h.pend, b.events[:0]
	b.n, b.first = h.count, h.first
	b.refs.Store(int32(len(h.subs)) + 1) // and the log's
	h.count, h.blocks = 0, 0
	h.logLocked(b)
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

// subscribe adds a stream. With resume, its receiver has applied this run's feed up to the
// batch after and asks for the rest: when the log still holds every batch since, they are the
// stream's backlog, sent before the live ones; otherwise the stream starts afresh, as one
// that does not ask.
func (h *hub) subscribe(after uint64, resume bool) (*sub, feedStart) {
	s := &sub{ch: make(chan *batch, h.queue), broken: make(chan struct{})}
	h.mu.Lock()
	// The new stream's receiver knows none of the events encoded so far: the pending ones go
	// to the others (and to the log), and the next refer to none of them.
	h.flushLocked()
	h.ring.reset()
	h.trimLocked(time.Now().UnixNano())
	st := feedStart{next: h.log.seq + 1, live: h.log.seq + 1}
	if resume {
		if s.backlog, st.resumed = h.log.since(after); st.resumed {
			st.next = after + 1
		}
	}
	h.subs[s] = struct{}{}
	h.keep = true
	h.logging.Store(true)
	h.mu.Unlock()
	h.nsubs.Add(1)
	return s, st
}

// unsubscribe takes a stream out, and gives back the batches it did not write.
func (h *hub) unsubscribe(s *sub) {
	h.mu.Lock()
	delete(h.subs, s)
	if len(h.subs) == 0 {
		h.left = time.Now()
		h.armSweepLocked(h.left)
	}
	h.mu.Unlock()
	h.nsubs.Add(-1)
	for _, b := range s.backlog {
		h.written(b)
	}
	s.backlog = nil
	for {
		select {
		case b := <-s.ch:
			h.written(b)
		default:
			return
		}
	}
}

// logLocked appends b, just flushed, to the log, and lets go of what is too old or beyond
// the log's bytes.
func (h *hub) logLocked(b *batch) {
	h.log.push(b)
	h.trimLocked(b.first)
	if !h.sweeping {
		h.armSweepLocked(time.Unix(0, b.first))
	}
}

// trimLocked lets go of the log's batches older than maxAge at now (unix nanoseconds), and
// of the oldest while the log holds more than maxBytes.
func (h *hub) trimLocked(now int64) {
	l := &h.log
	for l.n > 0 && (l.bytes > l.maxBytes || l.at(0).first < now-int64(l.maxAge)) {
		h.written(l.pop())
	}
}

// armSweepLocked arms the sweeper for when the log's oldest batch ages out or its keeping
// ends, whichever comes first; not at all when neither will.
func (h *hub) armSweepLocked(now time.Time) {
	var due time.Time
	if h.log.n > 0 {
		due = time.Unix(0, h.log.at(0).first).Add(h.log.maxAge)
	}
	if h.keep && len(h.subs) == 0 && (due.IsZero() || h.left.Add(h.log.maxAge).Before(due)) {
		due = h.left.Add(h.log.maxAge)
	}
	h.sweeping = !due.IsZero()
	if h.sweeping {
		h.sweeper.Reset(max(due.Sub(now), 10*time.Millisecond))
	}
}

// sweep ages the log out; when no stream has subscribed for logAge, it ends the keeping: the
// log is let go, a number of the feed skipped (events are no longer encoded: no stream may
// resume from before), and publishing does nothing again.
func (h *hub) sweep() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if h.keep && len(h.subs) == 0 && now.Sub(h.left) >= h.log.maxAge {
		h.flushLocked()
		h.keep = false
		h.logging.Store(false)
		for h.log.n > 0 {
			h.written(h.log.pop())
		}
		h.log.seq++
		h.log.base = h.log.seq
		h.log.buf, h.log.head = nil, 0
	}
	h.trimLocked(now.UnixNano())
	h.armSweepLocked(now)
}

// FeedStatus is a replica's own feed as GET /debug/peers shows it: the number of its last
// batch, its log (batches and their buffers' bytes), the streams that resumed, the batches
// resent to them, and the resumes refused.
type FeedStatus struct {
	Seq        uint64 `json:"seq"`
	LogBatches int    `json:"log_batches"`
	LogBytes   int    `json:"log_bytes"`
	Resumed    int64  `json:"streams_resumed"`
	Resent     int64  `json:"batches_resent"`
	Refused    int64  `json:"resumes_refused"`
}

func (h *hub) stats() FeedStatus {
	h.mu.Lock()
	st := FeedStatus{Seq: h.log.seq, LogBatches: h.log.n, LogBytes: h.log.bytes}
	h.mu.Unlock()
	st.Resumed, st.Resent, st.Refused = h.resumed.Load(), h.resent.Load(), h.refused.Load()
	return st
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
	return f.writeFields(kind, sentAt, 0, extra, payload)
}

// writeFields is write for a message whose extra, or payload, ends with trailing fields after
// the payload (a newer minor version's, which older ones skip).
func (f *frameWriter) writeFields(kind int, sentAt int64, trailing int, extra func([]byte) []byte, payload []byte) error {
	f.seq++
	b := append(f.buf[:0], make([]byte, frameStart)...)
	b = appendHeader(b, &header{from: f.n.cfg.Name, inc: f.n.cfg.Incarnation, nonce: f.nonce, seq: f.seq, sentAt: sentAt, kind: kind, trailing: trailing})
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
// here, then, for a peer that resumes, the batches it missed, then every batch, with
// heartbeats while idle, until the peer goes, falls behind, or this replica is cut off.
func (n *Node) serveFeed(w http.ResponseWriter, r *http.Request) {
	nonce, key, ok := n.authorize(w, r, pathFeed)
	if !ok {
		return
	}
	inc, after, resume, err := resumePoint(r, key)
	if err != nil {
		n.m.Dropped.WithLabelValues("unauthenticated").Inc()
		n.log.Debug("peer request refused", "remote", r.RemoteAddr, "err", err)
		http.Error(w, "not a peer", http.StatusForbidden)
		return
	}
	rekeyed := *n.rekeyed.Load()
	// A point in another run's feed (this replica restarted at the same address) is no point
	// in this one's.
	s, start := n.hub.subscribe(after, resume && inc == n.cfg.Incarnation)
	defer n.hub.unsubscribe(s)
	switch {
	case start.resumed:
		n.hub.resumed.Add(1)
		n.m.Resumes.WithLabelValues("resumed").Inc()
	case resume && inc != n.cfg.Incarnation:
		n.hub.refused.Add(1)
		n.m.Resumes.WithLabelValues("other_run").Inc()
	case resume:
		n.hub.refused.Add(1)
		n.m.Resumes.WithLabelValues("no_history").Inc()
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	f := &frameWriter{n: n, w: w, rc: http.NewResponseController(w), nonce: nonce, key: key}
	var ids []uint64
	if sh := n.share.Load(); sh != nil {
		ids = sh.LocalIDs()
	}
	err = f.writeFields(kindHello, time.Now().UnixNano(), helloTrailing, func(b []byte) []byte { return appendHello(b, ids, start) }, nil)
	if err != nil {
		return
	}
	// The backlog first: the batches the peer missed, in order, before any that came since.
	for len(s.backlog) > 0 {
		b := s.backlog[0]
		s.backlog[0] = nil
		s.backlog = s.backlog[1:]
		err = f.writeBatch(b)
		n.hub.written(b)
		if err != nil {
			n.log.Debug("peer stream ended", "err", err)
			return
		}
		n.hub.resent.Add(1)
		n.m.Resent.Inc()
		select {
		case <-s.broken:
			return
		case <-r.Context().Done():
			return
		case <-n.stopping:
			return
		default:
		}
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

// appendHello appends a hello's payload, the IDs of the attempts in flight, and its
// helloTrailing fields: where the stream starts in the feed (wire.go).
func appendHello(b []byte, ids []uint64, st feedStart) []byte {
	b = msgp.AppendArrayHeader(b, uint32(len(ids)))
	for _, id := range ids {
		b = msgp.AppendUint64(b, id)
	}
	return msgp.AppendUint64(msgp.AppendUint64(b, st.next), st.live)
}

// helloTrailing is the fields after a hello's payload: next and live.
const helloTrailing = 2

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
