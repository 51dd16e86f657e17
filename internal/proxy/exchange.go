package proxy

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/scrape"
	"github.com/kvroute/kvroute/internal/tenant"
)

// This file holds the steps of a request that do not depend on how it travels: the HTTP
// handler drives them for the requests it proxies, and Exchange lets another front end (the
// Envoy ext_proc endpoint picker, internal/extproc, which sees the same request as gRPC
// messages while Envoy carries it) drive the very same ones.

// authenticate finds the request's tenant from its headers (Gate.Authenticate); on a 401 it
// sets WWW-Authenticate in out, the response's headers.
func (c *call) authenticate(hdr, out http.Header) *openai.Error { return c.identify(hdr, out, true) }

// maxRequestID bounds a client's x-request-id: a longer one is not taken (nor logged, nor
// echoed).
const maxRequestID = 128

// requestID sets the request's ids from the client's x-request-id (client; "" when none).
// Without tenants the client's id is the request's, as it came. With tenants (authentication
// on) the router makes its own for every request: clients choose theirs freely, so two tenants
// may send the same one, and neither the engines (vLLM derives its own request id from it)
// nor the access log may take one tenant's request for another's. The client's then goes back
// to it in the answer (echoedID) and to the access line as client_request_id.
func (c *call) requestID(client string) {
	if len(client) > maxRequestID {
		client = ""
	}
	switch {
	case c.h.Gate != nil && c.h.Gate.Tenants():
		c.rid, c.clientRID = c.h.NewRequestID(), client
	case client != "":
		c.rid = client
	default:
		c.rid = c.h.NewRequestID()
	}
}

// echoedID is the x-request-id the answer carries: the client's own where it sent one, else the
// request's.
func (c *call) echoedID() string {
	if c.clientRID != "" {
		return c.clientRID
	}
	return c.rid
}

// refused records the error the request is answered with, for the access line.
func (c *call) refused(e *openai.Error) {
	c.errType = e.Type
	if e.Code != nil {
		c.errCode = *e.Code
	}
}

// contentEncoding refuses a request whose body has a content coding (RFC 9110, 8.4.1; 415 with
// Accept-Encoding: identity, RFC 7694): the router reads the body as the JSON it must be, and
// sends the engine a body of its own making, so a compressed body reads as bytes that are no
// JSON (`invalid character '\x1f'`), and a plain one sent with the header would tell the
// engine it is compressed. identity (no coding) is taken.
func contentEncoding(hdr http.Header) *openai.Error {
	for _, v := range hdr.Values("Content-Encoding") {
		for coding := range strings.SplitSeq(v, ",") {
			if cc := textproto.TrimString(coding); cc != "" && !strings.EqualFold(cc, "identity") {
				return openai.NewError(http.StatusUnsupportedMediaType, openai.TypeInvalidRequest, "", "unsupported_content_encoding",
					"Content-Encoding "+strconv.Quote(logCut1(cc, 32))+" is not supported: send the request body uncompressed (no Content-Encoding header)")
			}
		}
	}
	return nil
}

// identify is authenticate; count false looks the key up without counting or logging a refusal
// (Gate.Lookup), for a request that is not an API call.
func (c *call) identify(hdr, out http.Header, count bool) *openai.Error {
	h := c.h
	if h.setup != nil {
		return openai.NewError(http.StatusInternalServerError, openai.TypeServer, "", "", h.setup.Error())
	}
	if h.Gate == nil {
		return nil
	}
	var id *tenant.Identity
	var oe *openai.Error
	if count {
		id, oe = h.Gate.Authenticate(hdr)
	} else {
		id, oe = h.Gate.Lookup(hdr)
	}
	if oe != nil {
		if oe.Status == http.StatusUnauthorized {
			out.Set("WWW-Authenticate", `Bearer realm="kvroute"`)
		}
		return oe
	}
	c.id = id
	return nil
}

// resolve says what a method and path ask for: an API call of kind, the model list (models),
// or an error (unknown path, wrong method).
func resolve(method, path string) (kind openai.Kind, models bool, oe *openai.Error) {
	if path == "/v1/models" {
		if method != http.MethodGet {
			return 0, false, openai.NewError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "", "method_not_allowed", "use GET for /v1/models")
		}
		return 0, true, nil
	}
	kind, ok := openai.KindForPath(path)
	if !ok {
		if to, ok := withoutSlash(path); ok {
			return 0, false, openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "", "unknown_url",
				"unknown path "+strconv.Quote(path)+": the path is "+to+", without the trailing slash")
		}
		return 0, false, openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "", "unknown_url",
			"unknown path "+strconv.Quote(path)+": kvroute serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and /v1/models")
	}
	if method != http.MethodPost {
		return 0, false, openai.NewError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "", "method_not_allowed", "use POST for "+path)
	}
	return kind, false, nil
}

// withoutSlash returns path without its trailing slash when that is one of the API's paths
// (/v1/chat/completions/ and the like).
func withoutSlash(path string) (string, bool) {
	p, ok := strings.CutSuffix(path, "/")
	if !ok {
		return "", false
	}
	if _, api := openai.KindForPath(p); api || p == "/v1/models" {
		return p, true
	}
	return "", false
}

// prepareOptions are what a front end changes in prepare.
type prepareOptions struct {
	// candidates, when set, narrows the available endpoints serving the model (and tenant)
	// before admission and the pick.
	candidates func([]*endpoint.Endpoint) []*endpoint.Endpoint
	// addUsage asks streams for their usage (stream_options.include_usage) when the client did
	// not, so that the router learns the cached tokens; the front end must then drop the
	// usage-only chunk (takeEvent says which) before the client sees it.
	addUsage bool
}

// hold waits d before the pick (route.Lifecycle.Hold); an error if ctx ends first (the client
// left: nothing was picked, nothing is counted against an endpoint).
func hold(ctx context.Context, d time.Duration) *openai.Error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return unrouted(ctx)
	}
}

// unrouted is the error of a request whose ctx ended while it waited to be routed.
func unrouted(ctx context.Context) *openai.Error {
	return openai.NewError(499, openai.TypeInvalidRequest, "", "client_closed_request", "the request ended before it was routed: "+ctx.Err().Error())
}

// awaitFirstCheck is for a request that found no candidate for model (and its tenant's
// labels) while an endpoint that would serve it has not had its first health check
// (Pool.FirstCheck): an engine auto endpoint stays out of rotation until that check finds its
// kind, and a request that came in the router's first moments would be refused because the
// router had just started. It waits until that check is recorded (or the pool changes), at
// most Handler.FirstCheckWait in all, and returns the candidates then (dst refilled; none when
// the check failed or took too long: the caller answers as it would have). An error if ctx
// ends first (the client left, or the shutdown cut the request).
func (c *call) awaitFirstCheck(ctx context.Context, model string, dst []*endpoint.Endpoint) ([]*endpoint.Endpoint, *openai.Error) {
	h, labels := c.h, c.labels()
	if h.FirstCheckWait < 0 {
		return dst, nil
	}
	changed := h.Pool.Changed() // taken before each look, so that no update falls between
	checked := h.Pool.FirstCheck(model, labels)
	if checked == nil {
		return dst, nil
	}
	wait := cmp.Or(h.FirstCheckWait, DefaultFirstCheckWait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	h.Logger.Debug("no endpoint is available for the request yet: it waits for the first health check of one that would serve it",
		"request_id", c.rid, "model", logCut1(model, maxLogPath), "at_most", wait.String())
	for checked != nil {
		select {
		case <-checked:
		case <-changed:
		case <-timer.C:
			return dst, nil
		case <-ctx.Done():
			return dst, unrouted(ctx)
		}
		if dst = h.Pool.Candidates(dst, model, labels); len(dst) > 0 {
			return dst, nil
		}
		changed, checked = h.Pool.Changed(), h.Pool.FirstCheck(model, labels)
	}
	return dst, nil
}

// prepare takes a request from its body to its pick: parse, routing keys, the tenant's limits
// (rate-limit headers set in out), the candidates, saturation, admission (which may wait, until
// ctx ends), a replica's hold (route.Lifecycle.Hold, likewise) and the lifecycle's Begin; then the body to forward. hdr is the request's headers.
// An error is the answer to give the client (Retry-After set in out where it applies).
func (c *call) prepare(ctx context.Context, kind openai.Kind, body []byte, hdr, out http.Header, opt prepareOptions) *openai.Error {
	h := c.h
	req, oe := parse(kind, body, c.scratch)
	if oe != nil {
		c.model = h.refusedModelLabel(openai.NamedModel(body), c.id)
		return oe
	}
	c.req = req
	c.stream = req.Stream
	c.model = h.modelLabel(req.Model)
	if req.N > maxChoices {
		return openai.AboveMax("n", maxChoices, strconv.Itoa(req.N), "the choices of one request, as OpenAI's API allows")
	}
	best := 0
	if kind == openai.KindCompletion {
		if best, oe = bestOf(body); oe != nil {
			return oe
		}
	}
	c.choices = max(req.N, 1) * max(req.Prompts(), 1)
	c.seqs = max(req.N, best, 1) * max(req.Prompts(), 1)
	c.keys(req, hdr)
	// The prompt is in its routing keys now: what the parser built of it (a prompt of token
	// ids is 8 bytes an id) need not live as long as the request.
	req.Messages, req.Prompt = nil, openai.Prompt{}
	var bound outputBound // the tenant's max_output_tokens: what the body asks, and what to write
	capped := c.id != nil && c.id.MaxOutputTokens > 0 && kind != openai.KindEmbedding
	if h.Gate != nil {
		d := tenant.Demand{Prompt: c.preq.PromptTokens, Seqs: c.seqs, MaxTokens: req.MaxTokens}
		if kind == openai.KindEmbedding {
			d.Seqs = 0 // nothing generated
		}
		if capped {
			// As the engine reads the body, not as the parser does (which takes names in any
			// case, and one of max_tokens and max_completion_tokens).
			if bound, oe = readOutputBound(kind, body); oe != nil {
				return oe
			}
			d.MaxTokens, d.MaxTokensField = bound.value, bound.field
		}
		t, oe := h.Gate.Take(c.id, d, out)
		if oe != nil {
			return oe
		}
		c.ticket = t
		if capped {
			// What the engine may generate for each sequence (generated's bound).
			req.MaxTokens = cmp.Or(bound.value, c.id.MaxOutputTokens)
		}
	}

	if c.id != nil && len(c.id.Models) > 0 && !slices.Contains(c.id.Models, req.Model) {
		c.model = metrics.UnknownModel
		return modelNotFound(req.Model)
	}
	cands := h.Pool.Candidates(make([]*endpoint.Endpoint, 0, 8), req.Model, c.labels())
	if len(cands) == 0 {
		if cands, oe = c.awaitFirstCheck(ctx, req.Model, cands); oe != nil {
			return oe
		}
	}
	if opt.candidates != nil && len(cands) > 0 {
		cands = opt.candidates(cands)
	}
	if len(cands) == 0 {
		oe := h.noCandidate(req.Model, c.labels(), out)
		if oe.Status == http.StatusNotFound {
			c.model = metrics.UnknownModel
		}
		return oe
	}
	if h.Saturated != nil && h.Saturated(cands) {
		out.Set("Retry-After", "1")
		return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "overloaded",
			"every endpoint serving "+strconv.Quote(req.Model)+" is saturated; retry shortly")
	}
	if h.Admit != nil {
		release, err := h.Admit(ctx, c.id, cands)
		if err != nil {
			var oe *openai.Error
			if !errors.As(err, &oe) {
				oe = openai.NewError(http.StatusTooManyRequests, "rate_limit_error", "", "rate_limited", err.Error())
			}
			if (oe.Status == http.StatusServiceUnavailable || oe.Status == http.StatusTooManyRequests) && out.Get("Retry-After") == "" {
				out.Set("Retry-After", "1")
				out.Set("retry-after-ms", "1000")
			}
			return oe
		}
		c.release = release
	}

	// The body to forward: the client's bytes, patched only where needed.
	c.body = body
	if h.Rewrite {
		nb, changed, err := openai.RewriteText(kind, c.body, h.Keys.Normalizer.Normalize)
		if err == nil && changed {
			c.body = nb
			h.Metrics.Rewrites.Inc()
		}
	}
	if oe := c.dropEngineFields(); oe != nil {
		return oe
	}
	if opt.addUsage && req.Stream && !req.IncludeUsage && (kind == openai.KindChat || kind == openai.KindCompletion) {
		if at, field, ok := openai.IncludeUsageSplice(c.body, req); ok {
			// Spliced in as the body is sent (a writev of three parts), not copied into it.
			c.spliceAt, c.splice = at, field
			c.dropUsage = true
		} else if nb, err := openai.WithIncludeUsage(c.body); err == nil {
			c.body = nb
			c.dropUsage = true
		}
	}
	if capped && !c.writeOutputBound(bound, req.MaxTokens) {
		return openai.BadRequest(bound.write, "the request body cannot be given the tenant's %s; send one JSON object", bound.write)
	}
	if c.id != nil && c.id.Salt != "" {
		// Built now, not when the first endpoint that honours the salt is tried: a body that
		// cannot be given the tenant's salt is refused, never sent without it.
		if c.salted = c.saltedParts(h); c.salted == nil {
			return openai.BadRequest("cache_salt", "the request body cannot be given the tenant's cache_salt; send one JSON object")
		}
	}

	if d := h.Lifecycle.Hold(&c.preq, cands, req.PreviousResponseID); d > 0 {
		if oe := hold(ctx, d); oe != nil {
			return oe
		}
		h.Metrics.Held.Inc()
		h.Metrics.HeldSeconds.Add(d.Seconds())
	}
	pickStart := time.Now()
	rc, err := h.Lifecycle.Begin(&c.preq, cands, req.PreviousResponseID, c.start)
	h.Metrics.PickDuration.Observe(time.Since(pickStart).Seconds())
	if err != nil {
		if h.allEjected(cands) {
			// Passive health checking took every candidate out (their engines refused or
			// failed requests): said in counts, as when their health checks fail.
			oe := h.noCandidate(req.Model, c.labels(), out)
			if oe.Status == http.StatusNotFound {
				c.model = metrics.UnknownModel
			}
			return oe
		}
		out.Set("Retry-After", "1")
		return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint", "no endpoint can take the request")
	}
	c.rc = rc
	c.routed = h.Lifecycle.Now()

	return nil
}

// maxChoices bounds a request's n, as OpenAI's API does, and a completions request's best_of:
// each choice is a sequence the engine generates, up to max_tokens, and the tenant's tokens
// per minute are settled only when the request ends (vLLM takes any n: the simulator answered
// n 1000 with 1000 choices).
const maxChoices = 128

// parse parses an API request body, its errors in the OpenAI shape; sc (nil: none) is where
// long message contents are decoded (openai.ParseScratch).
func parse(kind openai.Kind, body []byte, sc *openai.Scratch) (*openai.Request, *openai.Error) {
	req, err := openai.ParseScratch(kind, body, sc)
	if err != nil {
		var oe *openai.Error
		if !errors.As(err, &oe) {
			oe = openai.BadRequest("", "%v", err)
		}
		return nil, oe
	}
	return req, nil
}

// keys builds the request's routing key: canonical prompt, normalised, cut into chained block
// hashes seeded with the model and the salt the engine will use (the tenant's, when there is
// one).
func (c *call) keys(req *openai.Request, hdr http.Header) {
	salt := req.CacheSalt
	if c.id != nil {
		salt = c.id.Salt
		c.preq.Tenant = c.id.Name
	}
	c.preq.ID = c.rid
	c.h.Keys.FromOpenAI(&c.preq, req, salt)
	if c.preq.SessionKey == "" {
		c.preq.SessionKey = hdr.Get("X-Session-Id")
	}
}

// labels are the endpoint labels the request's tenant is limited to (nil: any endpoint).
func (c *call) labels() map[string]string {
	if c.id == nil {
		return nil
	}
	return c.id.EndpointLabels
}

// noCandidate is the answer when no endpoint can take a request for model, saying what is
// known of the endpoints that carry the tenant's labels:
//
//   - one whose config (or its engine's list) names the model is unavailable (unhealthy,
//     draining, ejected by passive health checking): 503 with Retry-After (set in out), as the
//     model is served, just not now, saying how many are out for each cause;
//   - else one whose models are unknown (no endpoints[].models, and no list from its engine
//     yet) is unavailable: it may serve any model, so 503 still, but the message says that no
//     endpoint is known to serve it, for a client whose model name is wrong;
//   - else endpoints named it and their engines answered that they do not serve it (a 404
//     naming it, Endpoint.NotServing): 404, saying so, and to check endpoints[].models;
//   - else none serves it: 404.
func (h *Handler) noCandidate(model string, labels map[string]string, out http.Header) *openai.Error {
	now := time.Now()
	health, at := h.Lifecycle.Health(), h.Lifecycle.Now()
	var down, draining, ejected, unknownDown, refused, up int
	var causes checkCauses // of down's health checks
	for _, e := range h.Pool.All() {
		if !hasLabels(e, labels) {
			continue
		}
		list := e.Models
		if len(list) == 0 {
			list = e.ServedModels()
		}
		switch {
		case e.Refuses(model, now):
			refused++
		case list == nil: // any model, as far as the router knows
			if e.Available() && !health.Ejected(e, at) {
				up++
			} else {
				unknownDown++
			}
		case !slices.ContainsFunc(list, func(m string) bool { return endpoint.SameModel(m, model) }):
		case e.Available() && health.Ejected(e, at):
			ejected++ // passive health checking took it out: its requests failed
		case e.Available():
			up++ // a candidate that the front end's narrowing left out (Exchange)
		case e.Draining():
			draining++
		default:
			down++ // its health checks fail
			if h.CheckFailure != nil {
				causes.add(h.CheckFailure(e))
			}
		}
	}
	unavailable := func(msg string) *openai.Error {
		out.Set("Retry-After", "1")
		return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint", msg)
	}
	q := strconv.Quote(model)
	switch {
	case up > 0:
		return unavailable("no healthy endpoint serves model " + q + "; retry shortly")
	case down > 0 || draining > 0 || ejected > 0:
		// Why, in counts (as the unknown models' message gives them): a client or an operator
		// told only "retry" cannot tell a fleet down from a model misnamed or drained. Counts
		// and causes only, never an endpoint's name or address: with tenants on, the client is
		// not the operator.
		var why []string
		if ejected > 0 {
			why = append(why, strconv.Itoa(ejected)+" ejected after failed requests")
		}
		if down > 0 {
			why = append(why, strconv.Itoa(down)+" failing "+pluralHealth(down)+causes.say(down))
		}
		if draining > 0 {
			why = append(why, strconv.Itoa(draining)+" draining (being removed)")
		}
		n := down + draining + ejected
		return unavailable("no healthy endpoint serves model " + q + ": " + count(n, "endpoint") + " serve" + sIfOne(n) +
			" it, none available now (" + strings.Join(why, ", ") + "); retry shortly (the admin listener's /debug/endpoints says why each is out)")
	case unknownDown > 0:
		msg := "no endpoint is known to serve model " + q + "; " + count(unknownDown, "endpoint") +
			" whose models are unknown (no endpoints[].models (--model), and not yet listed by the engine) " + isAre(unknownDown) +
			" unavailable: retry shortly if one of them serves it, else check the model's name (GET /v1/models lists the models known)"
		if refused > 0 {
			msg += "; the engines of " + count(refused, "endpoint") + " answered that they do not serve it"
		}
		return unavailable(msg)
	case refused > 0:
		return openai.NewError(http.StatusNotFound, openai.TypeInvalidRequest, "model", "model_not_found",
			"the model "+q+" is not served here: the engines of the "+count(refused, "endpoint")+
				" that would serve it answered that they do not (a 404 naming it); check endpoints[].models (--model) against the names the engines serve (their GET /v1/models); they are tried again within "+
				notServedFor.String())
	}
	return modelNotFound(model)
}

// checkCauses counts how the health checks of endpoints failed, by cause (scrape.CheckFailure
// worded): causes in the order first met, n[i] the endpoints of causes[i]. Neither names nor
// addresses: a tenant may read it.
type checkCauses struct {
	causes []string
	n      []int
}

// add counts one endpoint's last check: "connection refused", "timed out", "answered 503";
// one that failed otherwise (an engine kind not detected) is "other"; one not known to have
// failed is not counted.
func (c *checkCauses) add(why scrape.CheckFailure, failed bool) {
	if !failed {
		return
	}
	cause := "other"
	switch {
	case why.Refused:
		cause = "connection refused"
	case why.Timeout:
		cause = "timed out"
	case why.Status != 0:
		cause = "answered " + strconv.Itoa(why.Status)
	}
	if i := slices.Index(c.causes, cause); i >= 0 {
		c.n[i]++
		return
	}
	c.causes = append(c.causes, cause)
	c.n = append(c.n, 1)
}

// say is what follows "N failing their health checks" of down endpoints: ": connection
// refused" where every one of them failed so, " (2 connection refused, 1 answered 503)" where
// they differ or the causes of some are not known; "" where none is.
func (c *checkCauses) say(down int) string {
	switch {
	case len(c.causes) == 0:
		return ""
	case len(c.causes) == 1 && c.n[0] == down:
		return ": " + c.causes[0]
	}
	parts := make([]string, len(c.causes))
	for i, cause := range c.causes {
		parts[i] = strconv.Itoa(c.n[i]) + " " + cause
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// allEjected reports whether passive health checking has taken every one of cands out now
// (what Lifecycle.Begin found, unless one came back since). Asked only once Begin has failed.
func (h *Handler) allEjected(cands []*endpoint.Endpoint) bool {
	health, now := h.Lifecycle.Health(), h.Lifecycle.Now()
	for _, e := range cands {
		if !health.Ejected(e, now) {
			return false
		}
	}
	return len(cands) > 0
}

// count is n and noun, plural when n is not 1.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// pluralHealth is "its health check" or "their health checks".
func pluralHealth(n int) string {
	if n == 1 {
		return "its health check"
	}
	return "their health checks"
}

// sIfOne is the verb's s for a subject of n: "serves" for 1.
func sIfOne(n int) string {
	if n == 1 {
		return "s"
	}
	return ""
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

// takeEvent reads one event of a streamed answer (usage, llama.cpp's timings, the response id,
// the stream's terminator) and reports whether to pass it on: not the usage chunk the router
// asked for on the client's behalf. Where the router asked for the usage and the engine put it
// in a chunk that carries more (ollama's completions put zeros in every token's chunk; vLLM's
// continuous_usage_stats the usage so far), omit is the member's place in ev.Data
// (openai.UsageMember), to leave out of what the client gets: it would not have had it
// without the router. omit is [0, 0) otherwise.
func (c *call) takeEvent(ev openai.Event) (pass bool, omitFrom, omitTo int) {
	if n, ok := openai.TimingsCached(ev.Data); ok {
		c.timingsCached = n
	}
	if len(ev.Data) > 0 && bytes.Contains(ev.Data, []byte(`"usage"`)) {
		if u, ok := openai.ScanUsage(ev.Data); ok {
			if u.Prompt() > 0 || u.Completion() > 0 {
				// All zeros is no usage: an engine's placeholder in every token's chunk
				// (ollama's completions, once asked for usage), which taken as the usage would
				// charge a stream cut before its real usage nothing (call.charge).
				c.setUsage(u)
			}
			if c.dropUsage {
				if openai.IsUsageOnlyChunk(ev.Data) {
					return false, 0, 0
				}
				if from, to, ok := openai.UsageMember(ev.Data); ok {
					omitFrom, omitTo = from, to
				}
			}
		}
	}
	if c.req != nil && c.req.Kind == openai.KindResponse && c.respID == "" && len(ev.Data) > 0 {
		c.respID = openai.ResponseID(ev.Data)
	}
	if ev.Ends() {
		c.complete = true
	}
	if obj := ev.EngineError(); obj != nil || ev.Name == "error" || ev.Name == "response.failed" {
		if !c.streamErr && obj != nil {
			c.streamStatus = openai.ErrorStatus(obj)
		}
		c.streamErr = true
	} else if contentEvent(ev) {
		c.contentEvents++
	}
	return true, omitFrom, omitTo
}

// contentEvent reports whether ev carries generated text: a Responses API event whose name ends
// in ".delta", or a chat or completion chunk with a non-empty string as its content, text,
// reasoning or tool-call arguments (not the first chunk's role, an empty content, a finish
// reason or a usage alone).
func contentEvent(ev openai.Event) bool {
	if ev.Name != "" && ev.Name != "message" {
		return strings.HasSuffix(ev.Name, ".delta")
	}
	if len(ev.Data) == 0 || ev.Data[0] != '{' {
		return false
	}
	for _, k := range contentKeys {
		if nonEmptyString(ev.Data, k) {
			return true
		}
	}
	return false
}

// contentKeys are the names, quoted, of the members that carry generated text in a chunk
// ("delta" is a string in a Responses API event sent without its name; in a chat chunk it is
// an object, which nonEmptyString passes over).
var contentKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"delta"`),
	[]byte(`"reasoning_content"`), []byte(`"reasoning"`), []byte(`"arguments"`)}

// nonEmptyString reports whether data has a member named key (quoted) whose value is a
// non-empty string. A name inside a string value has its quotes escaped, so it is not found.
func nonEmptyString(data, key []byte) bool {
	for {
		i := bytes.Index(data, key)
		if i < 0 {
			return false
		}
		data = data[i+len(key):]
		j := skipSpace(data, 0)
		if j < len(data) && data[j] == ':' {
			if j = skipSpace(data, j+1); j+1 < len(data) && data[j] == '"' && data[j+1] != '"' {
				return true
			}
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// takeBody reads a whole non-streamed answer: usage, llama.cpp's timings, the response id. An
// answer to a stream request that came under another Content-Type than text/event-stream
// (text/plain, application/json: the relay passes it on as it comes) is read as the events it
// holds, as a stream's are. A 2xx answer that is neither is a bad answer (jsonAnswer) when it is
// not the JSON it must be.
func (c *call) takeBody(body []byte) {
	if c.stream && eventsIn(body) {
		c.takeEvents(body)
		return
	}
	if c.answerStatus < 300 && !jsonAnswer(body) {
		c.badAnswer = true
	}
	if u, ok := openai.ScanUsage(body); ok {
		c.setUsage(u)
	}
	if n, ok := openai.TimingsCached(body); ok {
		c.timingsCached = n
	}
	if c.req != nil && c.req.Kind == openai.KindResponse {
		c.respID = openai.ResponseID(body)
	}
}

// eventsIn reports whether body, a whole answer, begins as an event stream does (a "data:" or
// "event:" field, or a comment).
func eventsIn(body []byte) bool {
	b := bytes.TrimLeft(body[skipBOM(body, 0):], " \t\r\n")
	return bytes.HasPrefix(b, []byte("data:")) || bytes.HasPrefix(b, []byte("event:")) || bytes.HasPrefix(b, []byte(":"))
}

// takeEvents reads the events of a stream that came whole (takeBody) as they would have been
// read passing (takeEvent): usage, content events, the terminator. A part of an event at the
// end is not read, as in a stream. An event that is no event of the API (Malformed) makes the
// answer a bad one (badAnswer, error_type stream_bad_event): it was relayed before it could be
// seen, but it is not counted as served.
func (c *call) takeEvents(body []byte) {
	r := openai.NewSSEReader(bytes.NewReader(body), maxEvent)
	for {
		ev, err := r.Next()
		if err != nil || cutInside(ev) && !foreignCut(ev) {
			return
		}
		if ev.Malformed() {
			c.badEventPassed(ev)
			return
		}
		c.takeEvent(ev)
	}
}

// badEventPassed records that an event that is no event of the API went out in a stream
// relayed as it came (under another Content-Type than text/event-stream): the answer is a bad
// one (badAnswer, error_type stream_bad_event), settled as such and said once (settle).
func (c *call) badEventPassed(ev openai.Event) {
	if !c.badAnswer {
		c.badAnswer = true
		c.errType, c.errCode = "stream_bad_event", codeBadAnswer
		c.badWhat = malformedWhat(ev)
	}
}

// jsonAnswer reports whether body can be the JSON object every API answer is: it starts and
// ends as an object does, which an answer cut inside, an empty one or an HTML error page does
// not. Not checked whole: json.Valid took 2.2 µs for a 1 KiB answer and 0.25 ms for 64 KiB (on
// a 2-core test machine), where the handler's own work on a request is some 30 to 60 µs.
func jsonAnswer(body []byte) bool {
	b := bytes.TrimSpace(body)
	return len(b) >= 2 && b[0] == '{' && b[len(b)-1] == '}'
}

// settle ends a request whose answer went out with status: the admission's release, the
// lifecycle (endpoint counters, the policy's Done), the tenant's ticket, metrics and the
// access line.
func (c *call) settle(status int, method, path string) {
	h := c.h
	if c.release != nil {
		c.release()
		c.release = nil
	}
	c.cached = c.cachedTokens()
	prompt, completion := 0, 0
	if c.req != nil {
		prompt = c.preq.PromptTokens
		if c.haveUsage && c.usage.Prompt() > 0 {
			prompt = c.usage.Prompt()
		}
		completion = c.usage.Completion()
	}
	ep := c.ep()
	bad := c.badAnswer && status < 400 // relayed before it was known (ext_proc); serve answers 502 instead
	if c.badAnswer {
		if c.errCode == "" {
			c.errType, c.errCode = openai.TypeUpstream, codeBadAnswer
		}
		name := ""
		if ep != nil {
			name = ep.Name
		}
		if c.badWhat != "" {
			// A stream relayed as it came (otherStream, takeEvents), not cut: said as
			// sseBody's cut of such a stream is (call.badEvent).
			h.Logger.Warn("the engine sent an event that is no event of the API in a stream relayed as it came (its Content-Type is not text/event-stream), counted as a failure of the endpoint",
				"request_id", c.rid, "endpoint", name, "event", c.badWhat)
		} else {
			h.Logger.Warn("the engine's answer is not a JSON object: counted as a failure of the endpoint", "request_id", c.rid, "endpoint", name)
		}
	}
	var ttft time.Duration
	if c.rc != nil {
		ttft = c.rc.TTFT()
		f := c.failure(status)
		if bad {
			f = route.FailStatus
		}
		c.rc.Finish(route.Outcome{
			OK: status < 400 && !bad, CachedTokens: c.cached, PromptTokens: c.usage.Prompt(), OutputTokens: c.usage.Completion(),
			ResponseID: c.respID, Failure: f,
		})
	}
	end := time.Now()
	if h.Lifecycle != nil {
		end = h.Lifecycle.Now()
	}
	dur := end.Sub(c.start)
	c.learnRate(status, end)
	epName := metrics.NoEndpoint
	if ep != nil {
		epName = ep.Name
		h.Metrics.PromptTokens.WithLabelValues(c.model).Add(float64(prompt))
		h.Metrics.CompletionTokens.WithLabelValues(c.model).Add(float64(completion))
		// The prediction is in the router's tokens; the engine's cached count in its own.
		predicted := c.rc.Predicted()
		if predicted > 0 {
			predicted = int(math.Round(float64(predicted) * ep.TokenScale()))
		}
		h.Metrics.PredictedCachedTokens(c.model, epName, predicted)
		if c.cached >= 0 {
			h.Metrics.EngineCached.WithLabelValues(c.model).Add(float64(c.cached))
			h.Metrics.CachedReported.WithLabelValues(c.model).Add(float64(prompt))
		}
		if ttft > 0 && c.stream {
			h.Metrics.TTFT.WithLabelValues(c.model).Observe(ttft.Seconds())
		}
	}
	chargedPrompt, chargedCompletion := 0, 0
	switch {
	case c.ticket != nil:
		chargedPrompt, chargedCompletion = c.charge(status, end)
		if c.learns(status) && c.req.Kind != openai.KindEmbedding {
			// What the tenant's next requests reserve for their completions (tenant.Demand).
			c.ticket.Learn(float64(c.usage.Completion()) / float64(max(c.choices, 1)))
		}
		c.ticket.End(status, chargedPrompt, chargedCompletion)
	case h.Gate != nil && status != http.StatusUnauthorized && status != http.StatusTooManyRequests && !c.listing:
		h.Gate.Count(c.id, status) // the gate counted its own refusals
	}
	model := c.model
	if model == "" {
		model = metrics.UnknownModel
	}
	// A request that no endpoint answered, but whose last attempt reached one (its connection
	// lost after the request, or no answer in time), is counted on that endpoint: an engine that fails every
	// request it is sent shows on its own series, not under none. So is one whose client left
	// while its attempt was at an engine (499): the engine it waited for is named. An answer
	// that is no endpoint's (Exchange.AnsweredElsewhere) names none.
	tried := ep
	if tried == nil && c.rc != nil && c.rc.Attempts() > 0 && !c.elsewhere {
		switch {
		case status >= 500 && c.rc.LastFailure() != route.FailConnect, status == 499 && c.reachedEngine():
			tried = c.rc.Endpoint()
		}
	}
	if tried != nil {
		epName = tried.Name
	}
	if !c.listing {
		h.Metrics.Requests.WithLabelValues(model, epName, metrics.Status(status)).Inc()
		// The access line's error_type and error_code, which the status alone does not tell apart.
		h.Metrics.RequestError(model, epName, c.errType, c.errCode)
		h.Metrics.Duration.WithLabelValues(model).Observe(dur.Seconds())
	}
	moved := ""
	if c.rc != nil {
		if moved = c.rc.Moved(); moved != "" {
			h.Metrics.Moved.WithLabelValues(c.rc.Ranked()[0].Name, moved).Inc()
		}
	}
	if !h.Logger.Enabled(context.Background(), slog.LevelInfo) {
		return // the access log is off (log.access: false): none of its line is built
	}
	if status == http.StatusUnauthorized && !h.unauth.allow(c.remote, c.errCode) {
		return // one of many from its client: counted, and the count written (unauthLog)
	}
	var attrBuf [26]slog.Attr // every attribute below, on the stack
	logPath, cut := logCut(path, maxLogPath)
	attrs := append(attrBuf[:0],
		slog.String("request_id", c.rid),
		slog.String("method", logCut1(method, maxLogMethod)),
		slog.String("path", logPath),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(dur.Microseconds())/1000),
	)
	if c.remote != "" {
		attrs = append(attrs, slog.String("remote_addr", c.remote))
	}
	if c.clientRID != "" {
		// The client's own x-request-id, where the router made request_id (tenants on).
		attrs = append(attrs, slog.String("client_request_id", c.clientRID))
	}
	if cut {
		attrs = append(attrs, slog.Int("path_bytes", len(path)))
	}
	if c.via != "" {
		attrs = append(attrs, slog.String("via", c.via))
	}
	if c.req != nil {
		// completion_tokens: the engine's usage, else what was relayed (relayedCompletion, as
		// the tenant is charged); kvroute_completion_tokens_total counts the usage alone.
		attrs = append(attrs, slog.String("model", logCut1(c.req.Model, maxLogPath)), slog.Bool("stream", c.stream),
			slog.Int("prompt_tokens", prompt), slog.Int("completion_tokens", c.relayedCompletion()), slog.Int("cached_tokens", c.cached))
	}
	if tried != nil {
		attrs = append(attrs, slog.String("endpoint", tried.Name))
	}
	if c.rc != nil {
		attrs = append(attrs, slog.Int("attempts", c.attempts()))
		if p := c.rc.Predicted(); p >= 0 {
			// Beside cached_tokens (the engine's report): a miss the index did not expect.
			attrs = append(attrs, slog.Int("predicted_cached_tokens", p))
		}
		if moved != "" {
			// The first endpoint tried was not the policy's pick, and why.
			attrs = append(attrs, slog.String("moved_by", moved))
		}
	}
	if ttft > 0 && c.stream {
		attrs = append(attrs, slog.Float64("ttft_ms", float64(ttft.Microseconds())/1000))
	}
	if c.id != nil {
		// What the tenant's tokens_per_minute was charged, which is not always the engine's
		// usage above (call.charge): nothing for a request no engine took, an estimate where
		// the usage never came, the prompts of attempts given up for another.
		attrs = append(attrs, slog.String("tenant", c.id.Name),
			slog.Int("charged_prompt_tokens", chargedPrompt), slog.Int("charged_completion_tokens", chargedCompletion))
	}
	if c.removed != nil {
		attrs = append(attrs, slog.String("removed_fields", strings.Join(c.removed, ",")))
	}
	if c.errType != "" {
		attrs = append(attrs, slog.String("error_type", c.errType))
	}
	if c.errCode != "" {
		attrs = append(attrs, slog.String("error_code", c.errCode))
	}
	if c.unterminated && !c.cut {
		// The engine ended the stream without its terminator, on purpose (no error): said, as
		// such an answer may be short of what was asked (sseBody.endedUnterminated).
		attrs = append(attrs, slog.String("stream_end", "no_terminator"))
	}
	h.Logger.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// charge is what the request, answered with status at end, costs its tenant, in prompt and
// completion tokens. Nothing when no engine can have computed any of it: refused before the
// pick, or every attempt a connection that failed or an engine's refusal (503, 429, 404).
// Otherwise, whether the engine answered or not (the client left first, the attempt timed out,
// the connection broke, the stream was cut), the usage the engine reported, else the router's
// estimate of the prompt and the completion relayedCompletion counts: for a stream, one
// completion token per content event passed on (contentEvent). An approximation: vLLM and
// SGLang send one token per event, so that the count is theirs; where an event carries several
// (speculative decoding, an engine that batches its writes) it is less. A stream that did not
// reach its terminator is charged at least that count even where a usage came (the usage so
// far, in an engine's every chunk, may lag what was relayed). A completions request whose
// best_of is more than its n is charged that completion times best_of/n (unseen).
//
// A non-streamed answer that never came (the client left, the response timeout, the answer
// broke off) shows nothing of what its engine generated meanwhile, which may be n choices (or
// best_of sequences) of max_tokens each: it is charged the estimate of generated, from the
// time since it was routed and the engine's decode rate as learnt from its complete answers
// (tenant.DecodeRates). Without it a tenant could ask for long answers and hang up before
// they came, its limit charged the prompts alone (4 requests of n 50 and max_tokens 5000,
// given up after 15 s, had the engines generate 275,050 tokens and were charged 4 prompt
// tokens each).
//
// The completion charged is at most what the request allowed (completionAllowed: max_tokens, or
// the tenant's max_output_tokens, for each sequence), where it says.
//
// Each attempt that reached an engine and was then given up for another (no answer's head, or
// no first event, within its timeout: the only failure that is retried once the engine had the
// request) adds its prompt's estimate: its engine may have computed the prefill, and a client
// whose prompts make every attempt time out would otherwise have 1 + limits.max_retries
// prefills a request for the price of one. Attempts Envoy makes (Exchange) are not seen here:
// docs/security.md says what they may cost.
func (c *call) charge(status int, end time.Time) (prompt, completion int) {
	if c.req == nil || !c.reachedEngine() {
		return 0, 0
	}
	prompt = c.preq.PromptTokens
	if c.haveUsage && c.usage.Prompt() > 0 {
		prompt = c.usage.Prompt()
	}
	// The one that reached an engine last is counted above. Each count is within [0,
	// math.MaxInt32] (the usage is bounded as it is read: boundUsage), and so are the sums.
	prompt = clampTokens(float64(prompt) + float64(max(c.reached-1, 0))*float64(c.preq.PromptTokens))
	if !c.stream && !c.complete && !c.haveUsage {
		completion = c.generated(end)
	} else {
		completion = c.unseen(c.relayedCompletion())
	}
	if allowed := c.completionAllowed(); allowed > 0 {
		// Never more than the request allowed, whatever the engine said or the router
		// counted: an engine that ignores max_tokens is the endpoint's fault, not the
		// tenant's (its content events, one token each, charged 3.6 million tokens for a
		// max_tokens of 5).
		completion = min(completion, allowed)
	}
	return prompt, completion
}

// unseen scales completion, the tokens of the sequences an answer returns, to the sequences
// its engine generated: best_of k above n generates k sequences for each prompt and returns
// the n best, and vLLM's usage counts the n it returns (it sums the outputs of its answer).
// An engine that ignores best_of is charged for sequences it did not generate: best_of is
// asked for by the client, and charged as n is.
func (c *call) unseen(completion int) int {
	if c.seqs <= c.choices || c.choices <= 0 {
		return clampTokens(float64(completion))
	}
	return clampTokens(math.Ceil(float64(completion) * float64(c.seqs) / float64(c.choices)))
}

// relayedCompletion is the request's completion tokens as far as the router saw them: the
// engine's usage for an answer read to its end; else, for a stream, at least one token per
// content event relayed (the usage so far, where one came, may lag them).
func (c *call) relayedCompletion() int {
	if c.haveUsage && c.complete {
		return c.usage.Completion()
	}
	return max(c.usage.Completion(), c.contentEvents)
}

// generated estimates the tokens an engine generated for a non-streamed request whose answer
// never came, at end: for each of its sequences (n choices of each prompt, or best_of where
// that is more), the time since the request was routed times the endpoint's decode rate
// (tenant.DecodeRates, at most tenant.MaxDecodeRate), at most max_tokens; the whole at most
// math.MaxInt32 (a learnt rate of 3e18 a second, for 5 s and 4 choices, overflowed the int
// it was converted to: a charge of -9.2e18). Nothing for embeddings (no generation), nor for a
// request never routed, nor without a gate (nobody to charge).
func (c *call) generated(end time.Time) int {
	if c.rc == nil || c.routed.IsZero() || c.req.Kind == openai.KindEmbedding || c.h.Gate == nil {
		return 0
	}
	name := ""
	if ep := c.rc.Endpoint(); ep != nil {
		name = ep.Name
	}
	rate, _ := c.h.Gate.DecodeRates().Rate(name)
	per := end.Sub(c.routed).Seconds() * min(rate, tenant.MaxDecodeRate)
	if c.req.MaxTokens > 0 {
		per = min(per, float64(c.req.MaxTokens))
	}
	return clampTokens(math.Round(max(per, 0) * float64(max(c.seqs, 1))))
}

// learns reports whether the request's answer, which went out with status, tells what it
// generated: a complete answer with the engine's usage.
func (c *call) learns(status int) bool {
	return status < 300 && c.complete && c.haveUsage && !c.badAnswer && c.req != nil
}

// learnRate teaches the gate's decode rates (generated) what a request answered at end shows:
// a complete answer of the engine's usage, from a single attempt, generated its completion
// tokens per sequence in the time since it was routed (queueing and prefill included, as in
// the time an estimate is made from). The usage counts the sequences the answer returns
// (unseen), each generated alongside the others. Without a gate there is nothing to charge.
func (c *call) learnRate(status int, end time.Time) {
	if c.h.Gate == nil || !c.learns(status) || c.routed.IsZero() || c.rc == nil || c.attempts() != 1 || c.ep() == nil {
		return
	}
	c.h.Gate.DecodeRates().Learn(c.ep().Name, float64(c.usage.Completion())/float64(max(c.choices, 1)), end.Sub(c.routed))
}

// reachedEngine reports whether an attempt of the request reached an engine: as Handler.send
// saw it, or, where a front end carried the request (Exchange), whenever it was routed and the
// answer it was given (Exchange.Answered) was not a refusal (503, 429: the engine's, or the
// front end's own when it could not connect; 404) nor a redirect (3xx: an endpoint whose URL is
// not the API's address computes nothing, and Handler.send does not count one as reached
// either; nor does a front end's own). That answer, not the status the request is settled
// with: a stream the router's shutdown cut after the engine's 200 is settled 503
// (shutting_down), and was computed all the same.
func (c *call) reachedEngine() bool {
	if !c.carried {
		return c.reached > 0
	}
	if c.local {
		return false
	}
	refused := c.answered && (c.answerStatus == http.StatusServiceUnavailable || c.answerStatus == http.StatusTooManyRequests ||
		c.answerStatus == http.StatusNotFound || c.answerStatus >= 300 && c.answerStatus < 400)
	return c.rc != nil && c.rc.Attempts() > 0 && !refused
}

// Bounds of what the access line takes from the client as it came: the path (of a request
// that may not even be authenticated) and the model can be as long as a request's head or body
// allows, a megabyte or more a line.
const (
	maxLogPath   = 256
	maxLogMethod = 32
)

// logCut returns s cut to at most n bytes, at a character's start and as valid UTF-8, with
// "..." after a cut, and whether it cut. An s of at most n bytes comes back as it is.
func logCut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	i := n
	for j := 0; j < utf8.UTFMax-1 && i > 0 && !utf8.RuneStart(s[i]); j++ {
		i-- // not inside a character that the cut would split
	}
	return strings.ToValidUTF8(s[:i], "\uFFFD") + "...", true
}

// logCut1 is logCut without its report.
func logCut1(s string, n int) string {
	s, _ = logCut(s, n)
	return s
}

// Exchange is one request's passage through the router's steps, for a front end that carries
// the request itself (internal/extproc: Envoy carries it, kvroute picks): the same
// authentication, parsing, routing keys, tenant limits, admission, pick, learning from the
// answer, metrics and access line as the HTTP handler's, as plain calls. In order:
// Authenticate, Resolve, Prepare (or Models), then, as the answer passes, Answered, Event or
// Body, and Settle once. An Exchange is driven by one goroutine at a time.
type Exchange struct{ c *call }

// NewExchange starts a request that arrived now, carrying the client's x-request-id
// (requestID; "" when none). Its ids are the HTTP handler's (call.requestID): without tenants
// the client's id, as it came (a new one where it sent none, or one longer than 128 bytes);
// with tenants one of the router's making, the client's kept for the answer (EchoedID) and the
// access line's client_request_id. via names the front end in the access line ("ext_proc").
func (h *Handler) NewExchange(requestID, via string) *Exchange {
	h.once.Do(h.init)
	c := &call{h: h, cached: -1, timingsCached: -1, via: via, carried: true}
	if h.Lifecycle != nil {
		c.start = h.Lifecycle.Now()
	} else {
		c.start = time.Now()
	}
	c.requestID(requestID)
	return &Exchange{c: c}
}

// RequestID is the request's id: the engines' x-request-id, the access line's request_id, the
// one error messages quote.
func (x *Exchange) RequestID() string { return x.c.rid }

// EchoedID is the x-request-id the client gets back in the answer: its own where it sent one
// (with tenants, RequestID is the router's), else RequestID.
func (x *Exchange) EchoedID() string { return x.c.echoedID() }

// Handler is the handler whose settings the exchange follows.
func (x *Exchange) Handler() *Handler { return x.c.h }

// Authenticate finds the request's tenant from its headers. An error is the answer (a 401 sets
// WWW-Authenticate in out, the response's headers).
func (x *Exchange) Authenticate(hdr, out http.Header) *openai.Error {
	return x.c.authenticate(hdr, out)
}

// Resolve says what a method and path ask for: an API call of kind, the model list (models:
// answer with Models), or an error to answer with.
func Resolve(method, path string) (kind openai.Kind, models bool, oe *openai.Error) {
	return resolve(method, path)
}

// Models is the JSON body of GET /v1/models for the request's tenant.
func (x *Exchange) Models() []byte { return x.c.modelList() }

// PrepareOptions are what a front end changes in Prepare.
type PrepareOptions struct {
	// Candidates, when set, narrows the available endpoints that serve the request's model
	// (and tenant) before admission and the pick; it may return its argument changed.
	Candidates func([]*endpoint.Endpoint) []*endpoint.Endpoint
	// AddUsage asks streams for their usage when the client did not; the front end must then
	// drop the events Event says not to pass.
	AddUsage bool
}

// Prepare takes the request from its body to its pick (parse, routing keys, the tenant's
// limits, the candidates, admission, which may wait until ctx ends, and the lifecycle's Begin).
// hdr is the request's headers; headers for the answer (rate limits, Retry-After) are set in
// out. An error is the answer to give.
func (x *Exchange) Prepare(ctx context.Context, kind openai.Kind, body []byte, hdr, out http.Header, opt PrepareOptions) *openai.Error {
	if oe := contentEncoding(hdr); oe != nil {
		out.Set("Accept-Encoding", "identity")
		return oe
	}
	return x.c.prepare(ctx, kind, body, hdr, out, prepareOptions{candidates: opt.Candidates, addUsage: opt.AddUsage})
}

// Refused records that the request was answered with e (its type and code go to the access line).
func (x *Exchange) Refused(e *openai.Error) { x.c.refused(e) }

// Request is the parsed request (nil before Prepare parsed it).
func (x *Exchange) Request() *openai.Request { return x.c.req }

// Tenant is the request's tenant (nil without tenants).
func (x *Exchange) Tenant() *tenant.Identity { return x.c.id }

// Call is the request's lifecycle call (nil before the pick).
func (x *Exchange) Call() *route.Call { return x.c.rc }

// Body is what to send to ep: the body to forward, with the tenant's cache_salt when ep
// honours it.
func (x *Exchange) Body(ep *endpoint.Endpoint) []byte { return x.c.bodyFor(x.c.h, ep) }

// Answered records that an endpoint answered with status (a response head came back).
func (x *Exchange) Answered(status int) { x.c.answered, x.c.answerStatus = true, status }

// AnsweredElsewhere records that the request was answered with status by no endpoint of its
// call: an address the router did not pick (the front end's own balancing sent it there), or
// the front end itself (Envoy's own answer: no healthy upstream, no route). The answer is
// nobody's that the router judges: no endpoint is credited or charged with it (the attempt
// still open, if any, is closed as nobody's failure), and kvroute_requests_total and the
// access line name no endpoint. As with Answered, a 503, 429 or 404 is a refusal, which costs
// the tenant nothing (call.charge).
func (x *Exchange) AnsweredElsewhere(status int) {
	c := x.c
	c.answered, c.answerStatus, c.elsewhere = true, status, true
	if c.rc != nil {
		c.rc.Fail(route.FailNone) // nothing where no attempt is open
	}
}

// AnsweredLocally is AnsweredElsewhere for an answer the front end gave itself where no
// engine had the request (Envoy's no healthy upstream, its circuit breaker, a request it
// refused for the client's doing: a 408, a 413): whatever its status, it costs the tenant
// nothing, as a refusal does (call.charge), and the whole reservation is released.
func (x *Exchange) AnsweredLocally(status int) {
	x.AnsweredElsewhere(status)
	x.c.local = true
}

// Attempted records how many upstream attempts the front end made for the request (Envoy's
// attempt count), where it says: the access line's attempts, and the one attempt from which a
// decode rate is learnt, are counted so, rather than by the lifecycle, which counts every
// endpoint the call was moved past. n <= 0 leaves the lifecycle's count.
func (x *Exchange) Attempted(n int) { x.c.frontAttempts = max(n, 0) }

// Event reads one event of a streamed answer and reports whether to pass it on. Where the
// router asked for the usage (PrepareOptions.AddUsage) and the engine put it in a chunk that
// carries more (ollama's completions: zeros in every token's chunk), [omitFrom, omitTo) is the
// usage member's place in ev.Data, to leave out of what the client gets, as `kvroute serve`
// does (openai.UsageMember); it is [0, 0) otherwise.
//
// An event that is no event of the API (openai.Event.Malformed: a line that is no field, a NUL,
// bytes not UTF-8, data not a JSON object) is not passed on: the stream is the engine's bad
// answer, settled as `kvroute serve` settles it (a 502 stream_bad_event counted against the
// endpoint, once the front end settles it with that status: BadStream), and no event after
// it is read. Until December 2026 it passed here as a clean 200.
func (x *Exchange) Event(ev openai.Event) (pass bool, omitFrom, omitTo int) {
	if x.c.badStream != nil {
		return false, 0, 0
	}
	if ev.Malformed() {
		x.c.badEvent(ev)
		return false, 0, 0
	}
	return x.c.takeEvent(ev)
}

// BadStream is the error that ends a stream whose engine sent an event that is no event of the
// API (Event), to write as the client's last event (openai.WriteEvent "error") where the front
// end still can, as `kvroute serve` writes it; nil when none came. Such a request is settled
// with 502.
func (x *Exchange) BadStream() *openai.Error { return x.c.badStream }

// Whole reads a whole non-streamed answer body (usage, response id) and marks it complete. An
// engine's 404 whose body names the request's model leaves its endpoint out for that model, as
// when the HTTP handler meets it (call.notServed).
func (x *Exchange) Whole(body []byte) {
	c := x.c
	if ep := c.ep(); ep != nil && c.answerStatus == http.StatusNotFound {
		c.notServed(ep, body)
	}
	c.takeBody(body)
	c.complete = true
}

// Complete records that the answer was read to its end.
func (x *Exchange) Complete() { x.c.complete = true }

// Completed reports whether the answer was read to its end (a stream: to its terminator).
func (x *Exchange) Completed() bool { return x.c.complete }

// StreamFailed reports whether the engine's stream carried an error event (it failed after its
// head: vLLM's {"error": ...}, a Responses API error or response.failed event), which the HTTP
// handler settles as a 502 stream_error whatever end the stream had.
func (x *Exchange) StreamFailed() bool { return x.c.streamErr }

// Cut records that the engine's answer ended before its end (error_type stream_cut on the
// access line, as `kvroute serve` says it).
func (x *Exchange) Cut() {
	x.c.cut = true
	if x.c.errType == "" {
		x.c.errType = "stream_cut"
	}
}

// Unterminated records that the engine ended its stream's body properly after its last event,
// without a terminator ([DONE], or a Responses API terminal event): on purpose, as ollama ends
// a stream at its token-repeat limit. As in `kvroute serve` (sseBody.endedUnterminated), that is
// an end and not a cut: settled with the answer's status, not a failure of the endpoint, the
// access line saying stream_end "no_terminator", the tenant charged as for a stream whose usage
// did not come (call.charge).
func (x *Exchange) Unterminated() { x.c.unterminated = true }

// Settle ends the request, whose answer went out with status (499: the client went away):
// the lifecycle, the tenant's ticket, metrics and the access line. Call it once.
func (x *Exchange) Settle(status int, method, path string) { x.c.settle(status, method, path) }

// RetryAfter reads how long an engine that answered 429 asks to be left alone (retry-after-ms,
// else Retry-After; 1 s when it does not say, at most a minute), for route.Call.Backoff.
func RetryAfter(h http.Header) time.Duration { return retryAfter(h) }

// CleanRetryAfter writes an engine's Retry-After (and retry-after-ms) in h again as RetryAfter
// reads them (1 ms to a minute), as serve does for the refusals and errors it reads whole: a
// front end that relays the answer itself (ext_proc) tells its client the same sane number.
func CleanRetryAfter(h http.Header) { cleanRetryAfter(h) }
