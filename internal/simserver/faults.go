package simserver

import (
	"bytes"
	"io"
	"net/http"

	"github.com/kvroute/kvroute/internal/openai"
)

// faultNames are the label values of kvroute_sim_faults_total, one per fault that acts on a
// request: how often each struck.
var faultNames = []string{"refuse", "fail_rate", "cut_after", "hang", "drop_on"}

// drop closes the request's connection without an answer, as a crashed server would.
func drop(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
		return
	}
	panic(http.ErrAbortHandler) // cannot hijack (HTTP/2): abort the stream instead
}

// dropOn reads the body of a request to an instance with the drop_on fault. A body that
// contains the fault's text drops the connection (and, with drop_all, every request in
// flight): it reports false and the request is over. Otherwise the body is put back for the
// handler and it reports true.
func (in *Instance) dropOn(w http.ResponseWriter, r *http.Request, f *Faults) bool {
	body, err := readBody(w, r)
	if err != nil {
		openai.WriteError(w, openai.BadRequest("", "read body: %v", err))
		return false
	}
	if bytes.Contains(body, []byte(f.DropOn)) {
		in.met.fault("drop_on")
		in.log.Info("dropping the connection of a request that contains drop_on", "id", r.Header.Get("X-Request-Id"), "drop_all", f.DropAll)
		if f.DropAll {
			in.crash()
		}
		drop(w)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return true
}

// crash drops every API request in flight: each notices it at its next wait (or at once, when
// it is waiting).
func (in *Instance) crash() {
	in.crashes.Add(1) // before the close: a request that sees the new channel sees the count
	next := make(chan struct{})
	close(*in.crashed.Swap(&next))
}

// hang holds a request of a hanging instance, without an answer, until the client leaves or
// the instance closes (false: the request is over) or the fault is cleared (true: it runs as
// usual). A crash since gen drops its connection.
func (in *Instance) hang(r *http.Request, gen uint64) bool {
	in.met.fault("hang")
	for {
		set, crashed := *in.faultsSet.Load(), *in.crashed.Load() // before the reads they guard
		if in.crashes.Load() != gen {
			panic(http.ErrAbortHandler)
		}
		if !in.faults.Load().Hang {
			return true
		}
		select {
		case <-set:
		case <-crashed:
		case <-r.Context().Done():
			return false
		case <-in.closing:
			return false
		}
	}
}
