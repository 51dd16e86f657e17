package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/testcert"
)

// tlsOf returns a Config tweak that gives a replica the certificate name (signed by ca) and
// mutual TLS against ca, checking the server's name serverName.
func tlsOf(t *testing.T, ca *testcert.CA, name, serverName string) func(*Config) {
	t.Helper()
	certFile, keyFile := ca.Issue(name, "kvroute-peers")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	roots, err := config.CertPool(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	return func(c *Config) {
		c.ServerTLS, c.ClientTLS = MutualTLS(func() (*tls.Certificate, error) { return &cert, nil }, roots, serverName)
	}
}

// TestNodesOverTLS: replicas with mutual TLS follow each other, take a snapshot and share
// events as in cleartext; one checks its peers' addresses (127.0.0.1 in their certificates),
// the other a server name.
func TestNodesOverTLS(t *testing.T) {
	ca := testcert.NewCA(t, "peers")
	a := startReplica(t, "a", nil, tlsOf(t, ca, "a", ""))
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, tlsOf(t, ca, "b", "kvroute-peers"))
	waitFor(t, 10*time.Second, "a and b following each other over TLS", func() bool {
		return isFollowing(a, "b")() && isFollowing(b, "a")() && b.node.Ready()
	})
	if got := testutil.ToFloat64(b.m.WarmStarts.WithLabelValues("ok")); got != 1 {
		t.Errorf("b's warm start over TLS: ok %v, want 1", got)
	}
	waitFor(t, 5*time.Second, "a's stream to b", func() bool { return testutil.ToFloat64(b.m.Streams) == 1 })
	c := a.call(seqKeys(1, 40)...)
	ep := c.Endpoint().Name
	waitFor(t, 5*time.Second, "b counting a's request", func() bool { return b.ep(ep).InFlight() == 1 })
	c.FirstToken()
	c.Finish(route.Outcome{OK: true, CachedTokens: -1})
	waitFor(t, 5*time.Second, "b seeing its end", func() bool { return b.ep(ep).InFlight() == 0 })
}

// TestTLSRefusesStrangers: a replica with mutual TLS serves nothing to a client without a
// certificate, with one from another CA, or in cleartext, and a client that trusts another CA
// does not accept its certificate; a client with a replica's certificate still needs the
// secret's signature.
func TestTLSRefusesStrangers(t *testing.T) {
	ca, other := testcert.NewCA(t, "peers"), testcert.NewCA(t, "other")
	r := startReplica(t, "r", nil, tlsOf(t, ca, "r", ""))
	addr := r.node.Addr().String()
	good := &Node{cfg: Config{Name: "friend", Incarnation: 1}}
	good.keys.Store(newKeySet(secret, nil))
	signed := func(scheme string) *http.Request {
		q, _, err := good.newRequest(context.Background(), peerInfo{name: "r", feed: addr}, pathSnapshot, good.keys.Load().sign)
		if err != nil {
			t.Fatal(err)
		}
		q.URL.Scheme = scheme
		return q
	}
	client := func(tweak func(*Config)) *http.Client {
		var c Config
		if tweak != nil {
			tweak(&c)
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c.ClientTLS}}
	}
	noCert := func(c *Config) {
		tlsOf(t, ca, "anonymous", "")(c)
		c.ClientTLS.GetClientCertificate = nil
	}
	for _, tc := range []struct {
		name   string
		client *http.Client
		req    *http.Request
		want   string // in the error, or the status
	}{
		{"cleartext", client(nil), signed("http"), "400 Bad Request"},
		{"no client certificate", client(noCert), signed("https"), "certificate required"},
		{"a certificate of another CA", client(func(c *Config) {
			tlsOf(t, other, "mallory", "")(c)
			c.ClientTLS.RootCAs, _ = config.CertPool(ca.File)
		}), signed("https"), "unknown certificate authority"},
		{"trusting another CA", client(func(c *Config) {
			tlsOf(t, ca, "friend", "")(c)
			c.ClientTLS.RootCAs, _ = config.CertPool(other.File)
		}), signed("https"), "certificate signed by unknown authority"},
		{"the wrong server name", client(tlsOf(t, ca, "friend", "elsewhere")), signed("https"), "not elsewhere"},
		{"a replica's certificate, unsigned", client(tlsOf(t, ca, "friend", "")), func() *http.Request {
			q := signed("https")
			q.Header.Del(authHeader)
			return q
		}(), "403 Forbidden"},
		{"a replica's certificate, signed", client(tlsOf(t, ca, "friend", "")), signed("https"), "200 OK"},
	} {
		got := ""
		resp, err := tc.client.Do(tc.req)
		if err != nil {
			got = err.Error()
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			got = resp.Status
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	// Each refused handshake is counted by its reason: the server counts after its side of the
	// handshake ends, which may be after the client's error.
	want := map[string]float64{"tls_no_certificate": 1, "tls_bad_certificate": 1,
		"tls_handshake": 3} // cleartext, and the two clients that refused the server's certificate
	got := map[string]float64{}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		for reason := range want {
			got[reason] = testutil.ToFloat64(r.m.Dropped.WithLabelValues(reason))
		}
		if maps.Equal(got, want) || time.Now().After(end) {
			break
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("refused handshakes counted in kvroute_peer_dropped_total (-want +got):\n%s", diff)
	}
}

// TestRefusedHandshakesLogged: refused handshakes are all counted, and logged at most once per
// remote host per minute, the next line saying how many were not; the server's other lines go
// to the debug level.
func TestRefusedHandshakesLogged(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	m := metrics.NewPeers(prometheus.NewRegistry())
	now := time.Unix(1000, 0)
	w := newServerLog(l, m.Dropped, func() time.Time { return now }).errorLog()
	for _, step := range []struct {
		after time.Duration
		line  string
	}{
		{0, "http: TLS handshake error from 10.0.0.1:4000: tls: client didn't provide a certificate"},
		{time.Second, "http: TLS handshake error from 10.0.0.1:4001: tls: failed to verify certificate: x509: certificate signed by unknown authority"},
		{time.Second, "http: TLS handshake error from 10.0.0.2:5000: EOF"},
		{time.Second, "http: TLS handshake error from 10.0.0.1:4002: client sent an HTTP request to an HTTPS server"},
		{time.Second, "http: superfluous response.WriteHeader call"},
		{time.Minute, "http: TLS handshake error from 10.0.0.1:4003: tls: client didn't provide a certificate"},
		{time.Second, "http: TLS handshake error from [::1]:6000: remote error: tls: bad certificate"},
	} {
		now = now.Add(step.after)
		w.Print(step.line)
	}
	wantLog := `level=WARN msg="refused a peer connection's TLS handshake" remote=10.0.0.1:4000 reason=tls_no_certificate err="tls: client didn't provide a certificate" refused_unlogged=0
level=WARN msg="refused a peer connection's TLS handshake" remote=10.0.0.2:5000 reason=tls_handshake err=EOF refused_unlogged=0
level=DEBUG msg="http: superfluous response.WriteHeader call"
level=WARN msg="refused a peer connection's TLS handshake" remote=10.0.0.1:4003 reason=tls_no_certificate err="tls: client didn't provide a certificate" refused_unlogged=2
level=WARN msg="refused a peer connection's TLS handshake" remote=[::1]:6000 reason=tls_handshake err="remote error: tls: bad certificate" refused_unlogged=0
`
	if diff := cmp.Diff(wantLog, buf.String()); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
	wantCount := map[string]float64{"tls_no_certificate": 2, "tls_bad_certificate": 1, "tls_handshake": 3}
	gotCount := map[string]float64{}
	for reason := range wantCount {
		gotCount[reason] = testutil.ToFloat64(m.Dropped.WithLabelValues(reason))
	}
	if diff := cmp.Diff(wantCount, gotCount); diff != "" {
		t.Errorf("kvroute_peer_dropped_total (-want +got):\n%s", diff)
	}
}
