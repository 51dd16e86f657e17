package tenant

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
)

// middleware runs a gate the way the proxy does, for tests of the gate's decisions over HTTP:
// Authenticate (401 with WWW-Authenticate), Take with the router's token estimate of the
// parsed body's prompt and no completion reserved (429 with its headers), the handler, then the ticket's End with the final status
// and the tokens the handler reports in the X-Test-Prompt and X-Test-Completion response
// headers (without them, the estimate stands: prompt = estimate, completion 0). The handler
// finds the tenant with FromContext.
func middleware(g *Gate, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, oe := g.Authenticate(r.Header)
		if oe != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute"`)
			openai.WriteError(w, oe)
			return
		}
		body, _ := io.ReadAll(r.Body)
		est := 0
		if kind, ok := openai.KindForPath(r.URL.Path); ok {
			if req, err := openai.Parse(kind, body); err == nil {
				est = prefix.EstimateTokensBytes(req.AppendCanonical(nil))
			}
		}
		t, oe := g.Take(id, Demand{Prompt: est}, w.Header())
		if oe != nil {
			openai.WriteError(w, oe)
			return
		}
		out := r.WithContext(context.WithValue(r.Context(), idKey{}, id))
		if id != nil { // the key is the router's: the proxy forwards neither header
			out.Header = r.Header.Clone()
			out.Header.Del("Authorization")
			out.Header.Del("Api-Key")
		}
		out.Body = io.NopCloser(bytes.NewReader(body))
		sw := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(sw, out)
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		if r.Context().Err() != nil {
			status = 499
		}
		prompt, completion := est, 0
		if p := w.Header().Get("X-Test-Prompt"); p != "" {
			prompt, _ = strconv.Atoi(p)
			completion, _ = strconv.Atoi(w.Header().Get("X-Test-Completion"))
		}
		if t == nil {
			g.Count(id, status)
			return
		}
		t.End(status, prompt, completion)
	})
}

type idKey struct{}

// FromContext returns the tenant middleware authenticated, or nil.
func FromContext(ctx context.Context) *Identity {
	id, _ := ctx.Value(idKey{}).(*Identity)
	return id
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusRecorder) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// used makes the handler report the tokens the engines used for a request.
func used(w http.ResponseWriter, prompt, completion int) {
	w.Header().Set("X-Test-Prompt", strconv.Itoa(prompt))
	w.Header().Set("X-Test-Completion", strconv.Itoa(completion))
}
