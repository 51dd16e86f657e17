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
		f := in.faults.Load()
		if f.Refuse {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
				return
			}
			panic(http.ErrAbortHandler) // cannot hijack (HTTP/2): abort the stream instead
		}
		if f.FailRate > 0 && in.draw() < f.FailRate {
			st := f.status()
			typ := openai.TypeServer
			if st == http.StatusServiceUnavailable {
				typ = openai.TypeUnavailable
			}
			openai.WriteError(w, openai.NewError(st, typ, "", "", "simulated failure (fault injection)"))
			return
		}
		if !in.enter() {
			openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", "the server is shutting down"))
			return
		}
		defer in.reqs.Done()
		next.ServeHTTP(w, r)
	})
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
		openai.WriteError(w, openai.BadRequest("", "faults: %v (fields: unhealthy, refuse, fail_rate, fail_status, slow, cut_after)", err))
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

// call is one completion request as the handler sees it.
type call struct {
	kind         openai.Kind
	id           string // chatcmpl-... or cmpl-...
	rid          string // x-request-id
	created      int64
	model        []byte // JSON string
	promptTokens int
	includeUsage bool
	textBase     uint64
	job          *job
}

func (in *Instance) completion(kind openai.Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		recv := time.Now() // the pacing clock; timestamps come from Options.Now
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
		text := req.AppendCanonical(nil)
		c, oe := in.newCall(kind, req, text, recv)
		if oe != nil {
			openai.WriteError(w, oe)
			return
		}
		rid := r.Header.Get("X-Request-Id")
		if rid == "" {
			rid = c.id
		}
		c.rid = rid
		w.Header().Set("X-Request-Id", rid)
		if err := in.send(command{kind: cmdSubmit, job: c.job}); err != nil {
			openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", "the server is shutting down"))
			return
		}
		in.log.Debug("request", "id", rid, "prompt_tokens", c.promptTokens, "max_tokens", c.job.req.OutputTokens, "stream", req.Stream)
		if req.Stream {
			in.stream(w, r, c)
		} else {
			in.respond(w, r, c)
		}
	}
}

// newCall checks the request's lengths and builds its engine request.
func (in *Instance) newCall(kind openai.Kind, req *openai.Request, text []byte, recv time.Time) (*call, *openai.Error) {
	promptTokens := max(1, prefix.EstimateTokens(string(text)))
	maxTokens, finish := req.MaxTokens, "length"
	if maxTokens < 0 {
		return nil, openai.BadRequest("max_tokens", "max_tokens must be at least 1, got %d", maxTokens)
	}
	if maxTokens == 0 {
		maxTokens, finish = in.opts.DefaultMaxTokens, "stop"
	}
	// Compare each part first: the sum of two huge values could overflow.
	if promptTokens > in.opts.MaxModelLen || maxTokens > in.opts.MaxModelLen || promptTokens+maxTokens > in.opts.MaxModelLen {
		return nil, openai.BadRequest("max_tokens",
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			in.opts.MaxModelLen, promptTokens+maxTokens, promptTokens, maxTokens)
	}
	bs := in.cfg.BlockSize
	if need := (promptTokens + maxTokens - 1 + bs - 1) / bs; need > in.cfg.NumBlocks {
		return nil, openai.BadRequest("max_tokens",
			"the request needs %d KV blocks (%d prompt + %d output tokens) but the instance has %d: reduce the length of the messages or completion",
			need, promptTokens, maxTokens, in.cfg.NumBlocks)
	}
	keys := BlockKeys(make([]uint64, 0, len(text)/prefix.BlockBytes(bs)), text, bs)
	n := in.nextID.Add(1)
	base := textSeed(in.opts.Seed, text)
	idPrefix := "chatcmpl-"
	if kind == openai.KindCompletion {
		idPrefix = "cmpl-"
	}
	model, _ := json.Marshal(in.opts.Model)
	return &call{
		kind:         kind,
		id:           fmt.Sprintf("%s%016x%016x", idPrefix, prefix.Next(in.opts.Seed, n), base),
		created:      in.opts.Now().Unix(),
		model:        model,
		promptTokens: promptTokens,
		includeUsage: req.IncludeUsage,
		textBase:     base,
		job: &job{
			req: engine.Request{
				ID: "req-" + strconv.FormatUint(n, 10), PromptTokens: promptTokens, OutputTokens: maxTokens,
				BlockKeys: keys, Salt: req.CacheSalt,
			},
			arrival: in.modelAt(recv),
			predict: in.Predict(promptTokens, 0),
			notify:  make(chan struct{}, 1),
			firstAt: -1,
			finish:  finish,
			stream:  req.Stream,
		},
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

// wait blocks until the job changes, the client leaves or the instance closes. It returns
// false when the handler must stop (after asking the driver to abort the request).
func (in *Instance) wait(r *http.Request, c *call) bool {
	select {
	case <-c.job.notify:
		return true
	case <-r.Context().Done():
		in.abort(c)
		return false
	case <-in.closing:
		return false
	}
}

func (in *Instance) abort(c *call) {
	_ = in.send(command{kind: cmdAbort, job: c.job}) // fails only when closing: the driver stops anyway
}

// cut aborts the request and the connection, as a crashing server would.
func (in *Instance) cut(c *call) {
	in.abort(c)
	panic(http.ErrAbortHandler)
}

func (in *Instance) respond(w http.ResponseWriter, r *http.Request, c *call) {
	for {
		if !in.wait(r, c) {
			return
		}
		p := c.job.progress()
		if p.err != nil {
			openai.WriteError(w, openai.NewError(http.StatusServiceUnavailable, openai.TypeUnavailable, "", "", p.err.Error()))
			return
		}
		if cut := in.faults.Load().CutAfter; cut > 0 && p.produced >= cut {
			in.cut(c)
		}
		if !p.done {
			continue
		}
		text := string(appendText(nil, c.textBase, 0, p.produced))
		usage := openai.Usage{
			PromptTokens: c.promptTokens, CompletionTokens: p.produced, TotalTokens: c.promptTokens + p.produced,
			PromptTokensDetails: &openai.TokenDetails{CachedTokens: p.cached},
		}
		choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": c.job.finish, "stop_reason": nil}
		object := "text_completion"
		if c.kind == openai.KindChat {
			object = "chat.completion"
			choice["message"] = map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}, "reasoning_content": nil}
		} else {
			choice["text"] = text
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": c.id, "object": object, "created": c.created, "model": json.RawMessage(c.model),
			"choices": []any{choice}, "usage": usage,
		})
		return
	}
}

func (in *Instance) stream(w http.ResponseWriter, r *http.Request, c *call) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	var (
		buf   = in.getBuf()
		sent  int
		first = true
	)
	defer func() { in.putBuf(buf) }()
	for {
		// The driver wakes the handler at the first token, at the end and, in between, at
		// most once per StreamInterval: each wake-up writes every token produced so far.
		if !in.wait(r, c) {
			return
		}
		p := c.job.progress()
		if p.err != nil {
			in.cut(c)
		}
		cut := in.faults.Load().CutAfter
		buf = buf[:0]
		for sent < p.produced {
			if cut > 0 && sent >= cut {
				_, _ = w.Write(buf)
				_ = rc.Flush()
				in.cut(c)
			}
			if len(buf) > streamBufSize-1024 {
				// Bound the buffer: a stream that fell far behind goes out in several writes.
				if _, err := w.Write(buf); err != nil {
					in.abort(c)
					return
				}
				buf = buf[:0]
			}
			if sent == 0 && c.kind == openai.KindChat {
				buf = c.appendChunk(buf, sent, true, "")
			}
			finish := ""
			if p.done && sent == p.produced-1 {
				finish = c.job.finish
			}
			buf = c.appendChunk(buf, sent, false, finish)
			sent++
		}
		if p.done {
			if c.includeUsage {
				buf = c.appendUsage(buf, p)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) > 0 {
			if _, err := w.Write(buf); err != nil {
				in.abort(c)
				return
			}
			_ = rc.Flush()
			if first {
				first = false
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
		if p.done {
			return
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
	dst = c.appendHead(dst)
	if c.kind == openai.KindChat {
		dst = append(dst, `"choices":[{"index":0,"delta":{`...)
		if role {
			dst = append(dst, `"role":"assistant","content":""`...)
		} else {
			dst = append(dst, `"content":"`...)
			dst = append(dst, token(c.textBase, i)...)
			dst = append(dst, '"')
		}
		dst = append(dst, '}')
	} else {
		dst = append(dst, `"choices":[{"index":0,"text":"`...)
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

func (c *call) appendUsage(dst []byte, p progress) []byte {
	dst = c.appendHead(dst)
	dst = append(dst, `"choices":[],"usage":{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.promptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(c.promptTokens+p.produced), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.produced), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(p.cached), 10)
	return append(dst, "}}}\n\n"...)
}
