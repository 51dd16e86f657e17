package app

import (
	"math"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/h1"
)

// apiLimits are the API server's bounds on its clients, and the admin server's connection
// cap, with server:'s defaults resolved.
type apiLimits struct {
	maxConns int
	// connsFrom says where maxConns came from, for the log: "config", or the open-file limit.
	connsFrom   string
	pending     int64
	bodyStall   time.Duration
	memoryLimit int64 // GOMEMLIMIT; math.MaxInt64: none
	adminConns  int   // server.admin_max_connections
	// lingering and adminLingering bound the refused connections that linger at once at the
	// API and admin listeners (h1's MaxLingering): what the open files leave (lingerBudgets).
	lingering, adminLingering int
}

// maxConnsCeiling bounds the connection cap derived from the open-file limit: containers often
// allow a million files, and 16384 idle connections already take some 330 MB (20 KB each).
const maxConnsCeiling = 16384

// resolveLimits resolves server:'s limits for a process allowed nofile open files (0: unknown)
// whose Go memory limit is memLimit (math.MaxInt64: none).
func resolveLimits(cfg *config.Config, nofile uint64, memLimit int64) apiLimits {
	s := cfg.Server
	l := apiLimits{maxConns: s.MaxConnections, connsFrom: "config", pending: s.MaxPendingBodyBytes,
		bodyStall: s.BodyStall(), memoryLimit: memLimit, adminConns: s.AdminMaxConnections}
	if l.adminConns == 0 {
		l.adminConns = adminConnsFor(nofile)
	}
	if l.maxConns == 0 {
		l.maxConns = maxConnsFor(nofile)
		l.connsFrom = "RLIMIT_NOFILE " + strconv.FormatUint(nofile, 10)
		if nofile == 0 {
			l.connsFrom = "no open-file limit known"
		}
	}
	l.lingering, l.adminLingering = lingerBudgets(nofile, l.maxConns, l.adminConns)
	if l.pending == 0 {
		l.pending = config.DefaultMaxPendingBodyBytes
		if memLimit < math.MaxInt64 {
			l.pending = min(l.pending, memLimit/4)
		}
		l.pending = max(l.pending, cfg.Limits.MaxBodyBytes)
	}
	return l
}

// maxConnsFor is the default connection cap for nofile open files: a quarter of them (at most
// 256) kept for the listeners, the admin server's connections, the config and secret files,
// the engines' health checks and scrapes; half of the rest, because each client connection
// whose request is proxied holds an engine connection too; 1 to maxConnsCeiling. Unknown (0):
// the ceiling.
func maxConnsFor(nofile uint64) int {
	if nofile == 0 {
		return maxConnsCeiling
	}
	keep := min(nofile/4, 256)
	return int(min(max((nofile-keep)/2, 1), maxConnsCeiling))
}

// adminConnsFor is the default admin connection cap for nofile open files: a quarter of what
// maxConnsFor keeps aside from the API's connections, 4 to config.DefaultAdminMaxConnections
// (unknown, 0: that), so that a flood of admin connections leaves files for the rest (the
// API's accept, the engines' connections, the config and secret files). The admin listener
// was not bounded before: under a limit of 128 open files, 200 idle admin connections made
// the API listener's accept fail ("too many open files") until they closed.
func adminConnsFor(nofile uint64) int {
	if nofile == 0 {
		return config.DefaultAdminMaxConnections
	}
	keep := min(nofile/4, 256)
	return int(min(max(keep/4, 4), config.DefaultAdminMaxConnections))
}

// lingerBudgets are the refused connections that may linger at once (h1's MaxLingering, each
// an open file for up to two seconds) at the API listener and at the admin listener, for
// nofile open files and those caps: the files left once each of the API's connections has
// its engine connection, the admin's are counted and half of what maxConnsFor keeps aside
// stays for the rest (the listeners, the config and secret files, the engines' health checks
// and scrapes, the peers), three quarters of them to the API; -1: none (nothing left); 0: h1's
// own bound alone (the open-file limit unknown). Under a limit of 128 files, h1's 64 at each
// listener would have taken 128 files where 32 are kept aside (48 clients, 48 engine
// connections), and the engine dials and accepts would have failed (EMFILE); at the open-file
// limits of most hosts (Go raises the soft limit to the hard one, 2^19 or 2^20) the files
// left are many more than h1's 64 to 128.
func lingerBudgets(nofile uint64, maxConns, adminConns int) (api, admin int) {
	if nofile == 0 {
		return 0, 0
	}
	n := int64(min(nofile, 1<<40)) // unlimited is the largest value
	keep := min(n/4, 256)
	spare := min(n-keep/2-2*int64(maxConns)-int64(adminConns), 1<<20)
	noneIfZero := func(x int64) int {
		if x <= 0 {
			return -1
		}
		return int(x)
	}
	return noneIfZero(spare * 3 / 4), noneIfZero(spare - spare*3/4)
}

// goMemoryLimit is the Go runtime's memory limit (GOMEMLIMIT), math.MaxInt64 when none is set.
func goMemoryLimit() int64 { return debug.SetMemoryLimit(-1) }

// serverCollector exports the API server's connection, body and refusal counts (h1.Stats) as
// metrics.
type serverCollector struct {
	stats                                                          func() h1.Stats
	lim                                                            apiLimits
	conns, maxConns, dropped, body, maxBody, bodyRefused, refusals *prometheus.Desc
}

// refusalsHelp describes kvroute_server_request_refusals_total and its admin twin.
const refusalsHelp = " refused by the HTTP/1 server before the router saw them, so absent from kvroute_requests_total and the access log, by reason: " +
	"http2_preface (HTTP/2 with prior knowledge, answered with GOAWAY HTTP_1_1_REQUIRED), malformed (400: a request line or head that does not parse, more than 4 empty lines before it, a bad Host, framing that could smuggle a request; 501: an unknown transfer coding), " +
	"head_too_large (431), head_timeout (a head begun and not ended within server.read_header_timeout: closed), http_version (505), expectation (417, built-in server only), plain_http_on_tls (400, built-in server only). " +
	"Under the net/http server (the default), those net/http answers itself are counted on plain connections only."

// refusalsDesc is the description of the refusal counter named name.
func refusalsDesc(name, what string) *prometheus.Desc {
	return prometheus.NewDesc(name, what+refusalsHelp, []string{"reason"}, nil)
}

// collectRefusals sends the refusal counts of st, every reason's (at 0 before its first).
func collectRefusals(ch chan<- prometheus.Metric, d *prometheus.Desc, st h1.Stats) {
	for _, r := range h1.Refusals {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(st.Refused[r]), r.String())
	}
}

func newServerCollector(stats func() h1.Stats, lim apiLimits) *serverCollector {
	return &serverCollector{
		stats: stats, lim: lim,
		conns:    prometheus.NewDesc("kvroute_server_connections", "Open client connections of the API listener.", nil, nil),
		maxConns: prometheus.NewDesc("kvroute_server_max_connections", "The API listener's connection cap (server.max_connections, resolved).", nil, nil),
		dropped: prometheus.NewDesc("kvroute_server_connections_dropped_total",
			"Client connections dropped at the cap: reason idle_closed (a connection waiting for a request, closed to make room) or refused (a new one answered 503 because none waited).", []string{"reason"}, nil),
		body:    prometheus.NewDesc("kvroute_server_pending_body_bytes", "Bytes of the request bodies being received, counted against server.max_pending_body_bytes.", nil, nil),
		maxBody: prometheus.NewDesc("kvroute_server_max_pending_body_bytes", "server.max_pending_body_bytes, resolved.", nil, nil),
		bodyRefused: prometheus.NewDesc("kvroute_server_body_refusals_total",
			"Requests answered 503 because the request bodies being received held server.max_pending_body_bytes for a second.", nil, nil),
		refusals: refusalsDesc("kvroute_server_request_refusals_total", "Requests of the API listener"),
	}
}

func (c *serverCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.maxConns, c.dropped, c.body, c.maxBody, c.bodyRefused, c.refusals} {
		ch <- d
	}
}

// adminCollector exports the admin server's connection counts (h1.Stats) as metrics.
type adminCollector struct {
	stats                              func() h1.Stats
	max                                int
	conns, maxConns, dropped, refusals *prometheus.Desc
}

func newAdminCollector(stats func() h1.Stats, max int) *adminCollector {
	return &adminCollector{
		stats: stats, max: max,
		conns:    prometheus.NewDesc("kvroute_admin_connections", "Open client connections of the admin listener.", nil, nil),
		maxConns: prometheus.NewDesc("kvroute_admin_max_connections", "The admin listener's connection cap (server.admin_max_connections, resolved).", nil, nil),
		dropped: prometheus.NewDesc("kvroute_admin_connections_dropped_total",
			"Admin connections dropped at the cap: reason idle_closed (a connection waiting for a request, closed to make room) or refused (a new one answered 503 because none waited).", []string{"reason"}, nil),
		refusals: refusalsDesc("kvroute_admin_request_refusals_total", "Requests of the admin listener"),
	}
}

func (c *adminCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.maxConns, c.dropped, c.refusals} {
		ch <- d
	}
}

func (c *adminCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.Conns))
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(c.max))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.ConnsEvicted), "idle_closed")
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.ConnsRefused), "refused")
	collectRefusals(ch, c.refusals, st)
}

func (c *serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.stats()
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.Conns))
	ch <- prometheus.MustNewConstMetric(c.maxConns, prometheus.GaugeValue, float64(c.lim.maxConns))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.ConnsEvicted), "idle_closed")
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(st.ConnsRefused), "refused")
	ch <- prometheus.MustNewConstMetric(c.body, prometheus.GaugeValue, float64(st.BodyBytes))
	ch <- prometheus.MustNewConstMetric(c.maxBody, prometheus.GaugeValue, float64(c.lim.pending))
	ch <- prometheus.MustNewConstMetric(c.bodyRefused, prometheus.CounterValue, float64(st.BodiesRefused))
	collectRefusals(ch, c.refusals, st)
}
