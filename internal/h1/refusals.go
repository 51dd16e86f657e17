package h1

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
)

// Refusal is why a server refused a request before any handler saw it: the router's metrics
// and access log never hear of such a request, so the server counts it (Stats.Refused) and
// logs it at DEBUG (Server.Logger, NetHTTP.Logger). A connection refused at MaxConns is
// counted apart (Stats.ConnsRefused).
type Refusal uint8

// Refusals.
const (
	// RefusedHTTP2: the connection opened with HTTP/2's client preface (h2c with prior
	// knowledge) and no HTTP/2 server took it: answered with a GOAWAY (HTTP_1_1_REQUIRED).
	RefusedHTTP2 Refusal = iota
	// RefusedMalformed: a 400 (or net/http's 501 for a transfer coding it does not serve): a
	// request line or head that does not parse, more than 4 empty lines before the request
	// line, a missing or malformed Host, framing that could smuggle a request.
	RefusedMalformed
	// RefusedHeadTooLarge: a 431, the head past MaxHeaderBytes.
	RefusedHeadTooLarge
	// RefusedHeadTimeout: a head begun and not ended within ReadHeaderTimeout: the connection
	// closed without an answer. A connection that sent nothing is not counted.
	RefusedHeadTimeout
	// RefusedVersion: a 505, a request of another HTTP version than 1.0 and 1.1.
	RefusedVersion
	// RefusedExpectation: a 417, an Expect header other than 100-continue (Server's alone:
	// net/http answers it through the handler's writer, which is not watched).
	RefusedExpectation
	// RefusedPlainHTTP: a 400, plain HTTP sent to a TLS listener (Server's alone).
	RefusedPlainHTTP

	// NumRefusals is the number of reasons: the length of Stats.Refused.
	NumRefusals = iota
)

// Refusals lists every reason, in order.
var Refusals = []Refusal{RefusedHTTP2, RefusedMalformed, RefusedHeadTooLarge, RefusedHeadTimeout, RefusedVersion,
	RefusedExpectation, RefusedPlainHTTP}

var refusalNames = [NumRefusals]string{"http2_preface", "malformed", "head_too_large", "head_timeout", "http_version",
	"expectation", "plain_http_on_tls"}

// String returns the reason's name, a metric label value.
func (r Refusal) String() string {
	if int(r) < len(refusalNames) {
		return refusalNames[r]
	}
	return "unknown"
}

// refusalCount counts a server's refusals by reason and logs each at DEBUG: an atomic add
// when one happens, nothing on a request that is served.
type refusalCount struct {
	n [NumRefusals]atomic.Uint64
}

// add counts a refusal of a request from remote, and logs it with detail (what was wrong)
// where log takes DEBUG lines.
func (r *refusalCount) add(log *slog.Logger, why Refusal, remote, detail string) {
	r.n[why].Add(1)
	if log != nil && log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("HTTP/1 server refused a request before any handler saw it", "reason", why.String(),
			"remote_addr", remote, "detail", detail)
	}
}

// load returns the counts.
func (r *refusalCount) load() (out [NumRefusals]uint64) {
	for i := range out {
		out[i] = r.n[i].Load()
	}
	return out
}

// netHTTPErrorHeaders follow the status line of the answers net/http's server writes itself to
// a request it cannot read (conn.serve): no Date, and Connection after Content-Type, which
// the answers it writes for a handler, their fields sorted, never have.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// netHTTPRefusal reports whether p, a write of net/http's server to a connection, is such an
// answer of its own, and for which reason (400 and 501: malformed; 431; 505), with its status
// line.
func netHTTPRefusal(p []byte) (Refusal, string, bool) {
	const proto = "HTTP/1.1 "
	if len(p) < len(proto)+3 || string(p[:len(proto)]) != proto {
		return 0, "", false
	}
	end := bytes.Index(p, []byte("\r\n"))
	if end < 0 || !bytes.HasPrefix(p[end:], []byte(netHTTPErrorHeaders)) {
		return 0, "", false
	}
	line := string(p[len(proto):end])
	switch line[:3] {
	case "400", "501":
		return RefusedMalformed, line, true
	case "431":
		return RefusedHeadTooLarge, line, true
	case "505":
		return RefusedVersion, line, true
	}
	return 0, "", false
}
