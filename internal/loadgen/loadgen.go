package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/h1"
)

// Class says why a request failed; ClassOK for success.
type Class string

// Error classes. A request is in exactly one.
const (
	ClassOK         Class = ""
	ClassHTTP       Class = "http"       // the target answered with a non-2xx status (see Record.Status)
	ClassConnection Class = "connection" // no response: refused, reset, DNS, TLS
	ClassTimeout    Class = "timeout"    // Config.RequestTimeout elapsed
	ClassMidStream  Class = "mid_stream" // the stream broke, carried an error, or ended without [DONE]
	ClassCanceled   Class = "canceled"   // the run was cancelled while the request was in flight
)

// Item is one request to send.
type Item struct {
	// At is when to send, from the start of the run (open loop); ignored in a closed loop.
	At time.Duration
	// Session is sent as X-Session-ID when not empty (multi-turn workloads).
	Session string
	// PromptTokens is the caller's estimate, kept when the server reports no usage.
	PromptTokens int
	// MaxTokens is sent as max_tokens when > 0.
	MaxTokens int
	// Prompt renders the prompt text. It is called in the sending goroutine, just before the
	// request is built, so that a long trace is never held in memory as text.
	Prompt func() string
	// Whole sends "stream": false: the answer comes whole, and its TTFT is its whole time.
	Whole bool
}

// Record is what happened to one request. Times are offsets from the start of the run or
// durations measured with the monotonic clock.
type Record struct {
	Index     int           // position of the item in the workload
	Session   string        // Item.Session
	Scheduled time.Duration // when it was due (open loop) or taken (closed loop)
	Sent      time.Duration // when the request was actually handed to the HTTP client
	// TTFT is from Sent to the first chunk with non-empty content; 0 when none arrived.
	TTFT time.Duration
	// ITL holds one gap per chunk of content after the first: from the arrival of one chunk to
	// the next. A chunk is what reached the client at once: one event, or several events that
	// came in one read of the connection (a server that flushes several tokens' events
	// together), which count as one. Zero gaps between events that arrived together would say
	// nothing of the server and pull the percentiles to 0.
	ITL []time.Duration
	E2E time.Duration // from Sent to the end of the stream (or the failure)
	// PromptTokens from usage, else the item's estimate.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens, or -1 when not reported.
	CachedTokens int
	// OutputTokens from usage, else the number of events with content.
	OutputTokens int
	Status       int // HTTP status, 0 when none
	Class        Class
	// Err is the reason when Class != ClassOK, on one line and at most maxReason characters:
	// for ClassHTTP the message of the answer's error object (what a router or engine says
	// is wrong: an unknown model, a bad key), else its body or status.
	Err string
	// Endpoint is the value of Config.EndpointHeader in the response, "" when absent.
	Endpoint string
}

// OK reports whether the request succeeded.
func (r *Record) OK() bool { return r.Class == ClassOK }

// ErrorLabel is the error class as counted in summaries: "http_503", "timeout", ..., "" for OK.
func (r *Record) ErrorLabel() string {
	if r.Class == ClassHTTP {
		return fmt.Sprintf("http_%d", r.Status)
	}
	return string(r.Class)
}

// maxReason bounds Record.Err in characters: room for an error message, short enough for a
// line of a report.
const maxReason = 200

// reason is msg on one line (runs of white space as one space), cut to maxReason characters.
func reason(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if utf8.RuneCountInString(msg) <= maxReason {
		return msg
	}
	r := []rune(msg)
	return string(r[:maxReason-3]) + "..."
}

// errorMessage is what an error answer says: the message of its OpenAI error object
// ({"error": {"message": ...}}, or {"error": "..."}), or the top-level message of vLLM's
// older form ({"object": "error", "message": ...}); else the body, else the status line.
func errorMessage(status string, body []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &e) == nil {
		var obj struct {
			Message string `json:"message"`
		}
		var str string
		switch {
		case json.Unmarshal(e.Error, &obj) == nil && obj.Message != "":
			return obj.Message
		case json.Unmarshal(e.Error, &str) == nil && str != "":
			return str
		case e.Message != "":
			return e.Message
		}
	}
	if msg := strings.TrimSpace(string(body)); msg != "" {
		return msg
	}
	return status
}

// Config is how to send a workload. Target and Model are required.
type Config struct {
	// Target is the base URL of an OpenAI-compatible server ("http://127.0.0.1:8000"); the
	// API path is appended unless the URL already ends in "/completions".
	Target string
	Model  string
	// APIKey is sent as a bearer token when set. It is never logged.
	APIKey string
	// API is "chat" (/v1/chat/completions, the default) or "completions" (/v1/completions).
	API string
	// Concurrency > 0 runs a closed loop of that many workers, each sending its next request
	// as soon as the previous one ends; Item.At is then ignored. 0 paces by Item.At.
	Concurrency int
	// MaxInFlight caps requests in flight in an open loop (default 4096). A request due while
	// the cap is reached is sent late, and its Sent shows it.
	MaxInFlight int
	// Duration stops sending new requests once it has elapsed (0: no bound).
	Duration time.Duration
	// RequestTimeout bounds each request end to end (default 10 minutes).
	RequestTimeout time.Duration
	// IgnoreEOS sends vLLM's ignore_eos so that output lengths follow the workload.
	IgnoreEOS bool
	// NoUsage sends the streamed requests without stream_options.include_usage, as many
	// clients do: kvroute then asks the engine for usage itself (and drops that chunk), and
	// records count the content chunks as output tokens, the prompt tokens being the estimate.
	NoUsage bool
	// EndpointHeader names a response header that says which backend served the request.
	EndpointHeader string
	// Client sends the requests; nil builds one with a Transport sized for MaxInFlight.
	Client *http.Client
	// Now is the clock (default time.Now). It must be monotonic.
	Now func() time.Time
	// OnRecord, when set, is called with each record as its request ends, from one goroutine.
	OnRecord func(Record)
	// Logger receives warnings (nil: discarded). Prompts and keys are never logged.
	Logger *slog.Logger
}

// Result is the outcome of a run.
type Result struct {
	// Records holds one record per request sent, in workload order.
	Records []Record
	Start   time.Time
	// Elapsed is from Start to the end of the last request.
	Elapsed time.Duration
}

// SendRate is the achieved send rate in requests per second: requests sent after the first,
// over the time from the first send to the last. 0 with fewer than two requests.
func (r *Result) SendRate() float64 {
	if len(r.Records) < 2 {
		return 0
	}
	first, last := r.Records[0].Sent, r.Records[0].Sent
	for i := range r.Records {
		s := r.Records[i].Sent
		first, last = min(first, s), max(last, s)
	}
	if last <= first {
		return 0
	}
	return float64(len(r.Records)-1) / (last - first).Seconds()
}

// FirstErrors returns, for each error class as ErrorLabel names it, the Err of the first
// request in workload order that failed in it: what the target said, which the counts alone
// do not (a 404 for an unknown model and one for a wrong path look the same). Nil when none
// failed.
func (r *Result) FirstErrors() map[string]string {
	var first map[string]string
	for i := range r.Records {
		rec := &r.Records[i]
		if rec.OK() {
			continue
		}
		if first == nil {
			first = map[string]string{}
		}
		if _, ok := first[rec.ErrorLabel()]; !ok {
			first[rec.ErrorLabel()] = rec.Err
		}
	}
	return first
}

func (c *Config) check() error {
	var errs []error
	u, err := url.Parse(c.Target)
	switch {
	case c.Target == "":
		errs = append(errs, errors.New("target: empty (set the server's base URL, e.g. http://127.0.0.1:8000)"))
	case err != nil:
		errs = append(errs, fmt.Errorf("target: %w", err))
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		errs = append(errs, fmt.Errorf("target: %q is not an http(s) URL with a host", c.Target))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("model: empty (set the model name the server serves)"))
	}
	if c.API != "" && c.API != "chat" && c.API != "completions" {
		errs = append(errs, fmt.Errorf("api: %q is neither chat nor completions", c.API))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("concurrency: %d is negative", c.Concurrency))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, fmt.Errorf("max in flight: %d is negative", c.MaxInFlight))
	}
	if c.Duration < 0 || c.RequestTimeout < 0 {
		errs = append(errs, errors.New("duration and request timeout must not be negative"))
	}
	return errors.Join(errs...)
}

// NewTransport returns an HTTP transport tuned for load generation: enough idle connections
// per host for maxConns, and no compression (a gzipped stream would hide first-token time).
func NewTransport(maxConns int) *http.Transport {
	return &http.Transport{
		Proxy:               nil, // a load generator measures the target, not a proxy
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        maxConns,
		MaxIdleConnsPerHost: maxConns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

type runner struct {
	cfg     Config
	url     string
	client  *http.Client
	now     func() time.Time
	start   time.Time
	results chan Record
	bufs    sync.Pool // of *bufio.Reader, streamBuffer bytes: the requests in flight read through them
}

// Run sends items to cfg.Target and returns a record per request sent. It returns an error
// only for a bad Config, or ctx's error when the run was cancelled (with the records so far).
func Run(ctx context.Context, cfg Config, items []Item) (Result, error) {
	if err := cfg.check(); err != nil {
		return Result{}, fmt.Errorf("loadgen: %w", err)
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 4096
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	r := &runner{cfg: cfg, now: cfg.Now, client: cfg.Client}
	if r.now == nil {
		r.now = time.Now
	}
	if r.client == nil {
		conns := cfg.MaxInFlight
		if cfg.Concurrency > 0 {
			conns = cfg.Concurrency
		}
		// kvroute's keep-alive transport for http:// targets (the request's own goroutine does
		// its I/O: less CPU per request than net/http's, which a load generator sharing a
		// machine with what it measures would otherwise add to the latencies); https:// and the
		// rest go through net/http's.
		tr := h1.New(NewTransport(conns))
		tr.MaxIdlePerHost = conns
		tr.Dialer = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		defer tr.CloseIdleConnections()
		r.client = &http.Client{Transport: tr}
	}
	r.url = endpointURL(cfg.Target, cfg.API)
	r.results = make(chan Record, 256)

	recs := make([]Record, len(items))
	sent := make([]bool, len(items))
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for rec := range r.results {
			recs[rec.Index] = rec
			sent[rec.Index] = true
			if cfg.OnRecord != nil {
				cfg.OnRecord(rec)
			}
		}
	}()

	r.start = r.now()
	if cfg.Concurrency > 0 {
		r.closedLoop(ctx, items)
	} else {
		r.openLoop(ctx, items)
	}
	close(r.results)
	<-collected

	res := Result{Start: r.start, Elapsed: r.now().Sub(r.start)}
	res.Records = make([]Record, 0, len(items))
	for i := range recs {
		if sent[i] {
			res.Records = append(res.Records, recs[i])
		}
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("loadgen: run cancelled: %w", err)
	}
	return res, nil
}

func endpointURL(target, api string) string {
	t := strings.TrimRight(target, "/")
	if strings.HasSuffix(t, "/completions") {
		return t
	}
	t = strings.TrimSuffix(t, "/v1")
	if api == "completions" {
		return t + "/v1/completions"
	}
	return t + "/v1/chat/completions"
}

// openLoop sends each item at start+At from one scheduler goroutine.
func (r *runner) openLoop(ctx context.Context, items []Item) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, r.cfg.MaxInFlight)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for i := range items {
		it := &items[i]
		if r.cfg.Duration > 0 && it.At >= r.cfg.Duration {
			return
		}
		if wait := r.start.Add(it.At).Sub(r.now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
		select {
		case <-ctx.Done():
			return
		case sem <- struct{}{}:
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r.results <- r.send(ctx, i, it, it.At)
		})
	}
}

// closedLoop runs Concurrency workers that each take the next item as soon as they are free.
func (r *runner) closedLoop(ctx context.Context, items []Item) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(items) {
					return
				}
				at := r.now().Sub(r.start)
				if r.cfg.Duration > 0 && at >= r.cfg.Duration {
					return
				}
				r.results <- r.send(ctx, i, &items[i], at)
			}
		})
	}
	wg.Wait()
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []chatMessage  `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

func (r *runner) body(it *Item) ([]byte, error) {
	var prompt string
	if it.Prompt != nil {
		prompt = it.Prompt()
	}
	b := requestBody{
		Model:         r.cfg.Model,
		MaxTokens:     it.MaxTokens,
		Stream:        !it.Whole,
		StreamOptions: map[string]any{"include_usage": true},
		IgnoreEOS:     r.cfg.IgnoreEOS,
	}
	if r.cfg.NoUsage || it.Whole {
		b.StreamOptions = nil
	}
	if r.cfg.API == "completions" {
		b.Prompt = prompt
	} else {
		b.Messages = []chatMessage{{Role: "user", Content: prompt}}
	}
	return json.Marshal(b)
}

// send performs one request and measures it. It never returns an error: failures are classes.
func (r *runner) send(ctx context.Context, idx int, it *Item, scheduled time.Duration) Record {
	rec := Record{Index: idx, Session: it.Session, Scheduled: scheduled, PromptTokens: it.PromptTokens, CachedTokens: -1}
	body, err := r.body(it)
	if err != nil {
		rec.Sent = r.now().Sub(r.start)
		rec.Class, rec.Err = ClassConnection, reason("encode request: "+err.Error())
		return rec
	}
	reqCtx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		rec.Sent = r.now().Sub(r.start)
		rec.Class, rec.Err = ClassConnection, reason(err.Error())
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	accept := "text/event-stream"
	if it.Whole {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	if r.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
	if it.Session != "" {
		req.Header.Set("X-Session-ID", it.Session)
	}

	t0 := r.now()
	rec.Sent = t0.Sub(r.start)
	finish := func(c Class, msg string) Record {
		rec.E2E = r.now().Sub(t0)
		rec.Class, rec.Err = c, reason(msg)
		return rec
	}
	failClass := func(def Class) Class {
		switch {
		case ctx.Err() != nil:
			return ClassCanceled
		case errors.Is(reqCtx.Err(), context.DeadlineExceeded):
			return ClassTimeout
		}
		return def
	}

	resp, err := r.client.Do(req)
	if err != nil {
		return finish(failClass(ClassConnection), err.Error())
	}
	defer closeBody(resp.Body)
	rec.Status = resp.StatusCode
	if r.cfg.EndpointHeader != "" {
		rec.Endpoint = resp.Header.Get(r.cfg.EndpointHeader)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return finish(ClassHTTP, errorMessage(fmt.Sprintf("%d %s", resp.StatusCode, http.StatusText(resp.StatusCode)), body))
	}

	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		// A server that ignores stream: true answers with one JSON body: its first token is
		// only visible when the whole answer is.
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxEventLine))
		if err != nil {
			return finish(failClass(ClassMidStream), err.Error())
		}
		c, err := parseChunk(bytes.TrimSpace(body))
		if err != nil {
			return finish(ClassMidStream, err.Error())
		}
		rec.TTFT = r.now().Sub(t0)
		if c.Usage != nil {
			if c.Usage.PromptTokens > 0 {
				rec.PromptTokens = c.Usage.PromptTokens
			}
			rec.OutputTokens = c.Usage.CompletionTokens
			rec.CachedTokens = c.Usage.CachedTokens()
		}
		return finish(ClassOK, "")
	}

	// Events that came in one read of the body are one chunk of content (Record.ITL): reads
	// counts those reads, through a buffer that takes at once what a burst of events brings
	// (the SSE reader's own holds a dozen events).
	reads := &readCounter{r: resp.Body}
	br, _ := r.bufs.Get().(*bufio.Reader)
	if br == nil {
		br = bufio.NewReaderSize(nil, streamBuffer)
	}
	br.Reset(reads)
	defer func() {
		br.Reset(nil)
		r.bufs.Put(br)
	}()
	sr := NewStreamReader(br)
	var last time.Time // when the last chunk of content arrived
	lastRead := 0      // the reads done then
	chunks := 0        // events with content
	var usage *Usage
	for {
		c, err := sr.Next()
		if errors.Is(err, ErrDone) {
			break
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return finish(ClassMidStream, "stream ended without [DONE]")
			}
			return finish(failClass(ClassMidStream), err.Error())
		}
		if c.Error != "" {
			return finish(ClassMidStream, c.Error)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		if c.Content == "" {
			continue
		}
		chunks++
		if reads.n == lastRead {
			continue // no read since the content before it: it came with that
		}
		t := r.now()
		if lastRead == 0 {
			rec.TTFT = t.Sub(t0)
		} else {
			rec.ITL = append(rec.ITL, t.Sub(last))
		}
		last, lastRead = t, reads.n
	}
	rec.OutputTokens = chunks
	if usage != nil {
		if usage.PromptTokens > 0 {
			rec.PromptTokens = usage.PromptTokens
		}
		if usage.CompletionTokens > 0 {
			rec.OutputTokens = usage.CompletionTokens
		}
		rec.CachedTokens = usage.CachedTokens()
	}
	if chunks == 0 {
		return finish(ClassMidStream, "stream carried no content")
	}
	return finish(ClassOK, "")
}

// streamBuffer is the size of the buffer through which a streamed answer is read: kvroute
// sim's largest write (some 60 events), so that one read of the body takes a burst whole.
const streamBuffer = 16 << 10

// readCounter counts the reads of r that brought bytes.
type readCounter struct {
	r io.Reader
	n int
}

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n++
	}
	return n, err
}

// closeBody reads what is left of an answer, up to a few kB, before closing it: after [DONE]
// the server still sends the chunked body's end, and net/http reuses a connection only when
// the body was read to its end. Closing at [DONE] cost a new connection per request (seen
// under strace as 44 of 64 requests on new connections), which a real client does not pay and
// which the server's CPU per request then counted. The read ends with the request's context.
func closeBody(b io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(b, 4<<10))
	_ = b.Close()
}
