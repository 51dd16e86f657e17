package simserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds a request body (a 128k-token prompt is about 512 KiB of text).
const maxBody = 16 << 20

func (in *Instance) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/chat/completions", in.api(in.completion(openai.KindChat)))
	mux.Handle("POST /v1/completions", in.api(in.completion(openai.KindCompletion)))
	mux.Handle("POST /v1/responses", in.api(in.completion(openai.KindResponse)))
	mux.Handle("GET /v1/models", in.api(http.HandlerFunc(in.models)))
	mux.HandleFunc("GET /health", in.health)
	mux.Handle("GET /metrics", promhttp.HandlerFor(in.reg, promhttp.HandlerOpts{}))
	if in.opts.Admin {
		mux.HandleFunc("GET /admin/faults", in.getFaults)
		mux.HandleFunc("POST /admin/faults", in.postFaults)
	}
	return mux
}

// enter registers an in-flight API request; it fails once Close has begun, so that Close can
// wait for every handler.
func (in *Instance) enter() bool {
	in.enterMu.Lock()
	defer in.enterMu.Unlock()
	if in.closed {
		return false
	}
	in.reqs.Add(1)
	return true
}

// api wraps the OpenAI endpoints with the fault injection and the in-flight accounting.
func (in *Instance) api(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gen := in.crashes.Load() // a crash after this drops the request
		f := in.faults.Load()
		if f.Refuse {
			in.met.fault("refuse")
			drop(w)
			return
		}
		if f.DropOn != "" && r.Method == http.MethodPost && !in.dropOn(w, r, f) {
			return
		}
		if f.FailRate > 0 && in.draw() < f.FailRate {
			in.met.fault("fail_rate")
			st := f.status()
			openai.WriteError(w, openai.NewError(st, failType(st), "", "", "simulated failure (fault injection)"))
			return
		}
		if !in.enter() {
			openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", "the server is shutting down"))
			return
		}
		defer in.reqs.Done()
		if f.Hang && !in.hang(r, gen) {
			return
		}
		next.ServeHTTP(w, r)
	})
}

// failType is the OpenAI error type of a failure answered with status (fail_status): a 4xx
// is the client's, not a server_error.
func failType(status int) string {
	switch {
	case status == http.StatusServiceUnavailable:
		return openai.TypeUnavailable
	case status == http.StatusNotFound:
		return openai.TypeNotFound
	case status < 500:
		return openai.TypeInvalidRequest
	}
	return openai.TypeServer
}

func (in *Instance) health(w http.ResponseWriter, _ *http.Request) {
	if in.faults.Load().Unhealthy {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
	Permission  []any   `json:"permission"`
}

func (in *Instance) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []modelCard{{
			ID: in.opts.Model, Object: "model", Created: in.created.Unix(), OwnedBy: "vllm",
			Root: in.opts.Model, MaxModelLen: in.opts.MaxModelLen, Permission: []any{},
		}},
	})
}

func (in *Instance) getFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, in.Faults())
}

// postFaults merges the JSON body into the current faults: fields left out keep their value.
func (in *Instance) postFaults(w http.ResponseWriter, r *http.Request) {
	f := in.Faults()
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		openai.WriteError(w, openai.BadRequest("", "faults: %v (fields: %s)", err, faultFields()))
		return
	}
	if err := in.SetFaults(f); err != nil {
		openai.WriteError(w, openai.BadRequest("", "%v", err))
		return
	}
	in.log.Info("faults set", "faults", f)
	writeJSON(w, http.StatusOK, f)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		openai.WriteError(w, openai.NewError(http.StatusInternalServerError, openai.TypeServer, "", "", "encode response: "+err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readBody reads the request body (at most maxBody bytes) into a buffer sized from
// Content-Length, so that a long prompt is not copied through a series of growing buffers.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, maxBody)
	if n := r.ContentLength; n > 0 && n <= maxBody {
		buf := bytes.NewBuffer(make([]byte, 0, n+bytes.MinRead)) // ReadFrom keeps MinRead free
		_, err := buf.ReadFrom(rd)
		return buf.Bytes(), err
	}
	return io.ReadAll(rd)
}

// maxPrompts bounds the prompts of one completion request. vLLM sets no bound; here every
// wake-up of the handler reads each prompt's progress, so its work grows with the square.
const maxPrompts = 1024

// call is one prompt of a completion request as the handler sees it. A completion whose prompt
// is a list has one call per prompt (as vLLM schedules one engine request per prompt); they
// share the response id, the timestamp and the job's notify channel.
type call struct {
	kind         openai.Kind
	resp         *respInfo // a Responses call's (KindResponse), else nil
	index        int       // choices[].index: the choice's place in the answer
	choice       int       // which of its prompt's n choices it is: only the first counts the prompt's tokens in usage
	id           string    // chatcmpl-..., cmpl-... or resp_...
	rid          string    // x-request-id
	created      int64
	model        []byte // JSON string
	promptTokens int
	includeUsage bool
	textBase     uint64
	job          *job

	sent    int    // stream: output tokens written
	started bool   // stream: the first token is in the buffer being written
	gen     uint64 // the instance's crashes when the request began (calls[0] only)
}

func (in *Instance) completion(kind openai.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		recv := time.Now() // the pacing clock; timestamps come from Options.Now
		gen := in.crashes.Load()
		body, err := readBody(w, r)
		if err != nil {
			openai.WriteError(w, openai.BadRequest("", "read body: %v", err))
			return
		}
		req, err := openai.Parse(kind, body)
		if err != nil {
			var oe *openai.Error
			if !errors.As(err, &oe) {
				oe = openai.BadRequest("", "%v", err)
			}
			openai.WriteError(w, oe)
			return
		}
		if req.Model != in.opts.Model {
			openai.WriteError(w, openai.NewError(http.StatusNotFound, openai.TypeNotFound, "model", "model_not_found",
				fmt.Sprintf("The model `%s` does not exist.", req.Model)))
			return
		}
		calls, oe := in.newCalls(kind, req, recv)
		if oe != nil {
			openai.WriteError(w, oe)
			return
		}
		calls[0].gen = gen
		rid := r.Header.Get("X-Request-Id")
		if rid == "" {
			rid = calls[0].id
		}
		w.Header().Set("X-Request-Id", rid)
		for _, c := range calls {
			c.rid = rid
			if err := in.send(command{kind: cmdSubmit, job: c.job}); err != nil {
				openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", "the server is shutting down"))
				return
			}
		}
		in.log.Debug("request", "id", rid, "prompts", len(calls), "prompt_tokens", calls[0].promptTokens, "max_tokens", calls[0].job.req.OutputTokens, "stream", req.Stream)
		if req.Stream {
			in.stream(w, r, calls)
		} else {
			in.respond(w, r, calls)
		}
	}
}

// newCalls builds the calls of a request: one per choice, n (the request's, else 1) for each
// prompt, one or one per prompt of a completion's list, as vLLM schedules one engine request
// per choice. Their choices[].index run prompt by prompt, choice by choice.
func (in *Instance) newCalls(kind openai.Kind, req *openai.Request, recv time.Time) ([]*call, *openai.Error) {
	texts, tokens := req.Prompt.Texts, req.Prompt.Tokens
	prompts, samples := len(texts)+len(tokens), max(req.N, 1)
	if kind != openai.KindCompletion || prompts <= 1 {
		prompts = 1
	}
	if kind == openai.KindResponse {
		samples = 1 // the Responses API has no n
	}
	if samples > maxPrompts || prompts*samples > maxPrompts {
		if samples == 1 {
			return nil, openai.BadRequest("prompt", "a list of %d prompts: send at most %d in one request", prompts, maxPrompts)
		}
		return nil, openai.BadRequest("n", "%d prompts of %d choices each: ask for at most %d choices in one request", prompts, samples, maxPrompts)
	}
	calls := make([]*call, 0, prompts*samples)
	one := *req
	for i := range prompts {
		text := req.AppendCanonical(nil)
		if prompts > 1 {
			if i < len(texts) {
				one.Prompt = openai.Prompt{Texts: texts[i : i+1]}
			} else {
				one.Prompt = openai.Prompt{Tokens: tokens[i-len(texts) : i-len(texts)+1]}
			}
			text = one.AppendCanonical(nil)
		}
		for k := range samples {
			// Like vLLM, one prompt that does not fit fails the whole request.
			c, oe := in.newCall(kind, &one, text, recv)
			if oe != nil {
				return nil, oe
			}
			c.index, c.choice = len(calls), k
			c.textBase += uint64(k) * 0x9e3779b97f4a7c15 // each choice its own text
			if len(calls) > 0 {
				c.id, c.created, c.job.notify = calls[0].id, calls[0].created, calls[0].job.notify
			}
			calls = append(calls, c)
		}
	}
	return calls, nil
}

// newCall checks the request's lengths and builds its engine request.
func (in *Instance) newCall(kind openai.Kind, req *openai.Request, text []byte, recv time.Time) (*call, *openai.Error) {
	promptTokens := max(1, prefix.EstimateTokens(string(text)))
	maxTokens, finish := req.MaxTokens, "length"
	bound := "max_tokens" // the member that bounds the answer, for errors
	if kind == openai.KindResponse {
		bound = "max_output_tokens"
	}
	if maxTokens < 0 {
		return nil, openai.BadRequest(bound, "%s must be at least 1, got %d", bound, maxTokens)
	}
	if maxTokens == 0 {
		maxTokens, finish = in.opts.DefaultMaxTokens, "stop"
	}
	// Compare each part first: the sum of two huge values could overflow.
	if promptTokens > in.opts.MaxModelLen || maxTokens > in.opts.MaxModelLen || promptTokens+maxTokens > in.opts.MaxModelLen {
		return nil, openai.BadRequest(bound,
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			in.opts.MaxModelLen, promptTokens+maxTokens, promptTokens, maxTokens)
	}
	bs := in.cfg.BlockSize
	if need, room := (promptTokens+maxTokens-1+bs-1)/bs, in.eng.SeqBlocks(); need > room {
		return nil, openai.BadRequest(bound,
			"the request needs %d KV blocks (%d prompt + %d output tokens) but one request can have at most %d: reduce the length of the messages or completion",
			need, promptTokens, maxTokens, room)
	}
	keys := prefix.ContentKeys(make([]uint64, 0, len(text)/prefix.BlockBytes(bs)), text, bs)
	n := in.nextID.Add(1)
	salt := req.CacheSalt
	if in.faults.Load().NoPrefixCache {
		salt = "\x00no_prefix_cache " + strconv.FormatUint(n, 10) // a salt of its own: nothing shared
	}
	base := textSeed(in.opts.Seed, text)
	idPrefix := "chatcmpl-"
	switch kind {
	case openai.KindCompletion:
		idPrefix = "cmpl-"
	case openai.KindResponse:
		idPrefix = "resp_"
	}
	model, _ := json.Marshal(in.opts.Model)
	j := &job{
		req: engine.Request{
			ID: "req-" + strconv.FormatUint(n, 10), PromptTokens: promptTokens, OutputTokens: maxTokens,
			BlockKeys: keys, Salt: salt,
		},
		arrival: in.modelAt(recv),
		predict: in.Predict(promptTokens, 0),
		notify:  make(chan struct{}, 1),
		firstAt: -1,
		finish:  finish,
		stream:  req.Stream,
	}
	if in.pub != nil {
		// The driver finds the text of the blocks named in BlockStored events by their hashes.
		j.text = text
		j.hashes = prefix.Chain(make([]uint64, 0, len(keys)), prefix.Seed("", salt), keys)
	}
	var resp *respInfo
	if kind == openai.KindResponse {
		resp = newRespInfo(req)
	}
	return &call{
		kind:         kind,
		resp:         resp,
		id:           fmt.Sprintf("%s%016x%016x", idPrefix, prefix.Next(in.opts.Seed, n), base),
		created:      in.opts.Now().Unix(),
		model:        model,
		promptTokens: promptTokens,
		includeUsage: req.IncludeUsage,
		textBase:     base,
		job:          j,
	}, nil
}

// progress is what the handler read of its job.
type progress struct {
	produced, cached int
	done             bool
	err              error
}

func (j *job) progress() progress {
	j.mu.Lock()
	defer j.mu.Unlock()
	return progress{produced: j.produced, cached: j.cached, done: j.done, err: j.err}
}

// wait blocks until one of the calls' jobs changes (they share one notify channel), the client
// leaves or the instance closes. It returns false when the handler must stop (after asking the
// driver to abort the requests). When a drop_all request crashed the instance since the
// request began, the requests are aborted and the connection dropped.
func (in *Instance) wait(r *http.Request, calls []*call) bool {
	crashed := *in.crashed.Load() // before the count: a crash in between closes it
	if in.crashes.Load() != calls[0].gen {
		in.cut(calls)
	}
	select {
	case <-calls[0].job.notify:
		return true
	case <-r.Context().Done():
		in.abort(calls)
		return false
	case <-in.closing:
		return false
	case <-crashed:
		in.cut(calls)
		return false
	}
}

func (in *Instance) abort(calls []*call) {
	for _, c := range calls {
		_ = in.send(command{kind: cmdAbort, job: c.job}) // fails only when closing: the driver stops anyway
	}
}

// cut aborts the requests and the connection, as a crashing server would.
func (in *Instance) cut(calls []*call) {
	in.abort(calls)
	panic(http.ErrAbortHandler)
}

// respond writes the answer once every call is done: one choice per prompt, usage summed.
func (in *Instance) respond(w http.ResponseWriter, r *http.Request, calls []*call) {
	ps := make([]progress, len(calls))
	for {
		if !in.wait(r, calls) {
			return
		}
		cut := in.faults.Load().CutAfter
		done := true
		for i, c := range calls {
			p := c.job.progress()
			if p.err != nil {
				in.abort(calls)
				openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", p.err.Error()))
				return
			}
			if cut > 0 && p.produced >= cut {
				in.met.fault("cut_after")
				in.cut(calls)
			}
			done = done && p.done
			ps[i] = p
		}
		if !done {
			continue
		}
		c0 := calls[0]
		if c0.kind == openai.KindResponse { // one call: the API has no n
			writeJSON(w, http.StatusOK, c0.responseObject(true, ps[0].produced, ps[0].cached))
			return
		}
		usage := openai.Usage{PromptTokensDetails: &openai.TokenDetails{}}
		choices := make([]any, len(calls))
		for i, c := range calls {
			p := ps[i]
			if c.choice == 0 {
				usage.PromptTokens += c.promptTokens
				usage.PromptTokensDetails.CachedTokens += p.cached
			}
			usage.CompletionTokens += p.produced
			text := string(appendText(nil, c.textBase, 0, p.produced))
			choice := map[string]any{"index": c.index, "logprobs": nil, "finish_reason": c.job.finish, "stop_reason": nil}
			if c.kind == openai.KindChat {
				choice["message"] = map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}, "reasoning_content": nil}
			} else {
				choice["text"] = text
			}
			choices[i] = choice
		}
		usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
		object := "text_completion"
		if c0.kind == openai.KindChat {
			object = "chat.completion"
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": c0.id, "object": object, "created": c0.created, "model": json.RawMessage(c0.model),
			"choices": choices, "usage": usage,
		})
		return
	}
}

// stream writes the calls' tokens as SSE chunks as they come, each chunk's choice carrying its
// prompt's index; the usage chunk (summed over the prompts) and [DONE] follow the last token.
func (in *Instance) stream(w http.ResponseWriter, r *http.Request, calls []*call) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	buf := in.getBuf()
	defer func() { in.putBuf(buf) }()
	if c0 := calls[0]; c0.kind == openai.KindResponse {
		if _, err := w.Write(c0.appendResponseStart(buf)); err != nil {
			in.abort(calls)
			return
		}
		_ = rc.Flush()
	}
	for {
		// The driver wakes the handler at each prompt's first token, at its end and, in between,
		// at most once per StreamInterval: each wake-up writes every token produced so far.
		if !in.wait(r, calls) {
			return
		}
		cut := in.faults.Load().CutAfter
		buf = buf[:0]
		done, started := true, false
		var sum progress
		for _, c := range calls {
			p := c.job.progress()
			if p.err != nil {
				in.cut(calls)
			}
			sum.produced += p.produced
			if c.choice == 0 {
				sum.cached += p.cached
			}
			done = done && p.done
			// The last token goes out with its finish_reason: hold it back until the driver has
			// marked the job done (it delivers the token, then the end, each under the lock).
			upto := p.produced
			if !p.done {
				upto = min(upto, c.job.req.OutputTokens-1)
			}
			for c.sent < upto {
				if cut > 0 && c.sent >= cut {
					_, _ = w.Write(buf)
					_ = rc.Flush()
					in.met.fault("cut_after")
					in.cut(calls)
				}
				if len(buf) > streamBufSize-1024 {
					// Bound the buffer: a stream that fell far behind goes out in several writes.
					if _, err := w.Write(buf); err != nil {
						in.abort(calls)
						return
					}
					buf = buf[:0]
				}
				if c.sent == 0 {
					c.started, started = true, true
					switch c.kind {
					case openai.KindChat:
						buf = c.appendChunk(buf, c.sent, true, "")
					case openai.KindResponse:
						buf = c.appendItemOpened(buf)
					}
				}
				finish := ""
				if p.done && c.sent == p.produced-1 {
					finish = c.job.finish
				}
				buf = c.appendChunk(buf, c.sent, false, finish)
				c.sent++
			}
		}
		switch {
		case done && calls[0].kind == openai.KindResponse:
			buf = calls[0].appendResponseEnd(buf, sum) // usage in its terminal event; no [DONE]
		case done:
			if calls[0].includeUsage {
				prompt := 0
				for _, c := range calls {
					if c.choice == 0 {
						prompt += c.promptTokens
					}
				}
				buf = calls[0].appendUsage(buf, prompt, sum)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				in.abort(calls)
				return
			}
			_ = rc.Flush()
			if started {
				in.firstWritten(calls)
			}
		}
		if done {
			return
		}
	}
}

// firstWritten records, for each call whose first token was just written, how late the write
// was.
func (in *Instance) firstWritten(calls []*call) {
	for _, c := range calls {
		if !c.started {
			continue
		}
		c.started = false
		c.job.mu.Lock()
		at := c.job.firstAt
		c.job.mu.Unlock()
		in.firstWriteDelay.Add(int64(time.Since(in.wallAt(at))))
		in.firstWrites.Add(1)
		if f := in.onFirst.Load(); f != nil {
			(*f)(c.rid, at-c.job.arrival)
		}
	}
}

// streamBufSize is the capacity of a stream's write buffer (about 60 chunks).
const streamBufSize = 16 << 10

func (in *Instance) getBuf() []byte {
	if b, ok := in.bufs.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, streamBufSize)
}

func (in *Instance) putBuf(b []byte) {
	if cap(b) == streamBufSize {
		in.bufs.Put(&b)
	}
}

// appendChunk appends one SSE chunk carrying output token i (or, with role, the assistant role
// chunk that opens a chat stream), with finish_reason when finish is set.
func (c *call) appendChunk(dst []byte, i int, role bool, finish string) []byte {
	if c.kind == openai.KindResponse {
		return c.appendDelta(dst, i) // the end is said by the events after the last token
	}
	dst = c.appendHead(dst)
	if c.kind == openai.KindChat {
		dst = append(dst, `"choices":[{"index":`...)
		dst = strconv.AppendInt(dst, int64(c.index), 10)
		dst = append(dst, `,"delta":{`...)
		if role {
			dst = append(dst, `"role":"assistant","content":""`...)
		} else {
			dst = append(dst, `"content":"`...)
			dst = append(dst, token(c.textBase, i)...)
			dst = append(dst, '"')
		}
		dst = append(dst, '}')
	} else {
		dst = append(dst, `"choices":[{"index":`...)
		dst = strconv.AppendInt(dst, int64(c.index), 10)
		dst = append(dst, `,"text":"`...)
		dst = append(dst, token(c.textBase, i)...)
		dst = append(dst, '"')
	}
	dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	if finish == "" {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendQuote(dst, finish)
	}
	return append(dst, "}]}\n\n"...)
}

func (c *call) appendHead(dst []byte) []byte {
	dst = append(dst, `data: {"id":"`...)
	dst = append(dst, c.id...)
	if c.kind == openai.KindChat {
		dst = append(dst, `","object":"chat.completion.chunk","created":`...)
	} else {
		dst = append(dst, `","object":"text_completion","created":`...)
	}
	dst = strconv.AppendInt(dst, c.created, 10)
	dst = append(dst, `,"model":`...)
	dst = append(dst, c.model...)
	return append(dst, ',')
}

// appendUsage appends the usage chunk of a response whose prompts hold promptTokens tokens in
// all, with p the produced and cached tokens summed over them.
func (c *call) appendUsage(dst []byte, promptTokens int, p progress) []byte {
	dst = c.appendHead(dst)
	dst = append(dst, `"choices":[],"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(promptTokens+p.produced), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.produced), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.cached), 10)
	return append(dst, "}}}\n\n"...)
}
