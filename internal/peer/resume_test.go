package peer

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tinylib/msgp/msgp"

	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/route"
)

// predicted is what r's policy predicts cached on the endpoint named ep for a request of the
// blocks of keys.
func (r *replica) predicted(ep string, keys ...uint64) int {
	req := &policy.Request{Model: "m", BlockTokens: 16, Blocks: prefix.Chain(nil, prefix.Seed("m", ""), keys), PromptTokens: 16*len(keys) + 3}
	return r.lc.Picker().(policy.Predictor).PredictCached(req, r.ep(ep))
}

// breakStream cuts a off from its peers until the stream a sends b has ended, runs during,
// and lets a back: b's stream from a reconnects (it is refused while a is cut off).
func breakStream(t *testing.T, a, b *replica, during func()) {
	t.Helper()
	a.node.Isolate(true)
	waitFor(t, 5*time.Second, "b's stream from a to end", func() bool { return testutil.ToFloat64(b.m.Streams) == 0 })
	during()
	a.node.Isolate(false)
	waitFor(t, 10*time.Second, "b's stream from a again", func() bool {
		return testutil.ToFloat64(b.m.Streams) == 1 && isFollowing(b, "a")()
	})
}

// TestResumeAfterBreak: requests routed, and ended, while a peer's stream was down reach it
// when it comes back: their placements are in its index, the one still running counts in
// flight there, and the one that ended meanwhile ends with its own outcome, not as one the
// hello left out. Without resumption b knew none of the three requests of the gap and ended
// the first as expired.
func TestResumeAfterBreak(t *testing.T) {
	fault := func(c *Config) { c.FaultInjection = true }
	a := startReplica(t, "a", nil, fault)
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, fault)
	waitFor(t, 10*time.Second, "b following a", func() bool {
		return isFollowing(b, "a")() && testutil.ToFloat64(b.m.Streams) == 1 && b.node.Ready()
	})
	before := a.call(seqKeys(100, 20)...) // in flight across the break
	placed := a.call(seqKeys(200, 20)...) // ended before it
	placed.FirstToken()
	placed.Finish(route.Outcome{OK: true, CachedTokens: -1})
	waitFor(t, 5*time.Second, "b hearing a's first requests", func() bool {
		return b.share.Stats().Remote == 1 && b.predicted(placed.Endpoint().Name, seqKeys(200, 20)...) == 320
	})

	var gone, open *route.Call
	breakStream(t, a, b, func() {
		// Routed and ended during the break; its first 20 blocks are sent by reference to
		// the request before the break, which b decoded on its stream before.
		gone = a.call(seqKeys(200, 30)...)
		gone.FirstToken()
		gone.Finish(route.Outcome{OK: true, CachedTokens: -1})
		open = a.call(seqKeys(400, 25)...) // routed during the break, still running
		before.FirstToken()
		before.Finish(route.Outcome{OK: true, CachedTokens: -1})
	})
	// Polled rather than waited for: without resumption it never comes, and what b lacks
	// is said below.
	heard := within(5*time.Second, func() bool {
		return b.share.Stats().Remote == 1 && b.ep(open.Endpoint().Name).InFlight() == 1 && b.share.Stats().Expired == 0
	})
	if st := b.share.Stats(); !heard {
		t.Errorf("b counts %d of a's requests in flight, %d on %s; want the one running since the break", st.Remote,
			b.ep(open.Endpoint().Name).InFlight(), open.Endpoint().Name)
	}
	if got := b.predicted(gone.Endpoint().Name, seqKeys(200, 30)...); got != 480 {
		t.Errorf("b predicts %d cached tokens for the request routed during the break, want 480 (its 30 blocks)", got)
	}
	if got := b.predicted(open.Endpoint().Name, seqKeys(400, 25)...); got != 400 {
		t.Errorf("b predicts %d cached tokens for the request running since the break, want 400", got)
	}
	if st := b.share.Stats(); st.Expired != 0 {
		t.Errorf("b ended %d of a's requests without their end, want none", st.Expired)
	}
	if got := testutil.ToFloat64(a.m.Resumes.WithLabelValues("resumed")); got < 1 {
		t.Errorf("a counted %v resumed streams", got)
	}
	if got := testutil.ToFloat64(a.m.Resent); got < 1 {
		t.Errorf("a counted %v batches resent", got)
	}
	if st := a.node.Status().Feed; st.Resumed < 1 || st.Resent < 1 || st.LogBatches == 0 {
		t.Errorf("a's /debug/peers feed: %+v", st)
	}

	open.FirstToken()
	open.Finish(route.Outcome{OK: true, CachedTokens: -1})
	waitFor(t, 5*time.Second, "b seeing the last request end", func() bool { return b.share.Stats().Remote == 0 })
	if got := b.ep(open.Endpoint().Name).InFlight(); got != 0 {
		t.Errorf("b counts %d in flight at the end", got)
	}
	if st := b.share.Stats(); st.Expired != 0 || st.Dropped[route.DropDuplicate] != 0 {
		t.Errorf("b expired %d and dropped %d duplicates of a's events, want none", st.Expired, st.Dropped[route.DropDuplicate])
	}
}

// TestResumeWithoutHistory: when the origin's log no longer holds the point a peer asks to
// resume from, the stream starts afresh, as before resumption: the hello ends what ended
// meanwhile, the requests of the gap are not heard, the refusal is counted, and the stream
// carries what comes next.
func TestResumeWithoutHistory(t *testing.T) {
	fault := func(c *Config) { c.FaultInjection = true }
	a := startReplica(t, "a", nil, fault)
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, fault)
	waitFor(t, 10*time.Second, "b following a", func() bool {
		return isFollowing(b, "a")() && testutil.ToFloat64(b.m.Streams) == 1 && b.node.Ready()
	})
	before := a.call(seqKeys(100, 20)...)
	waitFor(t, 5*time.Second, "b hearing a's request", func() bool { return b.share.Stats().Remote == 1 })
	a.node.hub.mu.Lock()
	a.node.hub.log.maxBytes = 0 // a batch leaves the log as soon as it is in
	a.node.hub.mu.Unlock()
	var gone *route.Call
	breakStream(t, a, b, func() {
		gone = a.call(seqKeys(300, 30)...)
		gone.Finish(route.Outcome{OK: true, CachedTokens: -1})
		before.Finish(route.Outcome{OK: true, CachedTokens: -1})
	})
	waitFor(t, 5*time.Second, "b ending a's request with the hello", func() bool { return b.share.Stats().Remote == 0 })
	if st := b.share.Stats(); st.Expired != 1 {
		t.Errorf("b expired %d requests, want the one that ended during the break", st.Expired)
	}
	if got := b.predicted(gone.Endpoint().Name, seqKeys(300, 30)...); got != 0 {
		t.Errorf("b predicts %d cached tokens for a request it cannot have heard of", got)
	}
	if got := testutil.ToFloat64(a.m.Resumes.WithLabelValues("no_history")); got != 1 {
		t.Errorf("a counted %v resumes refused for want of history, want 1", got)
	}
	if got := testutil.ToFloat64(a.m.Resumes.WithLabelValues("resumed")) + testutil.ToFloat64(a.m.Resent); got != 0 {
		t.Errorf("a counted %v resumed streams and resent batches, want none", got)
	}
	after := a.call(seqKeys(500, 10)...)
	waitFor(t, 5*time.Second, "b hearing a's next request", func() bool { return b.ep(after.Endpoint().Name).InFlight() == 1 })
	after.Finish(route.Outcome{OK: true, CachedTokens: -1})
}

// within polls ok until it holds or d has passed, and says whether it held.
func within(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// feedReader reads a feed stream as a test's peer: the frames, verified under key.
type feedReader struct {
	t    *testing.T
	resp *http.Response
	key  []byte
	buf  []byte
}

// next reads the next message other than a heartbeat.
func (fr *feedReader) next() (header, []byte) {
	fr.t.Helper()
	for {
		msg, buf, err := readFrame(fr.resp.Body, fr.key, 1<<20, fr.buf)
		fr.buf = buf
		if err != nil {
			fr.t.Fatal(err)
		}
		h, payload, err := decodeHeader(msg)
		if err != nil {
			fr.t.Fatal(err)
		}
		if h.kind == kindBatch && len(payload) > 0 && payload[0] == 0x90 {
			continue // a heartbeat
		}
		return h, payload
	}
}

// hello reads the stream's hello: its IDs' count, and where it starts in the feed.
func (fr *feedReader) hello() (ids int, next, live uint64) {
	fr.t.Helper()
	h, payload := fr.next()
	if h.kind != kindHello {
		fr.t.Fatalf("a message of kind %d first, want the hello", h.kind)
	}
	got, next, live, err := decodeHello(payload, h.trailing)
	if err != nil {
		fr.t.Fatal(err)
	}
	return len(got), next, live
}

// TestResumeRequests: a feed request's resume point is signed with it: one forged, moved to
// another request, or on a request not signed with the secret is refused whole (403, counted
// unauthenticated) before anything of the feed is sent; a signed one resumes, and one of
// another run of the origin starts afresh.
func TestResumeRequests(t *testing.T) {
	r := startReplica(t, "r", nil, nil)
	good := &Node{cfg: Config{Name: "friend", Incarnation: 1}}
	good.keys.Store(newKeySet(secret, nil))
	key := good.keys.Load().sign
	other := &Node{cfg: Config{Name: "mallory", Incarnation: 1}}
	other.keys.Store(newKeySet(bytes.Repeat([]byte{3}, 32), nil))
	to := peerInfo{name: "r", inc: r.node.cfg.Incarnation, feed: r.node.Addr().String()}
	open := func(req *http.Request) *feedReader {
		t.Helper()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return &feedReader{t: t, resp: resp, key: key}
	}
	request := func(n *Node) *http.Request {
		q, _, err := n.newRequest(context.Background(), to, pathFeed, n.keys.Load().sign)
		if err != nil {
			t.Fatal(err)
		}
		return q
	}

	// A stream that applies the feed's first batch and breaks; two more are published.
	fr := open(request(good))
	_, first, _ := fr.hello()
	for id := range uint64(3) {
		r.node.Publish(&route.Event{Kind: route.EventDone, ID: 10 + id, OK: true})
		r.node.hub.flush()
	}
	if h, _ := fr.next(); h.kind != kindBatch {
		t.Fatalf("a message of kind %d, want a batch", h.kind)
	}
	fr.resp.Body.Close()
	waitFor(t, 5*time.Second, "the stream to end at r", func() bool { return r.node.hub.nsubs.Load() == 0 })

	unauthenticated := func() float64 { return testutil.ToFloat64(r.m.Dropped.WithLabelValues("unauthenticated")) }
	for _, c := range []struct {
		name string
		req  func() *http.Request
	}{
		{"another secret", func() *http.Request {
			q := request(other)
			askResume(q, other.keys.Load().sign, to.inc, first)
			return q
		}},
		{"the point changed after signing", func() *http.Request {
			q := request(good)
			askResume(q, key, to.inc, first)
			v := q.URL.Query()
			v.Set("resume_after", strconv.FormatUint(first-1, 10))
			q.URL.RawQuery = v.Encode()
			return q
		}},
		{"a point without its signature", func() *http.Request {
			q := request(good)
			askResume(q, key, to.inc, first)
			q.Header.Del(resumeHeader)
			return q
		}},
		{"another request's signed point", func() *http.Request {
			donor := request(good)
			askResume(donor, key, to.inc, first)
			q := request(good)
			v := q.URL.Query()
			v.Set("resume_inc", strconv.FormatUint(to.inc, 10))
			v.Set("resume_after", strconv.FormatUint(first, 10))
			q.URL.RawQuery = v.Encode()
			q.Header.Set(resumeHeader, donor.Header.Get(resumeHeader))
			return q
		}},
		{"signed three minutes ago", func() *http.Request {
			ts := time.Now().Add(-3 * time.Minute).Unix()
			nonce := bytes.Repeat([]byte{5}, nonceSize)
			u := fmt.Sprintf("http://%s%s?from=friend&inc=1&nonce=%x&ts=%d", to.feed, pathFeed, nonce, ts)
			q, _ := http.NewRequest(http.MethodGet, u, nil)
			q.Header.Set(authHeader, signRequest(key, pathFeed, "friend", 1, nonce, ts, "r"))
			askResume(q, key, to.inc, first)
			return q
		}},
	} {
		was := unauthenticated()
		resp, err := http.DefaultClient.Do(c.req())
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") == contentType || string(body) != "not a peer\n" {
			t.Errorf("%s: %s (%s), %q; want 403 and no frame", c.name, resp.Status, resp.Header.Get("Content-Type"), body)
		}
		if got := unauthenticated() - was; got != 1 {
			t.Errorf("%s: counted unauthenticated %v times, want 1", c.name, got)
		}
	}
	if got := testutil.ToFloat64(r.m.Resent); got != 0 {
		t.Errorf("%v batches resent to refused requests", got)
	}

	// Of another run of r: afresh.
	q := request(good)
	askResume(q, key, to.inc+1, first)
	fr = open(q)
	if _, next, live := fr.hello(); next != live || next != first+3 {
		t.Errorf("resume in another run: stream from %d, live from %d; want both %d", next, live, first+3)
	}
	if got := testutil.ToFloat64(r.m.Resumes.WithLabelValues("other_run")); got != 1 {
		t.Errorf("other_run counted %v times, want 1", got)
	}
	fr.resp.Body.Close()

	// Signed, of this run: the two batches after the first, then live.
	q = request(good)
	askResume(q, key, to.inc, first)
	fr = open(q)
	if _, next, live := fr.hello(); next != first+1 || live != first+3 {
		t.Errorf("resumed stream from %d, live from %d; want %d and %d", next, live, first+1, first+3)
	}
	var d decoder
	for id := uint64(11); id <= 12; id++ {
		h, payload := fr.next()
		evs, err := d.batch(payload, 1, nil)
		if err != nil || h.kind != kindBatch || len(evs) != 1 || evs[0].ID != id {
			t.Fatalf("resent: kind %d, %+v (%v); want request %d's done", h.kind, evs, err, id)
		}
	}
	if got := testutil.ToFloat64(r.m.Resumes.WithLabelValues("resumed")); got != 1 {
		t.Errorf("resumed counted %v times, want 1", got)
	}
	waitFor(t, 5*time.Second, "the resent batches counted", func() bool { return testutil.ToFloat64(r.m.Resent) == 2 })
}

// TestResumeFromOlderPeer: a peer of wire 2.3 ignores the resume point and sends a hello
// without feed numbers: the stream starts afresh (the hello reconciles at once) and the next
// one asks for no point.
func TestResumeFromOlderPeer(t *testing.T) {
	r := startReplica(t, "victim", nil, nil)
	macKey, _ := keys(secret)
	asked := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, q *http.Request) {
		asked <- q.URL.Query().Get("resume_after")
		var nonce [nonceSize]byte
		raw, _ := hex.DecodeString(q.URL.Query().Get("nonce"))
		copy(nonce[:], raw)
		hello := msgp.AppendArrayHeader(appendHeader(nil, &header{from: "evil", inc: 1, nonce: nonce, seq: 1, kind: kindHello}), 0)
		hello[2] = 3 // minor 3: nine fields, no feed numbers
		var b bytes.Buffer
		_ = writeFrame(&b, macKey, hello, nil)
		b.Write(frameOf(t, macKey, nonce, 2, route.Event{Kind: route.EventRouted, ID: 2, Endpoint: "http://e1", PromptTokens: 50, BlockTokens: 16, Blocks: []uint64{9}}))
		_, _ = w.Write(b.Bytes())
	}))
	defer srv.Close()
	p := peerInfo{name: "evil", inc: 1, feed: strings.TrimPrefix(srv.URL, "http://")}
	// An attempt of that peer's run in flight here, ended there while the stream was down.
	if d := r.lc.Apply(&route.Event{Kind: route.EventRouted, Origin: p.origin(), ID: 1, Endpoint: "http://e0", PromptTokens: 100, BlockTokens: 16, Blocks: []uint64{1}}); d != route.DropNone {
		t.Fatalf("setup: %v", d)
	}
	f := &following{next: 7, dec: &decoder{}}
	if err := r.node.stream(context.Background(), p, f); err == nil || reason(err) != "" {
		t.Errorf("stream ended with %v, want its end", err)
	}
	if got := <-asked; got != "6" {
		t.Errorf("asked to resume after %q, want 6", got)
	}
	if st := r.share.Stats(); st.Expired != 1 || st.Remote != 1 || r.ep("http://e1").InFlight() != 1 {
		t.Errorf("after a 2.3 hello: %d expired, %d in flight (%d on e1); want the first ended by the hello, the second started",
			st.Expired, st.Remote, r.ep("http://e1").InFlight())
	}
	if f.next != 0 {
		t.Errorf("after a stream without feed numbers the next asks to resume before batch %d, want none", f.next)
	}
}
