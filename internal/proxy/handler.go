package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"github.com/kvroute/kvroute/internal/h1"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/tenant"
)

// Handler serves the OpenAI API paths (/v1/chat/completions, /v1/completions,
// /v1/embeddings, /v1/responses, /v1/models) by routing each request to an endpoint of Pool.
// Set the fields before serving and do not change them afterwards (the Router builds a new
// Handler on reload). Only Pool and Picker are required; every other field has a documented
// default when nil or zero. Handlers built one after the other may share State so that pinned
// responses and passive-failure counts survive a reload.
type Handler struct {
	// Pool holds the endpoints. Required.
	Pool *endpoint.Pool
	// Picker is the routing policy. Required. When it implements policy.Observer it is told
	// what happens to each request; policy.Predictor feeds the predicted-cached metric.
	Picker policy.Picker
	// Metrics records what the router does; nil: a private registry nobody scrapes.
	Metrics *metrics.Metrics
	// Logger gets one access line per request (never the prompt); nil: slog.Default().
	Logger *slog.Logger
	// Transport sends requests to the endpoints; nil: an h1.Transport (I/O on the calling
	// goroutine) falling back to DefaultTransport for https and proxied URLs.
	Transport http.RoundTripper
	// MaxBodyBytes bounds a request body; 0: 16 MiB.
	MaxBodyBytes int64
	// MaxRetries is how many further ranked endpoints to try after a connection error or a
	// 503 received before any response byte; negative: none, 0: none.
	MaxRetries int
	// BlockTokens is the tokens per prefix block; 0: prefix.DefaultBlockTokens.
	BlockTokens int
	// Normalizer normalises the canonical prompt before hashing; nil: prefix defaults.
	Normalizer *prefix.Normalizer
	// Rewrite forwards the normalised prompt texts to the engine (normalize.rewrite), so that
	// prompts differing only in whitespace also share the engine's cache. Off by default: the
	// engine then no longer sees the client's exact text.
	Rewrite bool
	// PassiveFailures consecutive connection errors eject an endpoint (SetHealthy(false))
	// until active health checks readmit it; 0: 3, negative: never eject.
	PassiveFailures int
	// OnConnError and OnSuccess, when set, replace the built-in passive ejection: they are
	// told of each connection error and each exchange that got a response (the Router wires
	// them to the health prober, which also readmits the endpoint when checks pass).
	OnConnError func(ep *endpoint.Endpoint)
	OnSuccess   func(ep *endpoint.Endpoint)
	// Now tells the time; nil: time.Now.
	Now func() time.Time
	// NewRequestID makes an x-request-id for requests without one; nil: 16 random hex digits.
	NewRequestID func() string
	// Admit, when set, is called after the candidates are known and before picking: it may
	// wait (a fair queue), and it refuses a request by returning an error (an *openai.Error is
	// sent as is, any other error as 429). release is called when the request ends.
	Admit func(ctx context.Context, id *tenant.Identity, candidates []*endpoint.Endpoint) (release func(), err error)
	// Saturated, when set, reports that every candidate is overloaded: the request is refused
	// with 503 and Retry-After.
	Saturated func(candidates []*endpoint.Endpoint) bool
	// State is shared between handlers built on reloads; nil: a private one.
	State *State
	// EndpointHeader, when set, names a response header set to the name (base URL) of the
	// endpoint that answered, before the first byte (server.endpoint_header). Empty: none.
	EndpointHeader string

	once  sync.Once
	rp    *httputil.ReverseProxy
	setup error
}

// State is what outlives one Handler: which endpoint created which response (for
// previous_response_id) and consecutive connection failures per endpoint.
type State struct {
	pins     pinTable
	failures sync.Map // endpoint name -> *atomic.Int32
}

// NewState returns an empty State remembering up to maxPins response ids (0: 100,000).
func NewState(maxPins int) *State {
	if maxPins <= 0 {
		maxPins = 100_000
	}
	return &State{pins: pinTable{max: maxPins, m: map[string]string{}}}
}

// pinTable maps response ids to endpoint names, forgetting the oldest beyond max.
type pinTable struct {
	mu    sync.Mutex
	max   int
	m     map[string]string
	order []string
	head  int
}

func (p *pinTable) put(id, ep string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[id]; ok {
		p.m[id] = ep
		return
	}
	if len(p.order) < p.max {
		p.order = append(p.order, id)
	} else {
		delete(p.m, p.order[p.head])
		p.order[p.head] = id
		p.head = (p.head + 1) % p.max
	}
	p.m[id] = ep
}

func (p *pinTable) get(id string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.m[id]
}

func (s *State) failureCounter(name string) *atomic.Int32 {
	if v, ok := s.failures.Load(name); ok {
		return v.(*atomic.Int32)
	}
	v, _ := s.failures.LoadOrStore(name, new(atomic.Int32))
	return v.(*atomic.Int32)
}

func (h *Handler) init() {
	if h.Metrics == nil {
		h.Metrics = metrics.New(prometheus.NewRegistry())
	}
	if h.Logger == nil {
		h.Logger = slog.Default()
	}
	if h.Transport == nil {
		h.Transport = h1.New(DefaultTransport())
	}
	if h.MaxBodyBytes <= 0 {
		h.MaxBodyBytes = 16 << 20
	}
	h.MaxRetries = max(h.MaxRetries, 0)
	if h.BlockTokens <= 0 {
		h.BlockTokens = prefix.DefaultBlockTokens
	}
	if h.PassiveFailures == 0 {
		h.PassiveFailures = 3
	}
	if h.Now == nil {
		h.Now = time.Now
	}
	if h.NewRequestID == nil {
		h.NewRequestID = randomID
	}
	if h.State == nil {
		h.State = NewState(0)
	}
	if h.Pool == nil || h.Picker == nil {
		h.setup = errors.New("proxy handler needs a Pool and a Picker")
	}
	h.rp = &httputil.ReverseProxy{
		Rewrite:   func(*httputil.ProxyRequest) {}, // the transport sets the URL per attempt
		Transport: &retryTransport{h: h},
		// 0: the reverse proxy flushes every write of text/event-stream and unknown-length
		// bodies (streams) and none of a JSON body with a length.
		FlushInterval:  0,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.proxyError,
		ErrorLog:       slog.NewLogLogger(h.Logger.Handler(), slog.LevelDebug),
		BufferPool:     bufferPool{},
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

// bufferPool recycles the reverse proxy's copy buffers.
type bufferPool struct{}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

// textBufs recycles the buffers the canonical prompt text is written into; buffers grown past
// maxPooledText are left to the garbage collector so one huge prompt is not kept forever.
var textBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

const maxPooledText = 1 << 20

func (bufferPool) Get() []byte  { return *(copyBufs.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { copyBufs.Put(&b) }

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(h.init)
	start := h.Now()
	rid := r.Header.Get("X-Request-Id")
	if rid == "" || len(rid) > 128 {
		rid = h.NewRequestID()
	}
	w.Header().Set("X-Request-Id", rid)
	sw := &statusWriter{ResponseWriter: w}
	c := &call{h: h, rid: rid, start: start, cached: -1, id: tenant.FromContext(r.Context())}
	defer func() { h.finish(c, sw, r) }()
	if h.setup != nil {
		h.writeError(sw, c, openai.NewError(http.StatusInternalServerError, openai.TypeServer, "", "", h.setup.Error()))
		return
	}
	if r.URL.Path == "/v1/models" {
		if r.Method != http.MethodGet {
			h.writeError(sw, c, openai.NewError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "", "method_not_allowed", "use GET for /v1/models"))
			return
		}
		h.serveModels(sw, c)
		return
	}
	kind, ok := openai.KindForPath(r.URL.Path)
	if !ok {
		h.writeError(sw, c, openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "", "unknown_url",
			"unknown path "+strconv.Quote(r.URL.Path)+": kvroute serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/models"))
		return
	}
	if r.Method != http.MethodPost {
		h.writeError(sw, c, openai.NewError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "", "method_not_allowed", "use POST for "+r.URL.Path))
		return
	}
	h.route(sw, r, c, kind)
}

// call is one request's state from arrival to the end.
type call struct {
	h        *Handler
	rid      string
	start    time.Time
	id       *tenant.Identity
	req      *openai.Request
	preq     policy.Request
	body     []byte // what is forwarded, before a per-endpoint cache_salt
	salted   []byte // body with the tenant's cache_salt, built on first need
	ranked   []*endpoint.Endpoint
	model    string // metric label
	ep       *endpoint.Endpoint
	attempts int
	predict  int // predicted cached tokens on ep, -1 unknown

	dropUsage bool
	stream    bool

	// Filled while the response is read (one goroutine: the proxy's copy loop).
	firstAt   time.Time
	usage     openai.Usage
	haveUsage bool
	cached    int
	respID    string
	errType   string
}

type callKey struct{}

func callFrom(ctx context.Context) *call { c, _ := ctx.Value(callKey{}).(*call); return c }

func (h *Handler) route(w *statusWriter, r *http.Request, c *call, kind openai.Kind) {
	if p := openai.ParsedFrom(r.Context()); p != nil && p.Kind == kind && int64(len(p.Body)) <= h.MaxBodyBytes {
		h.routeParsed(w, r, c, kind, p.Body, p.Req) // the tenant gate read and parsed it
		return
	}
	body, err := readBody(w, r, h.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			h.writeError(w, c, openai.NewError(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "", "request_too_large",
				"request body is larger than the limit of "+strconv.FormatInt(mbe.Limit, 10)+" bytes (limits.max_body_bytes)"))
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) { // the API server's body timeout
			h.writeError(w, c, openai.NewError(http.StatusRequestTimeout, openai.TypeInvalidRequest, "", "request_timeout",
				"the request body was not received in time (server.body_read_timeout)"))
			return
		}
		h.writeError(w, c, openai.BadRequest("", "reading request body: %v", err))
		return
	}
	req, err := openai.Parse(kind, body)
	if err != nil {
		var oe *openai.Error
		if !errors.As(err, &oe) {
			oe = openai.BadRequest("", "%v", err)
		}
		h.writeError(w, c, oe)
		return
	}
	h.routeParsed(w, r, c, kind, body, req)
}

// routeParsed routes a request whose body has been read and parsed.
func (h *Handler) routeParsed(w *statusWriter, r *http.Request, c *call, kind openai.Kind, body []byte, req *openai.Request) {
	c.req = req
	c.stream = req.Stream
	c.model = h.modelLabel(req.Model)
	if c.id != nil && len(c.id.Models) > 0 && !slices.Contains(c.id.Models, req.Model) {
		c.model = metrics.UnknownModel
		h.writeError(w, c, modelNotFound(req.Model))
		return
	}
	var labels map[string]string
	if c.id != nil {
		labels = c.id.EndpointLabels
	}
	cands := h.Pool.Candidates(make([]*endpoint.Endpoint, 0, 8), req.Model, labels)
	if len(cands) == 0 {
		if !h.served(req.Model, labels) {
			c.model = metrics.UnknownModel
			h.writeError(w, c, modelNotFound(req.Model))
			return
		}
		w.Header().Set("Retry-After", "1")
		h.writeError(w, c, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint",
			"no healthy endpoint serves model "+strconv.Quote(req.Model)+"; retry shortly"))
		return
	}
	if h.Saturated != nil && h.Saturated(cands) {
		w.Header().Set("Retry-After", "1")
		h.writeError(w, c, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "overloaded",
			"every endpoint serving "+strconv.Quote(req.Model)+" is saturated; retry shortly"))
		return
	}
	if h.Admit != nil {
		release, err := h.Admit(r.Context(), c.id, cands)
		if err != nil {
			var oe *openai.Error
			if !errors.As(err, &oe) {
				oe = openai.NewError(http.StatusTooManyRequests, "rate_limit_error", "", "rate_limited", err.Error())
			}
			if (oe.Status == http.StatusServiceUnavailable || oe.Status == http.StatusTooManyRequests) && w.Header().Get("Retry-After") == "" {
				w.Header().Set("Retry-After", "1")
			}
			h.writeError(w, c, oe)
			return
		}
		if release != nil {
			defer release()
		}
	}

	// The routing key: canonical prompt, normalised, cut into chained block hashes seeded with
	// the model and the salt the engine will use.
	// The text lives in a pooled buffer and is hashed where it lies (normalisation usually
	// changes nothing and then copies nothing); only the block hashes outlive this block.
	tb := textBufs.Get().(*[]byte)
	text := req.AppendCanonical((*tb)[:0])
	salt := req.CacheSalt
	if c.id != nil {
		salt = c.id.Salt
	}
	seed := prefix.Seed(req.Model, salt)
	c.preq = policy.Request{
		ID:           c.rid,
		Model:        req.Model,
		SessionKey:   sessionKey(req, r),
		BlockTokens:  h.BlockTokens,
		PromptTokens: prefix.EstimateTokensBytes(text),
		MaxTokens:    req.MaxTokens,
	}
	if n := req.Prompts(); n > 1 {
		// A list of prompts is as many engine requests, each cached from the start on its own:
		// the blocks are each prompt's chain in turn (not those of the joined text, which
		// nothing holds), and each prompt may produce max_tokens.
		pb := textBufs.Get().(*[]byte)
		for i := range n {
			*pb = req.AppendPrompt((*pb)[:0], i)
			c.preq.Blocks = prefix.BlocksBytes(c.preq.Blocks, seed, h.Normalizer.NormalizeBytes(*pb), h.BlockTokens)
		}
		if cap(*pb) <= maxPooledText {
			textBufs.Put(pb)
		}
		c.preq.MaxTokens *= n
	} else {
		c.preq.Blocks = prefix.BlocksBytes(nil, seed, h.Normalizer.NormalizeBytes(text), h.BlockTokens)
	}
	if cap(text) <= maxPooledText {
		*tb = text[:0]
		textBufs.Put(tb)
	}
	if c.id != nil {
		c.preq.Tenant = c.id.Name
	}
	pickStart := time.Now()
	ranked, err := h.Picker.Pick(&c.preq, cands)
	h.Metrics.PickDuration.Observe(time.Since(pickStart).Seconds())
	if err != nil || len(ranked) == 0 {
		w.Header().Set("Retry-After", "1")
		h.writeError(w, c, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint", "no endpoint can take the request"))
		return
	}
	if req.PreviousResponseID != "" {
		ranked = h.pin(ranked, cands, req.PreviousResponseID)
	}
	c.ranked = ranked[:min(len(ranked), 1+h.MaxRetries)]

	// The body to forward: the client's bytes, patched only where needed.
	c.body = body
	if h.Rewrite {
		nb, changed, err := openai.RewriteText(kind, c.body, h.Normalizer.Normalize)
		if err == nil && changed {
			c.body = nb
			h.Metrics.Rewrites.Inc()
		}
	}
	if req.Stream && !req.IncludeUsage && (kind == openai.KindChat || kind == openai.KindCompletion) {
		if nb, err := openai.WithIncludeUsage(c.body); err == nil {
			c.body = nb
			c.dropUsage = true
		}
	}
	ctx := context.WithValue(r.Context(), callKey{}, c)
	out := r.WithContext(ctx)
	out.Body = http.NoBody
	h.rp.ServeHTTP(w, out)
	// The answer leaves now, before the bookkeeping that runs when the handler returns (the
	// policy's Done, metrics, the access line): a server flushes a short body only then.
	w.Flush()
}

// readBody reads the whole body, at most limit bytes, in one allocation when the client
// announced its length.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		buf := make([]byte, n, n+1)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		// A body longer than announced is an error of the client; net/http already stops at
		// ContentLength, so nothing is left to read.
		return buf, nil
	}
	return io.ReadAll(rd)
}

func sessionKey(req *openai.Request, r *http.Request) string {
	if k := req.SessionKey(); k != "" {
		return k
	}
	return r.Header.Get("X-Session-Id")
}

// pin moves the endpoint that created the previous response to the front of ranked.
func (h *Handler) pin(ranked, cands []*endpoint.Endpoint, respID string) []*endpoint.Endpoint {
	name := h.State.pins.get(respID)
	if name == "" {
		return ranked
	}
	i := slices.IndexFunc(ranked, func(e *endpoint.Endpoint) bool { return e.Name == name })
	if i == 0 {
		return ranked
	}
	if i < 0 {
		j := slices.IndexFunc(cands, func(e *endpoint.Endpoint) bool { return e.Name == name })
		if j < 0 {
			return ranked // it left the pool or is unhealthy: the engine will say the id is unknown
		}
		return append([]*endpoint.Endpoint{cands[j]}, ranked...)
	}
	out := make([]*endpoint.Endpoint, 0, len(ranked))
	out = append(out, ranked[i])
	out = append(out, ranked[:i]...)
	return append(out, ranked[i+1:]...)
}

// served reports whether any endpoint, healthy or not, serves model for these labels.
func (h *Handler) served(model string, labels map[string]string) bool {
	for _, e := range h.Pool.All() {
		if !e.Serves(model) {
			continue
		}
		ok := true
		for k, v := range labels {
			if e.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// modelLabel bounds the model label to the models the config names.
func (h *Handler) modelLabel(model string) string {
	if h.Pool.HasModel(model) {
		return model
	}
	return "other"
}

func modelNotFound(model string) *openai.Error {
	return openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model", "model_not_found",
		"the model "+strconv.Quote(model)+" does not exist or is not served here (GET /v1/models lists them)")
}

func (h *Handler) serveModels(w *statusWriter, c *call) {
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
	for _, m := range h.Pool.Models() {
		if c.id != nil && len(c.id.Models) > 0 && !slices.Contains(c.id.Models, m) {
			continue
		}
		if c.id != nil && !h.served(m, c.id.EndpointLabels) {
			continue
		}
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "kvroute"})
	}
	b, _ := json.Marshal(list)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

func (h *Handler) writeError(w *statusWriter, c *call, e *openai.Error) {
	c.errType = e.Type
	openai.WriteError(w, e)
}

// proxyError answers when no endpoint could be reached, or a response could not be read.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		return // the client went away: nobody to answer
	}
	sw, _ := w.(*statusWriter)
	attempts := 1
	if c != nil {
		attempts = max(c.attempts, 1)
	}
	e := openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", "upstream_unreachable",
		"no endpoint could be reached after "+strconv.Itoa(attempts)+" attempt(s): "+errText(err))
	if sw != nil && c != nil {
		h.writeError(sw, c, e)
		return
	}
	openai.WriteError(w, e)
}

// errText is an error's text without URLs of the endpoints' query strings or bodies.
func errText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + " " + ue.URL + ": " + ue.Err.Error()
	}
	return err.Error()
}
