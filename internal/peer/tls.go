package peer

import (
	"crypto/tls"
	"crypto/x509"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// MutualTLS returns the TLS configs of a replica's event stream server and of its client for
// mutual verification (Config.ServerTLS and ClientTLS): the server requires a certificate of
// every replica that connects and verifies it against roots; the client verifies the server's
// against roots and serverName ("": the address dialled). Both present cert's certificate, asked
// at each handshake (so that a renewed one is taken up). Requests are still signed with the
// shared secret on top.
func MutualTLS(cert func() (*tls.Certificate, error), roots *x509.CertPool, serverName string) (server, client *tls.Config) {
	// Both ends are kvroute: no older version to speak to.
	server = &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert() },
		ClientAuth:     tls.RequireAndVerifyClientCert, ClientCAs: roots,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13, NextProtos: []string{"http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert() },
		RootCAs:              roots, ServerName: serverName,
	}
	return server, client
}

// scheme is the event stream's URL scheme: https with ClientTLS.
func (n *Node) scheme() string {
	if n.cfg.ClientTLS != nil {
		return "https"
	}
	return "http"
}

// The reasons of kvroute_peer_dropped_total for a connection to the stream server refused in
// its TLS handshake.
const (
	dropTLSNoCert  = "tls_no_certificate"  // the client sent no certificate
	dropTLSBadCert = "tls_bad_certificate" // its certificate did not verify against ca_file
	dropTLSOther   = "tls_handshake"       // any other failure: cleartext, garbage, the client refusing ours
)

// handshakeLogEvery is how often a refused handshake is logged per remote host: a scanner or a
// misconfigured replica retrying in a loop is counted every time, logged once a minute.
const handshakeLogEvery = time.Minute

// maxHandshakeHosts bounds the hosts whose last log time is kept: beyond it, refusals from new
// hosts are counted but not logged until old entries expire.
const maxHandshakeHosts = 4096

// maxNewHosts bounds the hosts logged for the first time per handshakeLogEvery: a sender
// that forges its address (UDP gossip) shows as a new host at every packet, and 100 a second
// made 3,797 lines a minute with the per-host limit alone. Beyond it, lines are counted and
// said as a number on the next line logged (hostLimiter.due's others).
const maxNewHosts = 10

// maxHostLines bounds the lines logged per handshakeLogEvery about all hosts together, so
// that the bound holds whatever addresses a sender forges: one cycling over 1,000 had each host
// logged kept, and logged again every minute, 10 more of them each minute (555 lines a minute
// in the sixth 10 minutes). Within it, beyond maxNewHosts, a host seen again after being left
// unlogged is logged: a forged address is seldom seen twice, a replica failing every second
// is, and one that began failing during a flood of forged senders was never logged, the new
// hosts' places taken in the first second of each minute. A known host whose line is due
// beyond the bound is logged in a later window, with its count.
const maxHostLines = 2 * maxNewHosts

// hostForget is how long a host's entry is kept since it was last seen: a host that keeps
// failing (a replica with another secret, retrying every second) keeps its entry, and so its
// line once a minute, whatever number of strangers come and go.
const hostForget = 10 * handshakeLogEvery

// serverLog is the stream server's error log. net/http reports a failed TLS handshake only
// there ("http: TLS handshake error from ADDR: REASON"; the stream handler never sees the
// connection), so its lines are read back: each such line is counted in
// kvroute_peer_dropped_total by reason and logged at warn level at most once per remote host per
// handshakeLogEvery, within the bounds on all hosts (hostLimiter), with the refusals from that
// host left unlogged since. Other lines are logged at debug level, as before.
type serverLog struct {
	log     *slog.Logger
	dropped *prometheus.CounterVec
	limit   hostLimiter
}

// hostLimiter says when a line about one remote host is due: at most once per
// handshakeLogEvery per host, counting the lines not logged since, and at most maxHostLines
// per handshakeLogEvery in all, of which at most maxNewHosts about hosts not seen before. It
// keeps at most maxHandshakeHosts hosts logged (a stranger can send from many), each for
// hostForget since it was last seen, and as many more left unlogged (two generations, the
// older dropped when the newer fills); a host beyond the bounds is not logged, only counted.
// The zero value is ready, on time.Now.
type hostLimiter struct {
	now func() time.Time // nil: time.Now

	mu     sync.Mutex
	hosts  map[string]*hostRefusals
	lastGC time.Time
	// window is when the current handshakeLogEvery began, lines how many lines were logged in
	// it and newHosts how many of them were about hosts not seen before; others counts the
	// lines about hosts not in hosts, left unlogged for the bounds since the last line logged.
	window   time.Time
	lines    int
	newHosts int
	others   int
	// unlogged and unloggedOld are the hosts left unlogged lately for the bounds, each
	// generation at most maxHandshakeHosts/2: one found there is seen again.
	unlogged, unloggedOld map[string]struct{}
}

type hostRefusals struct {
	logged  time.Time // when a line about the host was last logged
	seen    time.Time // when the host was last seen
	skipped int       // lines not logged since
}

func newServerLog(l *slog.Logger, dropped *prometheus.CounterVec, now func() time.Time) *serverLog {
	return &serverLog{log: l, dropped: dropped, limit: hostLimiter{now: now}}
}

// errorLog returns the *log.Logger that http.Server.ErrorLog takes.
func (w *serverLog) errorLog() *log.Logger { return log.New(w, "", 0) }

const handshakePrefix = "http: TLS handshake error from "

func (w *serverLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	rest, ok := strings.CutPrefix(line, handshakePrefix)
	if !ok {
		w.log.Debug(line)
		return len(p), nil
	}
	addr, why, _ := strings.Cut(rest, ": ")
	reason := handshakeReason(why)
	w.dropped.WithLabelValues(reason).Inc()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if skipped, others, ok := w.limit.due(host); ok {
		w.log.Warn("refused a peer connection's TLS handshake", withOthers([]any{"remote", addr, "reason", reason, "err", why,
			"refused_unlogged", skipped}, others)...)
	}
	return len(p), nil
}

// handshakeReason sorts a failed handshake by the error net/http logged (crypto/tls's texts:
// TestTLSRefusesStrangers checks them against the Go in use).
func handshakeReason(err string) string {
	switch {
	case strings.Contains(err, "didn't provide a certificate"):
		return dropTLSNoCert
	case strings.HasPrefix(err, "tls: failed to verify certificate"):
		return dropTLSBadCert
	}
	return dropTLSOther
}

// withOthers adds to a line's attributes the count of lines about other hosts left unlogged
// (hostLimiter.due's others), where there were any.
func withOthers(args []any, others int) []any {
	if others > 0 {
		args = append(args, "other_hosts_unlogged", others)
	}
	return args
}

// due reports whether a line about host is to be logged now, how many about it were not
// logged since the last that was (skipped), and how many about other hosts were not logged,
// for the bounds on hosts, since the last line logged (others).
func (w *hostLimiter) due(host string) (skipped, others int, ok bool) {
	now := time.Now()
	if w.now != nil {
		now = w.now()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hosts == nil {
		w.hosts = map[string]*hostRefusals{}
	}
	if now.Sub(w.window) >= handshakeLogEvery {
		w.window, w.lines, w.newHosts = now, 0, 0
	}
	if h := w.hosts[host]; h != nil {
		h.seen = now
		if now.Sub(h.logged) < handshakeLogEvery || w.lines >= maxHostLines {
			h.skipped++
			return 0, 0, false
		}
		w.lines++
		skipped, others = h.skipped, w.others
		h.logged, h.skipped, w.others = now, 0, 0
		return skipped, others, true
	}
	if len(w.hosts) >= maxHandshakeHosts/2 && now.Sub(w.lastGC) >= handshakeLogEvery/4 {
		w.lastGC = now
		for k, h := range w.hosts {
			if now.Sub(h.seen) >= hostForget {
				delete(w.hosts, k)
			}
		}
	}
	_, again := w.unlogged[host]
	if _, ok := w.unloggedOld[host]; ok {
		again = true
	}
	if len(w.hosts) < maxHandshakeHosts && w.lines < maxHostLines && (again || w.newHosts < maxNewHosts) {
		if again {
			delete(w.unlogged, host)
			delete(w.unloggedOld, host)
		} else {
			w.newHosts++
		}
		w.lines++
		w.hosts[host] = &hostRefusals{logged: now, seen: now}
		others, w.others = w.others, 0
		return 0, others, true
	}
	if w.unlogged == nil || len(w.unlogged) >= maxHandshakeHosts/2 {
		w.unloggedOld, w.unlogged = w.unlogged, map[string]struct{}{}
	}
	w.unlogged[host] = struct{}{}
	w.others++
	return 0, 0, false
}
