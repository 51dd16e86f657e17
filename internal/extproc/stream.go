package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/route"
)

// phase is where a stream is in the protocol: what it may receive next.
type phase uint8

const (
	expectHeaders phase = iota // nothing yet: the request headers come first
	expectBody                 // the request headers are in: its body comes next
	routed                     // the pick went out: the response (or request trailers) comes next
	answering                  // the response headers are in: its body and trailers come next
	done                       // the request ended
)

// maxCapture bounds how much of a non-streamed answer is kept to read its usage.
const maxCapture = 4 << 20

// maxEvent bounds one server-sent event read for its usage; a longer one is passed on unread.
const maxEvent = 4 << 20

// Errors for the messages that break the protocol's order.
var errOrder = errors.New("ext_proc message out of order")

// stream is one ext_proc stream: one HTTP request, from its headers to the end of its answer.
// One goroutine drives it, holding mu while it handles a message; the cut at the end of a
// drain (shutdown) takes mu too.
type stream struct {
	s   *Server
	srv extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context // the request's: it ends with the stream, or with proxy.ErrShuttingDown
	log *slog.Logger
	mu  sync.Mutex

	phase    phase
	reqMode  filterv3.ProcessingMode_BodySendMode
	respMode filterv3.ProcessingMode_BodySendMode
	x        *proxy.Exchange
	method   string
	path     string
	kind     openai.Kind
	hdr      http.Header // the request's headers
	out      http.Header // headers for the client's answer: rate limits, Retry-After
	subset   []string    // the subset hint, nil when none was given
	hinted   bool        // a subset hint was given (possibly empty)
	body     []byte      // the request body as it arrives
	ranked   []string    // the "ip:port" list Envoy was told
	bodyless bool        // the request has no body (end_of_stream on its headers)

	status int  // the answer's status
	sse    bool // the answer is a stream of events
	// other: the answer is a 2xx to a stream request, under another Content-Type than
	// text/event-stream (text/plain, application/json: an engine, or a proxy before it, that
	// labels its events so). Its first bytes are held until they say what it is (decided):
	// events (sse set), read as they pass and settled as `kvroute serve` settles such a stream
	// (otherEvents), or a whole answer (an engine that ignored "stream").
	other    bool
	decided  bool
	spaced   int  // how many bytes held, from the first, are known to be a byte order mark or white space
	badEvent bool // an event that is no event of the API came in an other stream (passedBad)
	events   eventSplitter
	capture  []byte // a non-streamed answer, up to maxCapture
	overflow bool   // the answer was larger than maxCapture
	bad      bool   // the answer's status was not a status: its body is not read
	first    bool   // the first token came: an event other than a comment
	// evented: an event other than a comment went by; partial: the stream's body ended inside
	// an event (no blank line after it). Together they tell a stream the engine ended without
	// its terminator from a cut one (finishAnswer).
	evented bool
	partial bool
	// progress: an event other than a comment went by since the endpoint was last told that
	// its engine is working (responseBody).
	progress bool
	// by says whose the answer is (follow): the call's endpoint's, no endpoint's of the call
	// (an address kvroute did not pick, or Envoy's own), or Envoy's own after the endpoint
	// failed the attempt.
	by      answeredBy
	settled bool
}

// run receives and answers messages until the request ends.
func (st *stream) run() error {
	defer func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if !st.settled && st.x != nil {
			st.end()
		}
		st.phase = done // nothing more is sent on the stream (shutdown)
	}()
	for {
		req, err := st.srv.Recv()
		if err != nil {
			// Envoy closes the stream when the request ends (or the client goes away): the
			// stream's end is the request's end.
			if err == io.EOF || status.Code(err) == codes.Canceled || st.ctx.Err() != nil {
				return nil
			}
			return err
		}
		if end, err := st.take(req); end {
			return err
		}
	}
}

// take handles one message received, under mu, and reports whether the stream ends (with err).
func (st *stream) take(req *extprocv3.ProcessingRequest) (end bool, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase == done {
		// Answered already (shutdown): a message Envoy sent before it had the answer is
		// ignored, as Envoy ignores what follows an immediate response.
		return true, nil
	}
	if req.GetObservabilityMode() {
		return true, status.Error(codes.FailedPrecondition, "kvroute picks endpoints and must answer: turn observability_mode off in Envoy's ext_proc filter")
	}
	if pc := req.GetProtocolConfig(); pc != nil && st.phase == expectHeaders {
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	err = st.handle(req)
	if errors.Is(err, errStop) {
		return true, nil
	}
	return err != nil || st.phase == done, err
}

// errStop ends the stream cleanly: the request was answered (an immediate response).
var errStop = errors.New("stop")

// handle answers one message.
func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	switch m := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.phase != expectHeaders {
			return st.outOfOrder("request headers")
		}
		st.readSubset(req)
		return st.requestHeaders(m.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.phase != expectBody {
			return st.outOfOrder("request body")
		}
		st.readSubset(req)
		return st.requestBody(m.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		switch st.phase {
		case expectBody:
			if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
				return st.pick(true) // the body ended with trailers
			}
		case routed:
			return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
				RequestTrailers: &extprocv3.TrailersResponse{}}})
		}
		return st.outOfOrder("request trailers")
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		if st.phase > routed {
			return st.outOfOrder("response headers")
		}
		return st.responseHeaders(req, m.ResponseHeaders) // before the pick: an unrouted answer
	case *extprocv3.ProcessingRequest_ResponseBody:
		if st.phase != answering {
			return st.outOfOrder("response body")
		}
		return st.responseBody(m.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if st.phase != answering {
			return st.outOfOrder("response trailers")
		}
		if !st.settled && st.x != nil {
			st.finishAnswer()
		}
		st.phase = done
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return st.outOfOrder("an empty message")
}

// outOfOrder answers a message that breaks the protocol's order: before the pick, with a 500
// immediate response (the gateway, not the client, is at fault); after, the answer is under
// way, so the stream ends with an InvalidArgument status and Envoy resets the request.
func (st *stream) outOfOrder(what string) error {
	msg := fmt.Sprintf("%s while %s", what, st.phase)
	st.log.Warn("ext_proc protocol error", "err", msg)
	if st.phase < routed {
		return st.immediate(openai.NewError(http.StatusInternalServerError, openai.TypeServer, "", "ext_proc_protocol_error",
			"the gateway sent kvroute "+msg+": check its ext_proc filter (docs/kubernetes.md, endpoint-picker mode)"))
	}
	if st.x != nil && !st.settled {
		st.x.Refused(openai.NewError(0, "ext_proc_protocol_error", "", "", ""))
		st.settle(499) // nobody's fault that the endpoint should carry
	}
	st.phase = done
	return status.Errorf(codes.InvalidArgument, "%v: %s", errOrder, msg)
}

func (p phase) String() string {
	switch p {
	case expectHeaders:
		return "expecting the request headers"
	case expectBody:
		return "expecting the request body"
	case routed:
		return "expecting the response headers"
	case answering:
		return "expecting the response body"
	}
	return "the request had ended"
}

// readSubset reads the subset hint of a request message, the first time there is one.
func (st *stream) readSubset(req *extprocv3.ProcessingRequest) {
	if st.hinted {
		return
	}
	ns := req.GetMetadataContext().GetFilterMetadata()[SubsetNamespace]
	v, ok := ns.GetFields()[SubsetKey]
	if !ok {
		return
	}
	st.hinted = true
	st.subset = []string{}
	for _, e := range v.GetListValue().GetValues() {
		if a := e.GetStringValue(); a != "" {
			st.subset = append(st.subset, a)
		}
	}
	if s := v.GetStringValue(); s != "" { // tolerated: one string, comma-separated
		for a := range strings.SplitSeq(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				st.subset = append(st.subset, a)
			}
		}
	}
}

// requestHeaders starts the request: its tenant, what it asks for, and, unless its body is to
// come, the answer.
func (st *stream) requestHeaders(m *extprocv3.HttpHeaders) error {
	st.hdr = make(http.Header, len(m.GetHeaders().GetHeaders()))
	for _, hv := range m.GetHeaders().GetHeaders() {
		k, v := hv.GetKey(), headerValue(hv)
		switch k {
		case ":method":
			st.method = v
		case ":path":
			st.path, _, _ = strings.Cut(v, "?")
		default:
			if !strings.HasPrefix(k, ":") {
				st.hdr.Add(k, v)
			}
		}
	}
	st.exchange(st.hdr.Get("X-Request-Id"))
	st.phase = expectBody
	if shuttingDown(st.ctx) {
		return st.cut() // it came after the drain's end (a stream the gateway had opened before)
	}
	if oe := st.x.Authenticate(st.hdr, st.out); oe != nil {
		return st.immediate(oe)
	}
	kind, models, oe := proxy.Resolve(st.method, st.path)
	switch {
	case oe != nil:
		return st.immediate(oe)
	case models:
		return st.immediateBody(http.StatusOK, st.x.Models())
	}
	st.kind = kind
	if m.GetEndOfStream() {
		st.bodyless = true
		return st.pick(false) // no body: Prepare refuses it as the HTTP handler does
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // the answer to the headers waits for the pick, at the body's end
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy holds the headers until the body's answer, which carries the pick.
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
			RequestHeaders: &extprocv3.HeadersResponse{}}})
	}
	return st.immediate(openai.NewError(http.StatusInternalServerError, openai.TypeServer, "", "ext_proc_misconfigured",
		"the gateway does not send kvroute the request body (request_body_mode "+st.reqMode.String()+
			"): set it to FULL_DUPLEX_STREAMED or BUFFERED (docs/kubernetes.md, endpoint-picker mode)"))
}

// requestBody takes a chunk of the request body; the pick is made at its end.
func (st *stream) requestBody(m *extprocv3.HttpBody) error {
	limit := st.x.Handler().MaxBodyBytes
	if int64(len(st.body)+len(m.GetBody())) > limit {
		return st.immediate(openai.NewError(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "", "request_too_large",
			"request body is larger than the limit of "+strconv.FormatInt(limit, 10)+" bytes (limits.max_body_bytes)"))
	}
	st.body = append(st.body, m.GetBody()...)
	if st.reqMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED && !m.GetEndOfStream() {
		return nil // more to come (or trailers)
	}
	// BUFFERED: the one body message is the whole body (end_of_stream is false only when
	// trailers follow).
	return st.pick(false)
}

// pick routes the request once its body is whole, and tells Envoy where to send it.
// trailers says the body ended with request trailers (FULL_DUPLEX_STREAMED), which are
// answered after the body.
func (st *stream) pick(trailers bool) error {
	addUsage := canRewrite(st.respMode)
	oe := st.x.Prepare(st.ctx, st.kind, st.body, st.hdr, st.out, proxy.PrepareOptions{Candidates: st.eligible, AddUsage: addUsage})
	if oe != nil {
		if shuttingDown(st.ctx) {
			return st.cut() // cut while it waited (admission, a replica's hold), as serve says it
		}
		return st.immediate(oe)
	}
	rc := st.x.Call()
	first := rc.Next()
	if first == nil { // cannot happen: Begin ranks at least one
		return st.immediate(openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "no_healthy_endpoint", "no endpoint can take the request"))
	}
	body := st.x.Body(first)
	// The fallbacks Envoy may retry on: the rest of the ranked list that takes the same body
	// (a tenant's cache_salt goes only to engines that honour it).
	st.ranked = append(st.ranked[:0], st.s.Addr(first))
	for _, ep := range rc.Ranked()[1:] {
		if st.s.MaxEndpoints > 0 && len(st.ranked) >= st.s.MaxEndpoints {
			break
		}
		if a := st.s.Addr(ep); a != "" && bytes.Equal(st.x.Body(ep), body) {
			st.ranked = append(st.ranked, a)
		}
	}
	dest := strings.Join(st.ranked, ",")
	set := []*corev3.HeaderValueOption{
		setHeader(DestinationKey, dest),
		setHeader("x-request-id", st.x.RequestID()),
		setHeader("content-length", strconv.Itoa(len(body))),
	}
	var remove []string
	if st.x.Tenant() != nil {
		remove = []string{"authorization", "api-key"} // the tenant's key is ours, not the engine's
	}
	common := &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}}
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{
		LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationKey: structpb.NewStringValue(dest),
		}}),
	}}
	st.phase = routed
	switch {
	case st.bodyless:
		return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta,
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}})
	case st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		// BUFFERED: Envoy held the headers; the answer to the body changes both.
		if !bytes.Equal(body, st.body) {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		}
		return st.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta,
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}})
	}
	// FULL_DUPLEX_STREAMED: the deferred answer to the headers, then the body, in chunks, the
	// last one ending the stream unless trailers follow it.
	if err := st.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta,
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}); err != nil {
		return err
	}
	if err := st.sendChunks(body, !trailers, requestBody); err != nil {
		return err
	}
	st.body = nil
	if trailers {
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
			RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

// eligible narrows the candidates to those Envoy can be told of (an IP address) and, with a
// subset hint, to the hint's.
func (st *stream) eligible(cands []*endpoint.Endpoint) []*endpoint.Endpoint {
	return slices.DeleteFunc(cands, func(e *endpoint.Endpoint) bool {
		a := st.s.Addr(e)
		return a == "" || st.hinted && !slices.Contains(st.subset, a)
	})
}

// canRewrite reports whether the response body passes through kvroute in a mode where it may
// change it (leave out the usage it asked for: the usage-only chunk, the usage member of other
// chunks). Elsewhere kvroute asks for no usage, and the client gets what the engine sends.
func canRewrite(m filterv3.ProcessingMode_BodySendMode) bool {
	switch m {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_BUFFERED:
		return true
	}
	return false
}

// responseHeaders takes the answer's head: which endpoint of the list answered, its status,
// whether it streams; the client's headers (rate limits, request id) are added. A head that
// comes before the pick is unrouted's (unroutedHead).
func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, m *extprocv3.HttpHeaders) error {
	hdr := http.Header{}
	status, hasStatus := "", false
	for _, hv := range m.GetHeaders().GetHeaders() {
		k, v := hv.GetKey(), headerValue(hv)
		if k == ":status" {
			if !hasStatus { // the first: there is one
				status, hasStatus = v, true
			}
		} else if !strings.HasPrefix(k, ":") {
			hdr.Add(k, v)
		}
	}
	st.status = http.StatusOK // Envoy always sends :status; a test harness may not
	if st.phase != routed {
		st.unroutedHead(req, status, hasStatus)
	} else {
		st.routedHead(req, hdr, status, hasStatus)
	}
	var set []*corev3.HeaderValueOption
	if st.x != nil {
		set = append(set, setHeader("x-request-id", st.x.EchoedID()))
		for k, vs := range st.out {
			if k != "Retry-After" && k != "Retry-After-Ms" { // Retry-After is for refusals
				set = append(set, setHeader(strings.ToLower(k), vs[0]))
			}
		}
	}
	if !st.bad && st.by != unrouted {
		set = cleanRetryAfter(st.status, hdr, set)
	}
	if st.by == byEndpoint {
		if name, ep := st.x.Handler().EndpointHeader, st.x.Call().Endpoint(); name != "" && ep != nil {
			set = append(set, setHeader(strings.ToLower(name), ep.Name))
		}
	}
	slices.SortFunc(set, func(a, b *corev3.HeaderValueOption) int { return strings.Compare(a.Header.Key, b.Header.Key) })
	var remove []string
	if (st.sse || st.other) && canRewrite(st.respMode) && hdr.Get("Content-Length") != "" {
		remove = []string{"content-length"} // the usage chunk may be dropped
	}
	st.phase = answering
	if m.GetEndOfStream() { // no body: the answer is its head
		if st.x != nil {
			if st.by != byFailure {
				st.x.Complete()
			}
			st.finishAnswer()
		}
		st.phase = done
	}
	// In response_body_mode NONE no body comes either: the stream's end settles the request.
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{
			HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: remove}}}}})
}

// routedHead reads the head of the answer to a request kvroute routed: whose it is (follow), its
// status, whether it streams: under text/event-stream, or, as `kvroute serve` takes it, a 2xx
// to a stream request under another Content-Type whose first bytes are events (other, decide).
// Until December 2026 the latter was read as a whole answer: past maxCapture its events were
// neither counted nor charged, and a bad event or the engine's error was settled as a 200.
func (st *stream) routedHead(req *extprocv3.ProcessingRequest, hdr http.Header, status string, hasStatus bool) {
	rc := st.x.Call()
	report := readReport(req, hdr)
	st.by = st.follow(rc, report)
	st.x.Attempted(report.attempts) // what the access line says, where Envoy told it
	if hasStatus {
		st.status = st.answerStatus(rc, status, hdr)
	}
	switch st.by {
	case byEndpoint:
		st.x.Answered(st.status) // a 404's body is read for the model it names (Exchange.Whole)
	case byNone:
		// Credited and charged to no endpoint, counted under none; a 503, 429 or 404 is a
		// refusal, which costs the tenant nothing (call.charge), whoever gave it, and so is
		// Envoy's own answer that no engine had (a 408, a 413, a 403 of its filters).
		if report.unreached {
			st.x.AnsweredLocally(st.status)
		} else {
			st.x.AnsweredElsewhere(st.status)
		}
		st.x.Handler().Logger.Debug("the answer is no picked endpoint's: Envoy sent the request elsewhere, or answered it itself",
			"request_id", st.x.RequestID(), "served", report.served, "list", strings.Join(st.ranked, ","),
			"attempts", report.attempts, "failure", report.failed.String(), "status", st.status)
	case byFailure:
		// No answer came from the engine: settled as `kvroute serve` settles an attempt that
		// failed so (counted on the endpoint, the tenant charged for what it may have computed).
		e := failedAttempt(report.failed, st.status)
		st.x.Refused(e)
		st.x.Handler().Logger.Debug("Envoy answered itself: the endpoint failed the attempt",
			"request_id", st.x.RequestID(), "endpoint", rc.Endpoint().Name, "failure", report.failed.String(),
			"attempts", report.attempts, "status", st.status, "error_code", *e.Code)
	}
	if st.status == http.StatusTooManyRequests {
		rc.Backoff(proxy.RetryAfter(hdr)) // nothing where the answer is no endpoint's: no attempt is open
	}
	es := eventStream(hdr.Get("Content-Type"))
	st.sse = !st.bad && st.status < 400 && es
	st.other = !st.bad && !es && st.status >= 200 && st.status < 300 && st.x.Request() != nil && st.x.Request().Stream
}

// eventStream reports whether a Content-Type is the event stream's, its parameters aside, as
// `kvroute serve` tells it (the media type is case-insensitive).
func eventStream(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// unroutedHead reads the head of an answer that came before the pick: Envoy's own (its
// request_timeout while the client's body was coming: 408; a body over its buffer: 413), or
// another filter's, which Envoy sends kvroute as it sends any answer. It is not a message out
// of order: answered so (a 500 of kvroute's own), it broke Envoy's answer to the client and was
// counted as the router's error. The answer passes on unread; the request, where its headers
// had come, is settled with its status as a refusal before the pick: no endpoint, nothing
// charged to the tenant's tokens, counted in the tenant's requests as the router's own
// refusals are. A stream whose first message is the answer is no request kvroute saw: the
// answer passes on, and nothing is counted.
func (st *stream) unroutedHead(req *extprocv3.ProcessingRequest, status string, hasStatus bool) {
	st.by, st.sse = unrouted, false
	if hasStatus {
		if n, ok := statusCode(status); ok {
			st.status = n
		} else {
			st.status = http.StatusBadGateway // no status at all: not an answer Envoy writes
		}
	}
	if st.x == nil {
		st.log.Debug("an answer came before the request: passed on", "status", st.status)
		return
	}
	st.x.AnsweredElsewhere(st.status)
	st.x.Handler().Logger.Debug("Envoy answered the request before kvroute picked",
		"request_id", st.x.RequestID(), "status", st.status,
		"code_details", truncate(attribute(req, "response.code_details").GetStringValue(), maxDetailsLog))
}

// answerStatus reads the answer's :status. One that is not three digits from 100 to 599, or a
// protocol switch (1xx), which no API request gets, is the engine's bad answer, as `kvroute
// serve` counts it (502 upstream_bad_answer): the request is settled as a 502 from that
// endpoint, an upstream error on the access line, and logged once here; its body, passed on as
// it is, is not read (no usage or cached tokens are taken from it). What Envoy tells the client
// of it is Envoy's.
//
// A redirect (3xx) is a status, and Envoy passes it on to the client: the request is settled
// with it (the access line and kvroute_requests_total say what the client got, not a 502 it
// never saw). Where it is the engine's (byEndpoint), it is judged as `kvroute serve` judges
// it: the endpoint's URL is not the API's address, and nothing was computed. So its attempt
// fails as unavailable, which counts against the endpoint (serve fails it over so, as for a
// 503), the policy hears no answer, its body is not read, and one warning names the endpoint
// and the Location. Envoy's own redirect (a route's redirect action) is no endpoint's, and
// settled with its status alone. Until December 2026 every redirect was settled as a 502
// upstream_bad_answer, which the client never got.
func (st *stream) answerStatus(rc *route.Call, v string, hdr http.Header) int {
	n, ok := statusCode(v)
	if ok && (n >= 200 && n < 300 || n >= 400) {
		return n
	}
	ep := ""
	if e := rc.Endpoint(); e != nil {
		ep = e.Name
	}
	h := st.x.Handler()
	if ok && n >= 300 {
		if st.by != byEndpoint {
			return n
		}
		st.bad = true // its body is not read
		h.Logger.Warn("the engine answered an API request with a redirect: check the endpoint's URL; counted as unavailable",
			"request_id", st.x.RequestID(), "endpoint", ep, "status", n, "location", truncate(hdr.Get("Location"), maxDetailsLog))
		rc.Fail(route.FailUnavailable)
		return n
	}
	what := "has no valid status"
	if ok {
		what = "is a protocol switch (1xx)"
	}
	st.bad = true
	h.Logger.Warn("the engine's answer "+what+": counted as a bad answer (502)",
		"request_id", st.x.RequestID(), "endpoint", ep, "status", truncate(v, maxStatusLog))
	st.x.Refused(openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", "upstream_bad_answer",
		"the engine's answer "+what+" (request id "+st.x.RequestID()+")"))
	return http.StatusBadGateway
}

// statusCode parses an HTTP status code: three digits, 100 to 599 (RFC 9110, 15).
func statusCode(v string) (int, bool) {
	if len(v) != 3 {
		return 0, false
	}
	n := 0
	for i := range 3 {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n >= 100 && n <= 599
}

// maxStatusLog bounds the invalid status logged: it is whatever the engine sent.
const maxStatusLog = 32

// maxDetailsLog bounds Envoy's response.code_details logged (a filter of the gateway's may
// write its own).
const maxDetailsLog = 256

// truncate cuts s to at most n bytes, and to valid UTF-8, marking a cut with "...".
func truncate(s string, n int) string {
	if len(s) <= n {
		return strings.ToValidUTF8(s, "?")
	}
	return strings.ToValidUTF8(s[:n], "?") + "..."
}

// envoyReport is what Envoy tells kvroute, with the response headers, of how it came by the
// answer. It tells which endpoint answered, and how many attempts it made, but not why an
// attempt before the last failed: a connection refused, a reset, and a status its retry policy
// retries (a 503, a 429) all look alike. Only the last attempt's failure is told, in the
// attributes of Envoy's own answer when it gave up (response.flags, response.code_details,
// upstream.transport_failure_reason: Envoy sets them once no retry follows).
type envoyReport struct {
	// served is the endpoint that answered, "ip:port": ServedKey in the LBNamespace metadata
	// (override_host's selected_host_key), else the upstream.address attribute; "" when
	// neither is told.
	served string
	// attempts is how many upstream attempts Envoy made (x-envoy-attempt-count, which Envoy adds
	// to the answer with the route's include_attempt_count_in_response, else the
	// upstream.request_attempt_count attribute); 0 when neither is told, or when Envoy says it
	// made none.
	attempts int
	// own: the answer is Envoy's own, not an engine's: response.code_details other than
	// via_upstream, or, without details, one of the response flags Envoy sets only on an
	// answer of its own (ownAnswerFlags).
	own bool
	// failed is how the last attempt failed, where Envoy's own answer says it did
	// (envoyFailures): FailConnect, FailTimeout, FailLost, the endpoint's failures, or
	// FailCanceled, the stream's own deadline while the endpoint had the request. FailNone
	// where no attempt failed: Envoy answered for reasons of its own (no healthy upstream, a
	// circuit breaker, no route, its rate limit, a local reset) or of the client's (a request
	// header it refused), or the answer is an engine's.
	failed route.Failure
	// unreached: Envoy's own answer, and no engine had the request: no attempt failed, and
	// none can have reached an engine (all but a local reset, LR, which Envoy may make once it
	// sent the request).
	unreached bool
}

// maxAttemptCount bounds the attempt count read from Envoy: more is not a count kvroute believes.
const maxAttemptCount = 1000

// Envoy's response flags: the bits of the response.flags attribute, one for each of Envoy's
// response flags in the order Envoy declares them (CoreResponseFlag, envoy/stream_info/
// stream_info.h), named as its access log names them.
const (
	flagLH    = 1 << iota // failed local health check: Envoy's health check filter answered
	flagUH                // no healthy upstream host
	flagUT                // upstream request timeout: the route's timeout, or its per-try timeout
	flagLR                // local reset: Envoy reset the upstream stream itself
	flagUR                // upstream remote reset
	flagUF                // upstream connection failure
	flagUC                // upstream connection termination
	flagUO                // upstream overflow: a circuit breaker
	flagNR                // no route
	flagDI                // delay injected: the request went on after it
	flagFI                // fault injected: an abort
	flagRL                // rate limited by Envoy
	flagUAEX              // refused by the external authorization service
	flagRLSE              // the rate limit service failed, and the filter denied the request
	flagDC                // downstream connection termination: the client went away
	flagURX               // upstream retry limit exceeded: comes with the last attempt's answer
	flagSI                // stream idle timeout: nothing came either way for stream_idle_timeout
	flagIH                // the client's x-envoy-* request headers failed Envoy's strict check
	flagDPE               // downstream protocol error: the client's
	flagUMSDR             // upstream max stream duration reached: the cluster's max_stream_duration
	flagRFCF              // response from a cache filter
	flagNFCF              // no filter config found
	flagDT                // duration timeout: the route's or the listener's max_stream_duration
	flagUPE               // upstream protocol error
	flagNC                // no cluster
	flagOM                // the overload manager
	flagDF                // DNS resolution failed
	flagDO                // dropped by the cluster's drop_overload
	flagDR                // downstream remote reset: the client reset its stream
	flagUDO               // dropped unconditionally (drop_overload at 100%)
)

// ownAnswerFlags are the response flags that mean Envoy answered itself, read where no
// response.code_details is sent: each is set only with a local reply of Envoy's (RLSE too: the
// rate limit filter sets it only where it denies the request). The others may come with an
// engine's answer, DI (a delay, then the request went on) and URX (the retries ran out: the
// last attempt's answer is relayed), or mean that the client went away (DC, DR).
const ownAnswerFlags = flagLH | flagUH | flagUT | flagLR | flagUR | flagUF | flagUC | flagUO | flagNR | flagFI | flagRL |
	flagUAEX | flagRLSE | flagSI | flagIH | flagDPE | flagUMSDR | flagRFCF | flagNFCF | flagDT | flagUPE | flagNC | flagOM |
	flagDF | flagDO | flagUDO

// envoyFailures says whose failure Envoy's own answer tells, from its response flags, else its
// response.code_details (Envoy's reset details name the reason in braces:
// upstream_reset_before_response_started{remote_connection_failure,...}, {overflow}, ...): the
// first row that matches. An answer that matches none is nobody's failure: no healthy upstream
// (UH), a circuit breaker (UO), no route or cluster (NR, NC), Envoy's rate limit (RL), a fault
// injected (FI), the overload manager or a drop (OM, DO, UDO), a local reset (LR: Envoy's
// codec reset the upstream stream itself), a DNS failure (DF), a local health check (LH), an
// external authorization's refusal (UAEX), the rate limit service's failure (RLSE), a filter's
// config not found (NFCF), an answer from Envoy's cache (RFCF), and the client's own doing: x-envoy-* headers that
// fail the strict check (IH), a protocol error (DPE), a body over Envoy's buffer
// (request_payload_too_large, 413), a request not received in time (request_overall_timeout,
// request_header_timeout, 408).
//
// A row marked tried is Envoy's stream-wide timeout, which can run out before any attempt
// (while the client's body was coming, or while kvroute held the pick in its admission
// queue): it charges the endpoint only where Envoy says it made an attempt (an address served,
// an attempt count). The stream idle timeout (SI) is the engine's silence once it had the
// request: a timeout, as the route's (UT) is. The stream's max duration (DT: the route's
// max_stream_duration, or the client's grpc-timeout under grpc_timeout_header_max) spans the
// whole request, kvroute's admission wait and the client's upload included: the stream's own
// deadline, not the engine's, so it closes the attempt as a client's leaving does
// (FailCanceled: a timeout only where the engine had answered nothing for a stall watch's
// span). The cluster's max stream duration (UMSDR) is the attempt's own: a timeout.
var envoyFailures = [...]struct {
	flags   uint64
	details []string
	fail    route.Failure
	tried   bool
}{
	{flagUF, []string{"connection_failure", "connection_timeout"}, route.FailConnect, false},
	{flagUT | flagUMSDR, []string{"response_timeout", "upstream_per_try_timeout", "upstream_per_try_idle_timeout",
		"upstream_max_stream_duration_reached"}, route.FailTimeout, false},
	{flagUR | flagUC | flagUPE, []string{"remote_reset", "connection_termination", "protocol_error"}, route.FailLost, false},
	{flagSI, []string{"stream_idle_timeout"}, route.FailTimeout, true},
	{flagDT, []string{"max_duration_timeout"}, route.FailCanceled, true},
}

// readReport reads what Envoy says of the answer from the response headers message and the
// answer's headers.
func readReport(req *extprocv3.ProcessingRequest, hdr http.Header) envoyReport {
	var r envoyReport
	ns := req.GetMetadataContext().GetFilterMetadata()[LBNamespace]
	r.served = ns.GetFields()[ServedKey].GetStringValue()
	if r.served == "" {
		r.served = attribute(req, "upstream.address").GetStringValue()
	}
	if n, err := strconv.Atoi(hdr.Get("X-Envoy-Attempt-Count")); err == nil && n > 0 && n <= maxAttemptCount {
		r.attempts = n
	} else if v := attribute(req, "upstream.request_attempt_count"); v != nil {
		// A CEL integer comes as a number; a string is taken too.
		n := v.GetNumberValue()
		if s := v.GetStringValue(); s != "" {
			n, _ = strconv.ParseFloat(s, 64)
		}
		if n >= 1 && n <= maxAttemptCount && n == float64(int(n)) {
			r.attempts = int(n)
		}
	}
	details := attribute(req, "response.code_details").GetStringValue()
	flags := uint64(0)
	if f := attribute(req, "response.flags").GetNumberValue(); f > 0 && f < 1<<53 {
		flags = uint64(f)
	}
	if details != "" {
		r.own = details != "via_upstream"
	} else {
		r.own = flags&ownAnswerFlags != 0
	}
	if !r.own {
		return r
	}
	tried := r.served != "" || r.attempts > 0
	for i, row := range envoyFailures {
		told := flags&row.flags != 0 || slices.ContainsFunc(row.details, func(s string) bool { return strings.Contains(details, s) })
		if i == 0 && attribute(req, "upstream.transport_failure_reason").GetStringValue() != "" {
			told = true // a connection that failed (TLS, refused)
		}
		if told && (tried || !row.tried) {
			r.failed = row.fail
			break
		}
	}
	r.unreached = r.failed == route.FailNone && flags&flagLR == 0 && !strings.Contains(details, "local_reset")
	return r
}

// attribute is the value of one of the attributes Envoy sends (response_attributes), nil when
// it sends none of that name.
func attribute(req *extprocv3.ProcessingRequest, name string) *structpb.Value {
	for _, attrs := range req.GetAttributes() {
		if v, ok := attrs.GetFields()[name]; ok {
			return v
		}
	}
	return nil
}

// answeredBy says whose an answer is (stream.follow).
type answeredBy uint8

const (
	// byEndpoint: the call's endpoint answered (Exchange.Answered), credited to it.
	byEndpoint answeredBy = iota
	// byNone: no endpoint of the call answered (Exchange.AnsweredElsewhere): an address kvroute
	// did not rank (override_host's fallback), Envoy for reasons of its own or the client's (no
	// healthy upstream, a circuit breaker, no route, a request it refused), or Envoy after its
	// last attempt could not connect (the endpoint charged a connect_error, as `kvroute serve`
	// charges one; the answer, as there, no endpoint's).
	byNone
	// byFailure: Envoy's own answer after the endpoint failed the attempt it had (a timeout, a
	// reset), or after the stream's own deadline ran out while the endpoint had it: no answer
	// came from the engine, and the request is settled as `kvroute serve` settles one whose
	// last attempt failed so (failedAttempt).
	byFailure
	// unrouted: the answer came before kvroute's pick: Envoy answered the request itself while
	// kvroute waited for its body (a 408 when the client's body did not come in time, a 413
	// when it outgrew Envoy's buffer), or another filter did before the request reached
	// kvroute. No call was made: nothing is charged to any endpoint or to the tenant's tokens,
	// and the request is counted as a refusal of the router's own before its pick is.
	unrouted
)

// follow moves the call's attempt to the endpoint that answered, as Envoy reports it, and
// says whose the answer is.
//
// Each endpoint of the list Envoy went past (all of the list when the answer came from
// elsewhere: override_host's fallback policy) failed an attempt or was skipped without one
// (override_host skips an address its cluster does not have). Envoy does not say why an
// attempt failed, so the ones it tried are closed as failed for a reason unknown
// (route.FailUnknown): where the attempt count says it tried every one it passed, or, with no count,
// where the answering endpoint is on the list. Where the count says it tried fewer, which ones
// nothing says, and none is charged; nor is the list before an answer from elsewhere without a
// count (Envoy may never have tried it). An endpoint of the ranking that Envoy never had (past
// extproc.max_endpoints) is passed uncharged. An answer from an endpoint the call did not rank
// is no endpoint's: taken for the first choice's, it credited that endpoint with an answer it
// never gave.
//
// Envoy's own answer (envoyReport.own) is no endpoint's either. The endpoint it tried last (the
// served one, else the first choice) is charged the failure the answer tells (a connect_error,
// a timeout, a connection lost), as `kvroute serve` charges its own attempt, and nothing where
// none failed: no healthy upstream, a circuit breaker's overflow, no route are Envoy's
// answers, and counted against the first choice (unavailable, three of which eject it; a
// refusal for a 404) they ejected engines that had never been asked.
//
// The call is moved down its ranking by route.Call.MoveTo, which follows Envoy rather than
// guess where Next would go: the first choice's attempt is closed with route.FailUnknown where Envoy
// tried it, else with FailNone (nothing told to health, the policy told of neither an answer
// nor a failure); an endpoint passed that Envoy tried is an attempt that failed with
// route.FailUnknown, one it skipped or never had no attempt at all (a ranked endpoint left off its
// list, because its body differs, say: another cache_salt); and the served endpoint gets the
// attempt and the answer even where it became unusable (ejected, or unavailable) since the
// pick: Envoy went there, and the answer is its.
func (st *stream) follow(rc *route.Call, r envoyReport) answeredBy {
	if rc.Endpoint() == nil {
		return byEndpoint
	}
	if r.served == "" || r.served == st.s.Addr(rc.Endpoint()) {
		return envoyAnswered(rc, r)
	}
	ranked := rc.Ranked()
	target := slices.IndexFunc(ranked, func(e *endpoint.Endpoint) bool { return st.s.Addr(e) == r.served })
	passed := slices.Index(st.ranked, r.served)
	listed := passed >= 0
	if !listed {
		passed = len(st.ranked)
	}
	tried := listed
	if r.attempts > 0 {
		tried = r.attempts-1 >= passed
	}
	charged := func(e *endpoint.Endpoint) bool {
		return tried && slices.Contains(st.ranked[:passed], st.s.Addr(e))
	}
	pass := func(e *endpoint.Endpoint) route.Failure {
		if charged(e) {
			return route.FailUnknown
		}
		return route.FailNone // skipped by Envoy, or never on its list: nobody's failure, no attempt
	}
	if target >= 0 {
		if !rc.MoveTo(ranked[target], pass) { // cannot happen: the served one is ranked after the first choice
			rc.Fail(route.FailNone)
			return byNone
		}
		return envoyAnswered(rc, r)
	}
	// The answer came from elsewhere: the call is moved to the last endpoint Envoy tried, if it
	// tried any past the first choice, which is then failed as the ones before it were.
	last := -1
	for j, e := range ranked {
		if charged(e) {
			last = j
		}
	}
	if last < 0 || !rc.MoveTo(ranked[last], pass) { // none tried, or the first choice alone
		rc.Fail(pass(rc.Endpoint()))
		return byNone
	}
	rc.Fail(route.FailUnknown)
	return byNone
}

// envoyAnswered settles the call's attempt in progress, at the endpoint Envoy says answered,
// by what Envoy says of the answer (follow).
func envoyAnswered(rc *route.Call, r envoyReport) answeredBy {
	switch {
	case !r.own:
		return byEndpoint
	case r.failed == route.FailConnect:
		rc.Fail(route.FailConnect)
		return byNone // as in `kvroute serve`: a connection never made leaves no engine's answer
	case r.failed != route.FailNone:
		rc.Fail(r.failed)
		return byFailure
	}
	rc.Fail(route.FailNone)
	return byNone
}

// failedAttempt is the error of a request whose last attempt failed with f (a timeout, a
// connection lost, the stream's deadline) and Envoy answered status itself, for the access
// line: the code `kvroute serve` answers such a request with (Handler.proxyError).
func failedAttempt(f route.Failure, status int) *openai.Error {
	switch f {
	case route.FailTimeout:
		return openai.NewError(status, openai.TypeUpstream, "", "upstream_timeout", "no answer from the engine in time: Envoy gave up")
	case route.FailCanceled:
		return openai.NewError(status, openai.TypeServer, "", "max_stream_duration",
			"the request's max_stream_duration in Envoy ran out before the engine's answer")
	}
	return openai.NewError(status, openai.TypeUpstream, "", "upstream_connection_lost",
		"the engine's connection broke after it received the request, before its answer's head")
}

// cleanRetryAfter adds to set the engine's Retry-After (and retry-after-ms) written again as
// `kvroute serve` writes them (proxy.CleanRetryAfter: 1 ms to a minute), for the statuses whose
// answers serve reads whole and cleans (the refusals and errors): a client told to wait is
// told a sane number, never the engine's garbage ("-5", "NaN", a year), whichever front end
// it came through.
func cleanRetryAfter(status int, hdr http.Header, set []*corev3.HeaderValueOption) []*corev3.HeaderValueOption {
	switch status {
	case http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusNotFound, http.StatusLoopDetected,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
	default:
		return set
	}
	h := http.Header{}
	for _, k := range []string{"Retry-After", "Retry-After-Ms"} {
		if v := hdr.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	proxy.CleanRetryAfter(h)
	for _, k := range []string{"Retry-After", "Retry-After-Ms"} {
		if v := h.Get(k); v != "" {
			set = append(set, setHeader(strings.ToLower(k), v))
		}
	}
	return set
}

// responseBody passes a chunk of the answer on, reading its events (or, not streamed, keeping
// it to read its usage at the end).
func (st *stream) responseBody(m *extprocv3.HttpBody) error {
	chunk, eos := m.GetBody(), m.GetEndOfStream()
	body := chunk // what is read: the chunk, with what was held before it (decide)
	held := false
	if st.other && !st.decided {
		body, held = st.decide(chunk, eos)
	}
	out := body
	if held {
		out = nil
	} else if st.sse {
		out = st.events.feed(nil, body, eos, st.event)
		if st.progress {
			// As `kvroute serve` does for each read that brought an event: the stall watch of
			// every request on this endpoint reads it (keep-alive comments are no progress).
			st.progress = false
			if ep := st.x.Call().Endpoint(); ep != nil && st.by == byEndpoint {
				ep.Progressed(time.Now().UnixNano())
			}
		}
	} else if !st.overflow && !st.bad && st.by != unrouted {
		if len(st.capture)+len(body) > maxCapture {
			st.overflow, st.capture = true, nil
		} else {
			st.capture = append(st.capture, body...)
		}
	}
	if eos && st.x != nil {
		if last := st.finishAnswer(); last != nil && canRewrite(st.respMode) {
			out = append(out, last...) // out is feed's, not chunk
		}
	}
	if eos {
		st.phase = done
	}
	switch st.respMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		if len(out) == 0 && !eos {
			return nil // a partial event, held until it is whole
		}
		return st.sendChunks(out, eos, responseBody)
	case filterv3.ProcessingMode_STREAMED, filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		common := &extprocv3.CommonResponse{}
		if !bytes.Equal(out, chunk) {
			common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
		}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: common}}})
	}
	return st.outOfOrder("response body (response_body_mode NONE)")
}

// decide takes a chunk of an other answer (a stream request's 2xx under another Content-Type)
// whose first bytes have not yet said what it is, and holds it until they do: held is true
// while they have not; else body is what was held with the chunk, to read as what they said,
// events (sse set) or a whole answer. They say it past a byte order mark and white space, as
// `kvroute serve` tells such an answer (internal/proxy's otherStream, whose test is
// unexported): a "data:" or "event:" field, or a comment, begins events; anything else a whole
// answer. At the body's end, or past maxCapture of white space, what came decides; where the
// response trailers end the body, what was held is read as a whole answer but cannot be passed
// on (a byte order mark, white space, the start of a field: less than a field's name).
//
// The answer's first bytes are its first token, as serve takes them (otherStream): the client
// has the head, and an engine that ignored "stream" sends its answer when it is done.
func (st *stream) decide(chunk []byte, eos bool) (body []byte, held bool) {
	if len(chunk) > 0 && !st.first {
		st.first = true
		if rc := st.x.Call(); rc != nil {
			rc.FirstToken()
		}
	}
	st.capture = append(st.capture, chunk...)
	events, sure, spaced := beginsAsEvents(st.capture, st.spaced)
	st.spaced = spaced
	if !sure && !eos && len(st.capture) <= maxCapture {
		return nil, true
	}
	body, st.capture = st.capture, nil
	st.decided, st.sse = true, events
	return body, false
}

// bom is the UTF-8 byte order mark, which the event-stream format takes off a stream's start.
const bom = "\xef\xbb\xbf"

// beginsAsEvents reports whether b, an answer's first bytes, begin as an event stream does past
// a byte order mark and white space: a "data:" or "event:" field, or a comment. sure is false
// while b is too short to say. The first from bytes of b are known to be the mark or white
// space (a call's spaced, given to the next, so that white space that keeps coming is looked
// at once).
func beginsAsEvents(b []byte, from int) (events, sure bool, spaced int) {
	if from == 0 {
		if len(b) < len(bom) && strings.HasPrefix(bom, string(b)) {
			return false, false, 0 // the mark, or the start of one
		}
		if bytes.HasPrefix(b, []byte(bom)) {
			from = len(bom)
		}
	}
	spaced = from
	for spaced < len(b) && (b[spaced] == ' ' || b[spaced] == '\t' || b[spaced] == '\r' || b[spaced] == '\n') {
		spaced++
	}
	b = b[spaced:]
	sure = true
	for _, f := range [...]string{"data:", "event:", ":"} {
		n := min(len(b), len(f))
		if string(b[:n]) == f[:n] {
			if n == len(f) {
				return true, true, spaced
			}
			sure = false // b is the start of f
		}
	}
	return false, sure, spaced
}

// event reads one event of a streamed answer and says what of it to pass on (takeFunc), as
// `kvroute serve` reads its stream (internal/proxy's sseBody):
//
//   - the first token is the first event other than a comment: the keep-alive comments some
//     engines send while they compute the prefill (": keep-alive") are no token, and taken for
//     one they had the TTFT measured early and the prefill estimate freed before the prefill
//     was done. They are passed on (serve drops those before the first event, its head not yet
//     sent; here the client has the head, and they keep its connection alive);
//   - the part of an event that came before the stream's end (no blank line after it) is not
//     read, so that neither its usage, its content nor its error counts: the stream was cut
//     (finishAnswer). A terminator so cut ("data: [DONE]" and its line end) is the stream's
//     end, read as a whole one; and so is a part that says already that it is no event of the
//     API (a whole line in it that is no field, ollama's `{"error":"..."}`, or a NUL), read as
//     a bad event (below), as serve reads it (its foreignCut); until December 2026 it was a cut;
//   - what comes after the terminator is not read: serve reads no more once it has it;
//   - an event that is no event of the API (openai.Event.Malformed: "data: {not json", a line
//     that is no field, a NUL, bytes not UTF-8) makes the stream the engine's bad answer
//     (proxy.Exchange.Event): it and what follows are not read, and the request is settled as
//     serve settles it, 502 stream_bad_event counted against the endpoint (finishAnswer).
//     Where kvroute writes the body, the client's stream ends with serve's error event at the
//     body's end; it cannot end sooner (see below), so the engine's bytes after the event come
//     to nothing but are waited for. Until December 2026 such a stream passed as a clean 200.
//
// Where the body mode lets kvroute change the body (canRewrite), what is not read is not
// passed on either, as serve relays it; elsewhere it passes as it came.
//
// An other stream (a stream request's answer under text/plain or application/json that began
// as events: decide) is read as serve reads one (internal/proxy's otherStream), and passes as it
// came but for the usage the router asked for: a part of an event at its end is not read but is
// no cut, and an event that is no event of the API passes, makes the request the engine's bad
// answer (passedBad), and the events after it are read on (otherEvents settles it).
//
// A stream whose engine ignores max_tokens is not cut here, where serve cuts it (more content
// events than twice what the request allows): the protocol has no clean end for a body the
// engine is still sending (kvroute may end the body only after Envoy has; an immediate response
// after the head resets the client's stream), so it passes to its end, and the tenant's charge
// stays bounded by what the request allowed (the Exchange's charge). docs/kubernetes.md says so.
func (st *stream) event(ev openai.Event) (pass bool, omitFrom, omitTo int) {
	// What is not read passes on as it came where kvroute may not change the body, and in an
	// other stream, which serve relays as it came (otherEvents).
	unread := !canRewrite(st.respMode) || st.other
	switch {
	case st.x.Completed(), st.x.BadStream() != nil:
		return unread, 0, 0
	case ev.Cut && !ev.Ends() && !ev.Foreign && bytes.IndexByte(ev.Raw, 0) < 0:
		st.partial = !st.other
		return unread, 0, 0
	case ev.Malformed() && st.other:
		st.passedBad()
		return true, 0, 0
	case ev.Malformed():
		st.x.Event(ev) // the stream's bad answer: no first token
		return unread, 0, 0
	case !ev.Empty():
		st.evented, st.progress = true, true
		if !st.first {
			st.first = true
			st.x.Call().FirstToken()
		}
	}
	return st.x.Event(ev)
}

// passedBad records that an other stream carried an event that is no event of the API; it
// passes on as it came, as `kvroute serve` relays it (otherEvents), and the request is settled
// as the engine's bad answer (finishAnswer). Said once.
func (st *stream) passedBad() {
	if st.badEvent {
		return
	}
	st.badEvent = true
	name := ""
	if ep := st.x.Call().Endpoint(); ep != nil {
		name = ep.Name
	}
	st.x.Handler().Logger.Warn("the engine sent an event that is no event of the API in a stream relayed as it came (its Content-Type is not text/event-stream), counted as a failure of the endpoint",
		"request_id", st.x.RequestID(), "endpoint", name)
}

// cutEvent is the SSE error event that ends the client's stream where the engine cut it, as
// `kvroute serve` writes it (sseBody.cutShort).
func cutEvent(requestID string) []byte {
	e := openai.NewError(http.StatusBadGateway, openai.TypeUpstream, "", "stream_cut",
		"the engine ended the stream before its end (request id "+requestID+")")
	var b bytes.Buffer
	_ = openai.WriteEvent(&b, "error", e.Body()) // a bytes.Buffer takes any write
	return b.Bytes()
}

// finishAnswer settles the request at the end of its answer: complete; ended by the engine
// without its terminator; or cut short. An other stream is settled as serve settles one
// (otherEvents); what follows is of streams under text/event-stream.
//
// It is called at the answer's end as Envoy tells it (end_of_stream on the last body message,
// or the response trailers), which Envoy sends only when the upstream's response ended: its
// HTTP/2 stream's end, its chunked body's last chunk, its Content-Length read. An upstream that
// resets or breaks its body after the head (a reset, a connection closed inside a chunked body,
// a timeout) has Envoy reset the client's request instead, and the ext_proc stream ends without
// that message (stream.end: settled as the client gone, which kvroute cannot tell it from).
// So a stream that reached its end after a whole event without a terminator is the engine's
// own end, as ollama ends a stream at its token-repeat limit: passed on as it ended and
// settled as `kvroute serve` settles it (Exchange.Unterminated), not as a cut. One break looks
// the same to Envoy, and so to kvroute: an HTTP/1.1 body delimited by the connection's close
// (no Content-Length, not chunked), which Envoy reads to the close, whatever closed it. The
// engines kvroute serves stream chunked. A stream that ended inside an event (no blank line
// after it, or a partial event still held at the trailers), or before any event, is still
// settled as cut: 502 stream_cut, a failure of the endpoint (stream_cut); it reports that, so
// that the client's stream can end with serve's error event where the body's end is still
// kvroute's to write (end_of_stream; the trailers come after it). A stream that carried the
// engine's error event is a 502 stream_error, a failure of the endpoint too, however it ended
// (stream_cut where it was cut, as serve counts it); one that carried an event that is no
// event of the API a 502 stream_bad_event (its first such event, however it ended).
//
// It returns the SSE error event to end the client's stream with, as serve ends it, where the
// stream was cut or carried a bad event; nil otherwise.
func (st *stream) finishAnswer() (last []byte) {
	if !st.sse {
		switch {
		case st.by == byFailure:
			// Envoy's own answer: the engine's never came, and is not complete (call.charge
			// estimates what it generated, as for `kvroute serve`'s attempt that timed out).
		case st.overflow || st.bad || st.by == byNone && st.status >= 300 || st.by == unrouted:
			// An error from no endpoint of the call is not read: a 404's body would leave the
			// call's endpoint out for the model it names (Exchange.Whole); nor is an answer
			// that came before the pick, which no engine gave.
			st.x.Complete()
		default:
			st.x.Whole(st.capture)
		}
		st.capture = nil
		st.refusedUncomputed()
		st.settle(st.status)
		return nil
	}
	if st.other {
		st.otherEvents()
		return nil
	}
	if e := st.x.BadStream(); e != nil {
		st.settle(http.StatusBadGateway)
		var b bytes.Buffer
		_ = openai.WriteEvent(&b, "error", e.Body()) // a bytes.Buffer takes any write
		return b.Bytes()
	}
	cut := !st.x.Completed() && (!st.evented || st.partial || len(st.events.pending) > 0)
	if cut {
		st.x.Cut()
	}
	switch {
	case st.x.StreamFailed():
		// The client has the engine's error event after a 200 head: settled as `kvroute
		// serve` settles it.
		st.x.Refused(openai.NewError(0, "stream_error", "", "", ""))
		st.settle(http.StatusBadGateway)
	case cut:
		st.settle(http.StatusBadGateway)
	case !st.x.Completed():
		st.x.Unterminated()
		st.settle(st.status)
	default:
		st.settle(st.status)
	}
	if cut {
		return cutEvent(st.x.RequestID())
	}
	return nil
}

// otherEvents settles an other stream read as events (a stream request's 2xx under text/plain or
// application/json) at its end, as `kvroute serve` settles one it relays as it came
// (internal/proxy's otherStream and call.status): one that carried an event that is no event of
// the API is a 502 stream_bad_event (error_code upstream_bad_answer), one that carried the
// engine's error (an error event, llama.cpp's "error:" line) a 502 stream_error, both failures
// of the endpoint (server_error: the stream was not cut); else it ended as the engine ended it,
// with or without its terminator, a last event without its blank line included: a 200, its
// whole content events charged. Nothing is added to what the client has.
//
// What differs from serve: an engine that ignores max_tokens is not cut (see event), nor is an
// event over maxEvent (passed on unread: serve cuts the stream, stream_event_too_large); the
// usage the router asked for is left out where the body mode lets kvroute change the body
// (serve relays it as it came).
func (st *stream) otherEvents() {
	switch {
	case st.badEvent:
		st.x.Refused(openai.NewError(0, "stream_bad_event", "", "upstream_bad_answer", ""))
		st.settle(http.StatusBadGateway)
	case st.x.StreamFailed():
		st.x.Refused(openai.NewError(0, "stream_error", "", "", ""))
		st.settle(http.StatusBadGateway)
	default:
		st.settle(st.status)
	}
}

// end settles a request whose stream ended before its answer did: in response_body_mode NONE
// the head was all kvroute could see; otherwise the client (or Envoy) went away, which does
// not count against the endpoint. A stream that ended once the drain had cut it (its
// connection closed before its answer could be sent) was cut.
func (st *stream) end() {
	if shuttingDown(st.ctx) {
		st.s.drain.cuts.Add(1)
		st.settleCut()
		return
	}
	if st.phase == answering && st.respMode == filterv3.ProcessingMode_NONE {
		st.x.Complete()
		st.refusedUncomputed()
		st.settle(st.status)
		return
	}
	if rc := st.x.Call(); rc != nil && rc.FirstTokenAt().IsZero() && (st.phase == routed || st.phase == answering && (st.sse || st.other)) {
		// Gone before the first token: the attempt is given up as `kvroute serve` gives up one
		// whose client left (route.FailCanceled), so that an engine that had held it silent,
		// to every request, for a stall watch's span counts a timeout and is marked stalled
		// (an engine that hangs is not hidden by clients that leave first).
		rc.Fail(route.FailCanceled)
	}
	st.settle(499)
}

// refusedUncomputed closes the attempt of an engine that answered 429 or 503 (it computed
// nothing: it sheds load, or cannot serve now) as `kvroute serve` closes the attempt whose
// answer it relays: busy, which neither counts against the endpoint nor is a refusal for the
// refusal rule (taken for one, a busy engine was ejected as refusing its traffic), or
// unavailable, which counts. Other statuses are the outcome's (proxy's failure), as there.
func (st *stream) refusedUncomputed() {
	rc := st.x.Call()
	if rc == nil || st.bad {
		return
	}
	switch st.status {
	case http.StatusTooManyRequests:
		rc.Fail(route.FailBusy)
	case http.StatusServiceUnavailable:
		rc.Fail(route.FailUnavailable)
	}
}

// shuttingDown reports whether ctx ended because the router's drain ran out (proxy.ErrShuttingDown).
func shuttingDown(ctx context.Context) bool {
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), proxy.ErrShuttingDown)
}

// shutdownError is the answer, or a stream's last event, of a request the drain cut: as
// `kvroute serve` answers it (503, code shutting_down, which the OpenAI SDKs retry).
func shutdownError(requestID string) *openai.Error {
	return openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "shutting_down",
		"the router is shutting down: the request was still in flight when its drain (server.shutdown_timeout) ran out; send it again (request id "+requestID+")")
}

// shutdown cuts the stream at the end of the drain (the drainer's cut), unless its request has
// ended: it is answered, and settled, as cut (cut). A stream that has not sent its request's
// headers is no request yet: its connection's close ends it.
func (st *stream) shutdown() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.phase == done || st.x == nil {
		return
	}
	_ = st.cut() // a send that fails: the gateway is gone, and the request is settled all the same
}

// cut answers a request the drain cut, and settles it. Before its answer has begun (the pick
// not made, or made and the engine's head not come), the gateway gets an immediate response
// 503 shutting_down, which it sends the client in place of the engine's answer (Envoy resets
// the engine's request). After, the client has a head already: a stream whose events pass
// through kvroute in FULL_DUPLEX_STREAMED mode first gets serve's last event (an SSE error
// event of code shutting_down); then the same immediate response, with which Envoy ends the
// client's answer (it resets it, the head being sent). The request is logged and counted as
// 503 shutting_down, and nothing counts against its engine.
func (st *stream) cut() error {
	st.s.drain.cuts.Add(1)
	st.log.Debug("ext_proc stream cut at the end of the drain", "request_id", st.x.RequestID(), "phase", st.phase.String())
	e := shutdownError(st.x.RequestID())
	if st.phase == answering && st.sse && st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		var b bytes.Buffer
		_ = openai.WriteEvent(&b, "error", e.Body()) // a bytes.Buffer takes any write
		if err := st.sendChunks(b.Bytes(), false, responseBody); err != nil {
			st.settleCut()
			return err
		}
	}
	st.settleCut() // here, not by immediateBody's settle: the attempt is closed as not the engine's doing
	err := st.immediateBody(e.Status, e.Body())
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

// settleCut settles a request the drain cut as `kvroute serve` settles one: 503, error_type
// service_unavailable_error and error_code shutting_down on the access line, and nothing
// against its engine. The attempt is closed first as the client's leaving would close it
// (the call's Finish keeps the first outcome it is given), so that the 503 is not taken for
// the engine's.
func (st *stream) settleCut() {
	if st.settled {
		return
	}
	st.phase = done
	if rc := st.x.Call(); rc != nil {
		rc.Finish(route.Outcome{OK: false, CachedTokens: -1, Failure: route.FailNone})
	}
	st.x.Refused(shutdownError(st.x.RequestID()))
	st.settle(http.StatusServiceUnavailable)
}

func (st *stream) settle(status int) {
	if st.settled {
		return
	}
	st.settled = true
	st.x.Settle(status, st.method, st.path)
}

// exchange starts the request's passage through the router, once.
func (st *stream) exchange(requestID string) {
	if st.x == nil {
		st.x = st.s.Handler().NewExchange(requestID, "ext_proc")
		st.out = http.Header{}
	}
}

// immediate answers the request with e, ending the stream. A request shed because the fleet
// is overloaded is a 429 to the gateway (the protocol keeps 503 for "no endpoint eligible"),
// where `kvroute serve` answers 503.
func (st *stream) immediate(e *openai.Error) error {
	st.exchange("")
	if e.Status == http.StatusServiceUnavailable && e.Code != nil && *e.Code == "overloaded" {
		shed := *e
		shed.Status = http.StatusTooManyRequests
		e = &shed
	}
	st.x.Refused(e)
	return st.immediateBody(e.Status, e.Body())
}

// immediateBody answers the request with a JSON body and status, and settles it.
func (st *stream) immediateBody(code int, body []byte) error {
	set := []*corev3.HeaderValueOption{
		setHeader("content-type", "application/json"),
		setHeader("x-request-id", st.x.EchoedID()),
	}
	for k, vs := range st.out {
		set = append(set, setHeader(strings.ToLower(k), vs[0]))
	}
	slices.SortFunc(set, func(a, b *corev3.HeaderValueOption) int { return strings.Compare(a.Header.Key, b.Header.Key) })
	err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: set},
			Body:    body,
			Details: "kvroute_" + strconv.Itoa(code),
		}}})
	st.phase = done
	st.settle(code)
	if err != nil {
		return err
	}
	return errStop
}

// direction says which body a chunk belongs to.
type direction bool

const (
	requestBody  direction = false
	responseBody direction = true
)

// sendChunks sends body back to Envoy as streamed chunks of at most ChunkBytes, the last one
// carrying eos (one empty chunk when body is empty and eos is set).
func (st *stream) sendChunks(body []byte, eos bool, d direction) error {
	n := st.s.chunkBytes()
	for {
		part := body[:min(len(body), n)]
		body = body[len(part):]
		last := len(body) == 0
		sb := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{
				Body: part, EndOfStream: eos && last}}}}}
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: sb}}
		if d == responseBody {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: sb}}
		}
		if err := st.send(resp); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(resp); err != nil {
		return fmt.Errorf("ext_proc: sending to the gateway: %w", err)
	}
	return nil
}

// headerValue is a header's value: Envoy sends raw_value (value in older releases).
func headerValue(hv *corev3.HeaderValue) string {
	if rv := hv.GetRawValue(); len(rv) > 0 {
		return string(rv)
	}
	return hv.GetValue()
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
