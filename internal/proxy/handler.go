package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/textproto"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scrape"
	"github.com/kvroute/kvroute/internal/tenant"
)

// Handler serves the OpenAI API paths (/v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/responses, /v1/models) by routing each request to an endpoint of Pool.
// Each request goes through the same steps, as plain calls: authenticate (Gate), read and
// parse the body once, build its routing keys, apply the tenant's limits (Gate), find the
// candidates, admit (Admit), pick and forward with fallback (Lifecycle), relay the answer while
// watching for its first token and usage, and settle. Set the fields before serving and do not
// change them afterwards (the application builds a new Handler on reload). Only Pool and
// Lifecycle (or Picker) are required; every other field has a documented default when nil or
// zero.
type Handler struct {
	// Pool holds the endpoints. Required.
	Pool *endpoint.Pool
	// Lifecycle runs each request through the policy: pick, fallback, counters, learning.
	// Nil: one built from Picker with MaxRetries.
	Lifecycle *route.Lifecycle
	// Picker and MaxRetries build the Lifecycle when it is nil: the policy, and how many
	// further ranked endpoints to try after a failure that makes that safe.
	Picker     policy.Picker
	MaxRetries int
	// Keys builds each request's routing keys (block size, normalisation).
	Keys route.Keys
	// Gate authenticates requests, applies per-tenant limits and admits requests under
	// overload. Nil: no tenants, no limits, no admission queue.
	Gate *tenant.Gate
	// Admit, when set, replaces the Gate's admission: called after the candidates are known
	// and before picking, it may wait (a fair queue), and it refuses a request by returning an
	// error (an *openai.Error is sent as is, any other error as 429). release is called when
	// the request ends.
	Admit func(ctx context.Context, id *tenant.Identity, candidates []*endpoint.Endpoint) (release func(), err error)
	// Saturated, when set, reports that every candidate is overloaded: the request is refused
	// with 503 and Retry-After.
	Saturated func(candidates []*endpoint.Endpoint) bool
	// CheckFailure, when set, tells how the last health check of an endpoint failed (failed
	// false: it passed, or none has been made), for the 503 of a model whose endpoints are all
	// out, which says in counts why ("2 failing their health checks: connection refused").
	// Called only on that refusal's path. Nil: the checks' failures are counted without a
	// cause.
	CheckFailure func(ep *endpoint.Endpoint) (why scrape.CheckFailure, failed bool)
	// Metrics records what the router does; nil: a private registry nobody scrapes.
	Metrics *metrics.Metrics
	// Logger gets one access line per request (never the prompt); nil: slog.Default().
	Logger *slog.Logger
	// Transport sends requests to the endpoints; nil: an h1.Transport (I/O on the calling
	// goroutine) falling back to DefaultTransport for https and proxied URLs.
	Transport http.RoundTripper
	// MaxBodyBytes bounds a request body; 0: 16 MiB. A body announced larger is refused with
	// 413 before any of it is read.
	MaxBodyBytes int64
	// MaxConnections is the API server's connection cap (server.max_connections as resolved),
	// which bounds how many of a tenant's request bodies may be received at once
	// (tenant.Gate.TakeBody: a quarter of it at most). 0: the cap of the h1.Server serving the
	// request (it puts itself in the request's context), where it is one; under another
	// server, none is known and only the tenant's max_concurrent bounds them.
	MaxConnections int
	// Rewrite forwards the normalised prompt texts to the engine (normalize.rewrite), so that
	// prompts differing only in whitespace also share the engine's cache. Off by default: the
	// engine then no longer sees the client's exact text.
	Rewrite bool
	// NewRequestID makes an x-request-id for requests without one; nil: 16 random hex digits.
	NewRequestID func() string
	// EndpointHeader, when set, names a response header set to the name (base URL) of the
	// endpoint that answered, before the first byte (server.endpoint_header). Empty: none.
	EndpointHeader string
	// Timeouts bound each attempt; an endpoint's own FirstTokenTimeout and ResponseTimeout
	// take precedence. Zero fields take the defaults.
	Timeouts Timeouts
	// FirstCheckWait bounds how long a request that finds no endpoint available waits for the
	// first health check of one that would serve it and has not had it (endpoint.FirstCheck:
	// an engine auto endpoint is out of rotation until its first check finds its kind), so
	// that the requests of a router's first moments are routed once that check passes rather
	// than refused with 503. The health timeout suits it. 0: DefaultFirstCheckWait; negative:
	// no wait.
	FirstCheckWait time.Duration
	// Instance is the router process's random id (NewInstanceID; the same in the prober, which
	// finds its own router among the endpoints by it). When set, every answer carries it in
	// InstanceHeader, and the loop guard acts: each request sent to an engine carries, in
	// ViaHeader, the ids of the routers it passed with this one's last, and a request that
	// comes back to a router that sent it (whose discovery lists its own address), or has
	// passed maxHops routers, is answered 508 routing_loop and never sent on. Empty: neither.
	Instance string

	once  sync.Once
	setup error
	// usageWarned: an engine's usage was out of range once (boundUsage logs that at WARN once).
	usageWarned atomic.Bool
	// unauth bounds the access lines of 401 answers (settle).
	unauth *unauthLog
	// instanceHeader is Instance as a header value, shared by every answer (capped: an append
	// copies it).
	instanceHeader []string
}

// Headers of the loop guard (Handler.Instance).
const (
	// InstanceHeader names the router instance in every answer of its API listener.
	InstanceHeader = scrape.InstanceHeader
	// ViaHeader lists, comma-separated, the router instances a request passed on its way to an
	// engine: two tiers of routers (a router in front of routers) add one each.
	ViaHeader = "X-Kvroute-Via"
)

// maxHops is how many routers a request may have passed (ViaHeader) for a router to take it:
// tiers of routers are two or three deep, and a loop between routers that do not meet their
// own id again (restarted ones, say) is bounded by it.
const maxHops = 8

// NewInstanceID returns a random id for a router process (Handler.Instance, the prober's).
func NewInstanceID() string { return randomID() }

// Timeouts bound one attempt of a request on one endpoint. A timeout before anything reached
// the client fails the request over to the next ranked endpoint; after, the stream ends with an
// SSE error event. When every attempt timed out, the client gets a 504.
type Timeouts struct {
	// FirstToken bounds the wait for a stream's first event (its first token): from sending
	// the request to the engine. 0: DefaultFirstTokenTimeout.
	FirstToken time.Duration
	// Response bounds a non-streamed answer, from sending the request to its last byte (the
	// whole generation). 0: DefaultResponseTimeout.
	Response time.Duration
	// StreamIdle bounds the silence between two events of a stream. 0: DefaultStreamIdleTimeout.
	StreamIdle time.Duration
}

// DefaultFirstCheckWait is Handler.FirstCheckWait's default: the health checks' default
// timeout (health.timeout).
const DefaultFirstCheckWait = 2 * time.Second

// Defaults of Timeouts.
const (
	DefaultFirstTokenTimeout = 2 * time.Minute
	DefaultResponseTimeout   = 10 * time.Minute
	DefaultStreamIdleTimeout = time.Minute
)

func (t Timeouts) withDefaults() Timeouts {
	if t.FirstToken <= 0 {
		t.FirstToken = DefaultFirstTokenTimeout
	}
	if t.Response <= 0 {
		t.Response = DefaultResponseTimeout
	}
	if t.StreamIdle <= 0 {
		t.StreamIdle = DefaultStreamIdleTimeout
	}
	return t
}

func (h *Handler) init() {
	if h.Metrics == nil {
		h.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	h.unauth = &unauthLog{log: h.Logger}
	if h.Transport == nil {
		h.Transport = h1.New(DefaultTransport())
	}
	if h.MaxBodyBytes <= 0 {
		h.MaxBodyBytes = 16 << 20
	}
	if h.NewRequestID == nil {
		h.NewRequestID = randomID
	}
	if h.Instance != "" {
		h.instanceHeader = []string{h.Instance}[:1:1]
	}
	if h.Lifecycle == nil && h.Picker != nil {
		h.Lifecycle, h.setup = route.New(route.Config{Picker: h.Picker, Attempts: 1 + max(h.MaxRetries, 0)})
	}
	if h.Admit == nil && h.Gate != nil {
		h.Admit = h.Gate.Admit
	}
	if h.Gate != nil && h.Pool != nil {
		// The gate, and the decode rates it keeps, outlive the handlers a reload builds: the
		// rates of the endpoints still in the pool go on, those of the endpoints gone are
		// forgotten.
		eps := h.Pool.All()
		names := make([]string, len(eps))
		for i, e := range eps {
			names[i] = e.Name
		}
		h.Gate.DecodeRates().Keep(names)
	}
	if h.Pool == nil || h.Lifecycle == nil {
		h.setup = errors.New("proxy handler needs a Pool and a Lifecycle (or a Picker)")
	}
}

// DefaultTransport is net/http's transport as the router uses it (for https and proxied
// endpoints, health checks and scrapes): HTTP/1.1 keep-alive pools sized for a few hundred
// concurrent streams per endpoint, no compression negotiated (the router must read usage from
// the bodies), a write buffer that holds a typical request.
func DefaultTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 4096
	t.MaxIdleConnsPerHost = 1024
	t.DisableCompression = true
	t.ResponseHeaderTimeout = 0
	// Room for the headers and a short prompt's body in one buffer: one write system call per
	// forwarded 4 KB chat request instead of two (the default 4 KB buffer splits it). Kept
	// small: every pooled connection holds one.
	t.WriteBufferSize = 8 << 10
	return t
}

func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reachedEngine reports whether an attempt that returned resp and err may have made its engine
// compute, for the tenant's charge (call.reached): its request was written to a connection,
// whatever came of it (an answer, a timeout, a lost connection, the client leaving), but for a
// connection that never opened or an engine's refusal (503, 429; 404: it does not serve the
// model or the path; a router's 508, a routing loop; a redirect or a protocol switch, failed
// over as a 503).
func reachedEngine(resp *http.Response, err error) bool {
	if err != nil {
		return !isDialError(err)
	}
	switch s := resp.StatusCode; {
	case s == http.StatusServiceUnavailable, s == http.StatusTooManyRequests, s == http.StatusNotFound, s == http.StatusLoopDetected:
		return false
	case s < 200, s >= 300 && s < 400:
		return false
	}
	return true
}

// copyBufs recycles the relay's copy buffers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyBufSize is the size of the relay's copy buffers: the most one write to the client
// carries.
const copyBufSize = 4 << 10

// call is one request's state from arrival to the end.
type call struct {
	h      *Handler
	rid    string // the request's id: the access line's, the engines' x-request-id, error messages'
	start  time.Time
	id     *tenant.Identity // nil without tenants
	ticket *tenant.Ticket   // the tenant's hold on its limits, nil without tenants
	req    *openai.Request  // nil until parsed
	preq   policy.Request
	rc     *route.Call // nil until picked
	// listing: the request is GET /v1/models, answered from the pool. No inference request, it
	// is not counted in the request metrics (settle): a client polling the list would add to
	// the request rate and to the denominator of the error ratio the alerts divide by.
	listing bool
	// release ends the admission's hold (nil: none); settle calls it.
	release func()
	via     string   // the front end, for the access line: "" for the HTTP handler
	hops    []string // ViaHeader's values for the engines (Handler.hops); nil for none
	body    []byte   // what is forwarded, before a per-endpoint cache_salt and the splice
	// held is the pooled buffer the client's body was read into (nil: none), and scratch the
	// parser's pooled memory (nil: none); both are given back when the request is finished
	// (releaseMemory).
	held    *heldBody
	scratch *openai.Scratch
	// splice, when not nil, goes into body at spliceAt as it is sent (stream_options added
	// without copying the body).
	splice       []byte
	spliceAt     int
	plain        [][]byte // the body's parts for an endpoint without the salt, built on first need
	salted       [][]byte // those with the tenant's cache_salt, built on first need
	joined       []byte   // plain joined, for a front end that sends one piece
	joinedSalted []byte   // salted joined
	model        string   // metric label
	// removed are the members of the client's body left out of what is forwarded
	// (dropEngineFields), for the access line.
	removed []string
	// clientRID is the client's own x-request-id where the router made rid instead (tenants
	// are on: one tenant's id must not name another's request), "" otherwise; it goes back to
	// the client and to the access line's client_request_id.
	clientRID string
	// remote is the client's address, for the access line ("" where the front end does not say).
	remote string
	// routed is when the lifecycle's Begin returned: the first attempt leaves then (zero
	// before), the start of the time an engine may have generated for the request.
	routed time.Time
	// seqs is how many sequences an engine generates for the request: n (choices), or a
	// completions request's best_of where that is more, for each of its prompts (a completions
	// list); choices is how many of them its answer returns, n for each prompt. 0 until parsed.
	seqs, choices int

	dropUsage bool
	stream    bool
	// reached counts the attempts that reached an engine (Handler.send, reachedEngine). carried
	// says a front end carries the request (Exchange), past any transport of ours: the
	// lifecycle's attempts and the answer's status tell instead (call.reachedEngine). The
	// tenant is charged for what an engine may have computed (call.charge).
	reached int
	carried bool
	// notFound counts the attempts an engine answered 404 (Handler.attempt).
	notFound int
	// answerStatus is the status of the answer a front end that carries the request was given
	// (Exchange.Answered); 0 before it came.
	answerStatus int
	// elsewhere: that answer is no endpoint's of the call (Exchange.AnsweredElsewhere): an
	// address the router did not pick gave it, or the front end itself. ep is nil, and settle
	// names no endpoint for it.
	elsewhere bool
	// local: that answer is the front end's own, and no engine had the request
	// (Exchange.AnsweredLocally): nothing is charged to the tenant (call.charge).
	local bool
	// frontAttempts is how many upstream attempts the front end says it made
	// (Exchange.Attempted); 0 where it did not say, and the lifecycle's count stands.
	frontAttempts int

	// Filled while the response is read (one goroutine: the proxy's copy loop).
	usage     openai.Usage
	haveUsage bool
	cached    int // usage's cached tokens, -1 when not reported
	// timingsCached is llama.cpp's timings.cache_n, -1 when absent.
	timingsCached int
	respID        string
	errType       string
	errCode       string
	answered      bool // an endpoint answered (a response head came back)
	complete      bool // the engine's answer was read to its end (a stream to its [DONE])
	cut           bool // the engine's stream ended before its end
	// unterminated: the engine ended its stream's body properly without a terminator
	// (sseBody.endedUnterminated): an end, not a cut, but not a complete answer either.
	unterminated bool
	streamErr    bool // the engine's stream carried an error event (it failed after its head)
	// streamStatus is the status the first such event names (openai.ErrorStatus), 0 if none.
	streamStatus  int
	contentEvents int // events of the stream passed on that carry generated text (contentEvent)
	// usageClamped: boundUsage clamped the usage (logged once per request).
	usageClamped bool
	// badStream: the engine's stream carried an event that is no event of the API, after the
	// head (call.badEvent): the error that ended the client's stream; nil when none.
	badStream *openai.Error
	// badAnswer: the engine's whole (not streamed) 2xx answer is not the JSON it must be (cut
	// inside, or no JSON at all): a failure of the endpoint (takeBody, settle).
	badAnswer bool
	// badWhat says what was wrong with the event that made a stream relayed as it came a bad
	// answer (malformedWhat); "" for a whole answer.
	badWhat string
	// shutdown: the router's shutdown cut the request (ErrShuttingDown): a 503 of its own, not
	// the client's leaving nor a failure of the engine.
	shutdown bool
	// overran: the engine sent more than the request's max_tokens allows (a stream's content
	// events past maxEvents, a whole answer past maxAnswerBytes), and the answer was cut there:
	// a 502 upstream_bad_answer, a failure of the endpoint (call.overrun).
	overran bool
}

// ep is the endpoint that answered the request, or nil.
func (c *call) ep() *endpoint.Endpoint {
	if c.rc == nil || !c.answered || c.elsewhere {
		return nil
	}
	return c.rc.Endpoint()
}

// attempts is how many attempts the request took: the front end's count where it gave one
// (Exchange.Attempted), else the lifecycle's.
func (c *call) attempts() int {
	if c.frontAttempts > 0 {
		return c.frontAttempts
	}
	if c.rc == nil {
		return 0
	}
	return c.rc.Attempts()
}

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.init)
	c := &call{h: h, cached: -1, timingsCached: -1}
	if h.Lifecycle != nil {
		c.start = h.Lifecycle.Now()
	} else {
		c.start = time.Now()
	}
	c.remote = r.RemoteAddr
	c.requestID(r.Header.Get("X-Request-Id"))
	w.Header().Set("X-Request-Id", c.echoedID())
	if h.instanceHeader != nil {
		w.Header()[InstanceHeader] = h.instanceHeader
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { h.finish(c, sw, r) }()
	if oe := c.authenticate(r.Header, sw.Header()); oe != nil {
		h.writeError(sw, c, oe)
		return
	}
	if to, ok := withoutSlash(r.URL.Path); ok {
		h.redirectSlash(sw, c, r, to)
		return
	}
	kind, models, oe := resolve(r.Method, r.URL.Path)
	switch {
	case oe != nil:
		if oe.Status == http.StatusMethodNotAllowed {
			allow := http.MethodPost
			if r.URL.Path == "/v1/models" {
				allow = http.MethodGet
			}
			sw.Header().Set("Allow", allow) // RFC 9110, 15.5.6
		}
		h.writeError(sw, c, oe)
	case models:
		c.listing = true
		h.serveModels(sw, c)
	default:
		h.route(sw, r, c, kind)
	}
}

// redirectSlash answers a request for an API path with a trailing slash (to is the path
// without it) as vLLM's server does (FastAPI redirects such paths): 307, which keeps the method
// and the body, to the path without the slash, so that a client that follows redirects (the
// OpenAI Python SDK's httpx client does) is served as it would be by the engine. A client that does not reads an
// OpenAI error naming the path. The Location is relative (../completions), so that it keeps any
// prefix a proxy in front of the router removed from the path.
func (h *Handler) redirectSlash(w *statusWriter, c *call, r *http.Request, to string) {
	loc := "../" + to[strings.LastIndexByte(to, '/')+1:]
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", loc)
	h.writeError(w, c, openai.NewError(http.StatusTemporaryRedirect, openai.TypeInvalidRequest, "", "unknown_url",
		"unknown path "+strconv.Quote(r.URL.Path)+": the path is "+to+", without the trailing slash (this answer redirects there)"))
}

// route reads, parses, limits, admits and forwards one API request.
func (h *Handler) route(w *statusWriter, r *http.Request, c *call, kind openai.Kind) {
	hops, oe := h.hops(r.Header)
	if oe != nil {
		w.Header().Set("Connection", "close") // the body is not read
		h.writeError(w, c, oe)
		return
	}
	c.hops = hops
	if oe := contentEncoding(r.Header); oe != nil {
		w.Header().Set("Connection", "close") // the body is not read
		w.Header().Set("Accept-Encoding", "identity")
		h.writeError(w, c, oe)
		return
	}
	if oe := forwardedHead(r.Header, c.id != nil); oe != nil {
		w.Header().Set("Connection", "close") // the body is not read
		h.writeError(w, c, oe)
		return
	}
	body, held, oe := h.receive(w, r, c)
	c.held = held
	if oe != nil {
		if oe.Status == http.StatusRequestEntityTooLarge || oe.Status == http.StatusTooManyRequests {
			w.Header().Set("Connection", "close") // the rest of the body is not read
		}
		h.writeError(w, c, oe)
		return
	}
	c.scratch = scratches.Get().(*openai.Scratch)
	if oe := c.prepare(r.Context(), kind, body, r.Header, w.Header(), prepareOptions{addUsage: true}); oe != nil {
		if shuttingDown(r.Context()) {
			oe = shutdownError(c.rid) // cut while it waited (admission, a replica's hold)
		}
		h.writeError(w, c, oe)
		return
	}
	ctx := context.WithValue(r.Context(), callKey{}, c)
	out := r.WithContext(ctx)
	out.Body = http.NoBody
	h.relay(w, out)
	if w.status == 0 && shuttingDown(r.Context()) {
		// The router's shutdown cut the request before any answer: it is told so (the relay
		// answers nothing once the request's context has ended).
		h.writeError(w, c, shutdownError(c.rid))
	} else if w.status == 0 && r.Context().Err() != nil && r.Context().Value(http.ServerContextKey) != nil {
		// The client went away before any answer (or half-closed its connection, which Go's
		// servers take for the same, and the engine's request was cancelled): the connection
		// ends without an answer, rather than with the empty 200 the server would send.
		panic(http.ErrAbortHandler)
	}
	// The answer leaves now, before the bookkeeping that runs when the handler returns (the
	// policy's Done, metrics, the access line): a server flushes a short body only then, and
	// sends a stream's end (which a client reads to keep its connection) only then.
	w.endBody()
}

// receive reads the request's body (readBodyHeld). With tenants, a body being received holds
// one of its tenant's places for that (tenant.Gate.TakeBody) until it is read, or the read
// fails: each holds a connection before any of the tenant's limits apply, and one tenant's
// slow bodies took every connection of the API server. A tenant with no place left is
// refused (429, Retry-After set in w) before any of the body is read.
func (h *Handler) receive(w *statusWriter, r *http.Request, c *call) ([]byte, *heldBody, *openai.Error) {
	if c.id != nil {
		if oe := h.Gate.TakeBody(r.Context(), c.id, h.maxConnections(r), w.Header()); oe != nil {
			return nil, nil, oe
		}
		defer h.Gate.BodyDone(c.id)
	}
	return readBodyHeld(r, h.MaxBodyBytes, true)
}

// maxConnections is the API server's connection cap: Handler.MaxConnections, else that of the
// h1.Server serving r; 0 when none is known.
func (h *Handler) maxConnections(r *http.Request) int {
	if h.MaxConnections > 0 {
		return h.MaxConnections
	}
	if s, ok := r.Context().Value(http.ServerContextKey).(*h1.Server); ok {
		return s.MaxConns
	}
	return 0
}

// hops returns what to send the engines in ViaHeader: the routers the request passed (hdr's
// ViaHeader), this one last (as a header's values: the handler's own, shared, when this router
// is the first); or the answer to a request that came back to this router (a routing loop: its
// discovery lists its own address) or passed maxHops routers, which is never sent on. nil
// without an Instance.
func (h *Handler) hops(hdr http.Header) ([]string, *openai.Error) {
	if h.Instance == "" {
		return nil, nil
	}
	in := hdr.Values(ViaHeader)
	if len(in) == 0 {
		return h.instanceHeader, nil
	}
	var ids []string
	size := 0
	for _, v := range in {
		for id := range strings.SplitSeq(v, ",") {
			if id = textproto.TrimString(id); id == "" {
				continue
			}
			if id == h.Instance {
				return nil, openai.NewError(http.StatusLoopDetected, openai.TypeServer, "", "routing_loop",
					"routing loop: the request came back to the kvroute router that had sent it on ("+ViaHeader+" holds its instance id "+h.Instance+
						"): the router's discovery lists its own address (a Kubernetes selector or headless Service that also matches the router's pods, a DNS name that includes the router); remove it from the endpoints")
			}
			ids = append(ids, id)
			size += len(id) + 1
			if len(ids) >= maxHops || size > maxHops*64 {
				break // a loop already (below); the rest of a header a client may make long unread
			}
		}
		if len(ids) >= maxHops || size > maxHops*64 {
			break
		}
	}
	if len(ids) >= maxHops || size > maxHops*64 {
		return nil, openai.NewError(http.StatusLoopDetected, openai.TypeServer, "", "routing_loop",
			"routing loop: the request has passed "+strconv.Itoa(len(ids))+" kvroute routers already ("+ViaHeader+"); more than "+
				strconv.Itoa(maxHops-1)+" is taken for a loop between routers whose discovery lists one another")
	}
	return []string{strings.Join(append(ids, h.Instance), ",")}, nil
}

// callKey carries the call from ServeHTTP through the relay (whose steps see only the outgoing
// request) to the transport and the response hooks.
type callKey struct{}

func callFrom(ctx context.Context) *call { c, _ := ctx.Value(callKey{}).(*call); return c }

// readBody reads the whole body, at most limit bytes. A body announced longer than limit is
// refused before any of it is read. A body announced at most exactBody long is read into one
// buffer of its length, each read taking what the socket holds; beyond that, memory grows with
// the bytes received, never with the length announced: a longer body (or one of unknown
// length) is read into pooled chunks of bodyStart bytes as data arrives, joined once at the
// end. (Doubling one buffer instead cleared and copied more than twice the body: a quarter of
// the router's CPU on a 100k-token prompt.)
func readBody(r *http.Request, limit int64) ([]byte, *openai.Error) {
	body, _, oe := readBodyHeld(r, limit, false)
	return body, oe
}

// readBodyHeld is readBody; with pool, a body announced at least pooledBody long (and at most
// exactBody) is read into a pooled buffer, and a longer one (or one of unknown length) of at
// least pooledBody and at most maxClassBuf bytes is joined into one; held (not nil then)
// returns it to the pool once its holders are done with it (see heldBody).
func readBodyHeld(r *http.Request, limit int64, pool bool) (body []byte, held *heldBody, oe *openai.Error) {
	tooLarge := func() *openai.Error {
		return openai.NewError(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "", "request_too_large",
			"request body is larger than the limit of "+strconv.FormatInt(limit, 10)+" bytes (limits.max_body_bytes)")
	}
	if r.ContentLength > limit {
		return nil, nil, tooLarge()
	}
	defer func() {
		if oe != nil && held != nil {
			held.release()
			held = nil
		}
	}()
	var buf []byte
	if n := r.ContentLength; pool && n >= pooledBody && n <= exactBody {
		held = newHeldBody(int(n) + 1)
		buf = (*held.buf)[:0]
	} else if n >= 0 && n <= exactBody {
		buf = make([]byte, 0, n+1) // room to see EOF without another read
	} else {
		buf = (*bodyChunks.Get().(*[]byte))[:0]
	}
	var full [][]byte // chunks filled before buf, in order
	defer func() {
		for _, c := range full {
			if cap(c) == bodyStart { // not the first buffer of a body that announced less
				bodyChunks.Put(&c)
			}
		}
	}()
	total := int64(0)
	// The body's time as the API server counts it, to tell which of its bounds cut it
	// (bodyTimeoutSetting): its first read, and its last progress (progressRead bytes then), a
	// progress being server.body_min_rate bytes (one where the rate is 0).
	srv, _ := r.Context().Value(http.ServerContextKey).(*h1.Server)
	step := int64(1)
	if srv != nil && srv.BodyMinRate > 0 {
		step = srv.BodyMinRate
	}
	var start, progress time.Time
	progressRead := int64(0)
	for {
		if len(buf) == cap(buf) {
			full = append(full, buf)
			buf = (*bodyChunks.Get().(*[]byte))[:0]
		}
		if start.IsZero() {
			start = time.Now()
			progress = start
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if total += int64(n); total-progressRead >= step && n > 0 {
			progress, progressRead = time.Now(), total
		}
		if total > limit {
			return nil, held, tooLarge()
		}
		if err == io.EOF {
			if full == nil && (cap(buf) != bodyStart || held != nil) {
				return buf, held, nil
			}
			full = append(full, buf)
			if held != nil { // a body longer than announced (the server stops it first)
				held.release()
				held = nil
			}
			if pool && total >= pooledBody && total <= maxClassBuf {
				// Joined into a pooled buffer of its size's class, taken now that the size is
				// known: a long prompt's body is not allocated anew for each request. A longer
				// one is allocated at its size (bodyClasses).
				held = newHeldBody(int(total))
				body := (*held.buf)[:0]
				for _, c := range full {
					body = append(body, c...)
				}
				return body, held, nil
			}
			// One allocation of the exact size; bytes.Join does not clear what it will copy over.
			return bytes.Join(full, nil), nil, nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) { // the API server's body timeout
			return nil, held, openai.NewError(http.StatusRequestTimeout, openai.TypeInvalidRequest, "", "request_timeout",
				"the request body was not received in time: "+bodyTimeoutSetting(srv, start, progress, total))
		}
		if err != nil {
			return nil, held, bodyReadError(err)
		}
	}
}

// bodyTimeoutSetting says which of the API server's bounds on a body cut it, for the 408: the
// body was read from start, made its last progress (server.body_min_rate bytes) at progress,
// and brought read bytes in all. s (nil: another server than h1's) answers both with the same
// error: the one that fired is the one due first, server.body_read_timeout from the first
// read (later by a second for every server.body_min_rate bytes), or
// server.body_stall_timeout from the last progress. Under another server (net/http's, through
// h1.NetHTTP) it cannot be told, and both are named.
func bodyTimeoutSetting(s *h1.Server, start, progress time.Time, read int64) string {
	if s == nil || s.BodyReadTimeout <= 0 && s.BodyStallTimeout <= 0 {
		return "it took longer than server.body_read_timeout, or stopped coming for server.body_stall_timeout"
	}
	stalled := s.BodyStallTimeout > 0
	if s.BodyReadTimeout > 0 && stalled {
		due := start.Add(s.BodyReadTimeout)
		if s.BodyMinRate > 0 {
			due = due.Add(time.Duration(float64(read) / float64(s.BodyMinRate) * float64(time.Second)))
		}
		stalled = progress.Add(s.BodyStallTimeout).Before(due)
	}
	if stalled {
		return "it made no progress for " + s.BodyStallTimeout.String() + " (server.body_stall_timeout)"
	}
	return "it took longer than " + s.BodyReadTimeout.String() + " (server.body_read_timeout)"
}

// bodyStart is the size of the chunks a body of unknown length, or one longer than exactBody,
// is read into.
const bodyStart = 64 << 10

// exactBody is the longest announced body read into a buffer of the length announced, before
// it arrives: 1 MiB (a prompt of some 250k tokens), what a request's head may already make the
// server hold (MaxHeaderBytes). Read in chunks and joined, a 400 KB body took twice the reads
// and one more copy of itself.
const exactBody = 1 << 20

// bodyChunks recycles the chunks of large bodies.
var bodyChunks = sync.Pool{New: func() any { b := make([]byte, bodyStart); return &b }}

// served reports whether any endpoint, healthy or not, serves model for these labels.
func (h *Handler) served(model string, labels map[string]string) bool {
	for _, e := range h.Pool.All() {
		if e.Serves(model) && hasLabels(e, labels) {
			return true
		}
	}
	return false
}

// hasLabels reports whether e carries every one of labels.
func hasLabels(e *endpoint.Endpoint, labels map[string]string) bool {
	for k, v := range labels {
		if e.Labels[k] != v {
			return false
		}
	}
	return true
}

// modelLabel bounds the model label to the models the config names, and those the engines
// list within the metrics' bound.
func (h *Handler) modelLabel(model string) string {
	if name, ok := h.Pool.Configured(model); ok {
		return name // as the config spells it ("tiny", asked as "tiny:latest"): its series go with it
	}
	switch {
	case !h.Pool.HasModel(model):
		return "other"
	case h.Metrics != nil:
		// A model only an engine's list names has a label of its own within the metrics'
		// bound (metrics.MaxLearntModels): an engine listing thousands must not make as many
		// series.
		return h.Metrics.ModelLabel(model)
	}
	return model
}

// refusedModelLabel is the model label of a request whose body was refused (a 400) but names
// model: the model's own, as modelLabel gives it, where an endpoint serves it that the
// request's tenant (id, nil without tenants) may use, so that the refusal is counted in the
// series made for it; else "" (counted as unknown), as a request for a model not served is,
// which keeps the labels to the models served.
func (h *Handler) refusedModelLabel(model string, id *tenant.Identity) string {
	switch {
	case model == "" || !h.Pool.HasModel(model):
		return ""
	case id != nil && (len(id.Models) > 0 && !slices.Contains(id.Models, model) || !h.served(model, id.EndpointLabels)):
		return ""
	}
	return h.modelLabel(model)
}

func modelNotFound(model string) *openai.Error {
	return openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model", "model_not_found",
		"the model "+strconv.Quote(model)+" does not exist or is not served here (GET /v1/models lists them)")
}

func (h *Handler) serveModels(w *statusWriter, c *call) {
	b := c.modelList()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// modelList is the body of GET /v1/models: the models of the pool the caller may use.
func (c *call) modelList() []byte {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range c.h.Pool.Models() {
		if c.id != nil && len(c.id.Models) > 0 && !slices.Contains(c.id.Models, m) {
			continue
		}
		if c.id != nil && !c.h.served(m, c.id.EndpointLabels) {
			continue
		}
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "kvroute"})
	}
	b, _ := json.Marshal(list)
	return b
}

func (h *Handler) writeError(w *statusWriter, c *call, e *openai.Error) {
	c.refused(e)
	openai.WriteError(w, e)
}

// proxyError answers when no endpoint could be reached, or a response could not be read. The
// client is told how many attempts were made and the request id, never an endpoint's address.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	sw, _ := w.(*statusWriter)
	attempts := 1
	if c != nil && c.rc != nil {
		attempts = max(c.rc.Attempts(), 1)
	}
	status, code := http.StatusBadGateway, "upstream_unreachable"
	msg := "no endpoint could be reached after " + strconv.Itoa(attempts) + " attempt(s)"
	switch {
	case c != nil && c.rc != nil && c.rc.TimedOut():
		status, code = http.StatusGatewayTimeout, "upstream_timeout"
		msg = "no endpoint answered in time after " + strconv.Itoa(attempts) + " attempt(s)"
	case c != nil && c.rc != nil && c.rc.LastFailure() == route.FailStatus && errors.Is(err, errBadStream):
		// The engine answered with something no client of the request can read (a stream that
		// is no API stream, or a stream to a request not streamed: Handler.attempt), before
		// any of it went out.
		code = codeBadAnswer
		msg = err.Error() + ", after " + strconv.Itoa(attempts) + " attempt(s); after such a failure a request is sent to another engine once at most"
	case c != nil && c.rc != nil && c.rc.LastFailure() == route.FailLost:
		code = "upstream_connection_lost"
		msg = "the engine's connection broke after it received the request, before a valid answer (closed, or an answer that is not HTTP), after " + strconv.Itoa(attempts) + " attempt(s); after such a failure a request is sent to another engine once at most (it may be what broke the engine)"
	}
	if c != nil {
		msg += " (request id " + c.rid + ")"
	}
	e := openai.NewError(status, openai.TypeUpstream, "", code, msg)
	if sw != nil && c != nil {
		h.writeError(sw, c, e)
		return
	}
	openai.WriteError(w, e)
}
