package discovery

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/kvroute/kvroute/internal/config"
)

// dnsServer is a DNS server on a loopback port, with Go's own resolver pointed at it: the
// path the router takes, through the answers a real server gives. mode says how it answers.
func dnsServer(t *testing.T, mode *atomic.Value) NetLookupFunc {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, NotifyStartedFunc: func() { close(started) },
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(q)
			m.RecursionAvailable = true // as a resolver answers; without it Go reads an empty answer as a lame referral
			qt := q.Question[0].Qtype
			switch md := mode.Load().(string); {
			case md == "servfail" || (md == "aaaa-servfail" && qt == dns.TypeAAAA):
				m.Rcode = dns.RcodeServerFailure
			case md == "nxdomain":
				m.Rcode = dns.RcodeNameError
			case qt == dns.TypeA:
				for _, a := range []string{"10.0.0.1", "169.254.169.254"} {
					rr, _ := dns.NewRR("engines.test. 5 IN A " + a)
					m.Answer = append(m.Answer, rr)
				}
			case qt == dns.TypeAAAA && md != "v4-only":
				rr, _ := dns.NewRR("engines.test. 5 IN AAAA fd00::1")
				m.Answer = append(m.Answer, rr)
			}
			_ = w.WriteMsg(m)
		})}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.ActivateAndServe() })
	t.Cleanup(func() { _ = srv.Shutdown(); wg.Wait() })
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the DNS server did not start within 5 s")
	}
	addr := pc.LocalAddr().String()
	res := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
	return res.LookupNetIP
}

// TestDNSResolve_RealResolver: Go's resolver against a DNS server. A SERVFAIL on AAAA alone
// keeps the IPv6 endpoints of family any in force, where a lookup of both used to lose them
// silently; a name without AAAA records is an answer, not a failure.
func TestDNSResolve_RealResolver(t *testing.T) {
	var mode atomic.Value
	lookup := dnsServer(t, &mode)
	cfg := config.DNSDiscovery{Name: "engines.test", Port: 8000, Scheme: "http", Interval: config.Duration(time.Second)}
	for _, tc := range []struct {
		mode, family string
		want         []string
		err          string
		reported     string
	}{
		{"ok", config.FamilyAuto, []string{"http://10.0.0.1:8000"}, "", ""},
		{"ok", config.FamilyAny, []string{"http://10.0.0.1:8000", "http://[fd00::1]:8000"}, "", ""},
		{"ok", config.FamilyIPv6, []string{"http://[fd00::1]:8000"}, "", ""},
		{"v4-only", config.FamilyAny, []string{"http://10.0.0.1:8000"}, "", ""},
		{"aaaa-servfail", config.FamilyAny, []string{"http://10.0.0.1:8000"}, "", "AAAA (IPv6) lookup failed"},
		// auto with A records: AAAA does not count, and a server failing every AAAA query is
		// not news at every lookup.
		{"aaaa-servfail", config.FamilyAuto, []string{"http://10.0.0.1:8000"}, "", ""},
		{"servfail", config.FamilyAny, nil, "server misbehaving", ""},
		{"nxdomain", config.FamilyAuto, nil, "no address", ""},
	} {
		mode.Store(tc.mode)
		cfg.Family = tc.family
		var reported []string
		d := &DNSSource{Config: cfg, LookupNet: lookup, OnError: func(err error) { reported = append(reported, err.Error()) }}
		specs, err := d.Resolve(context.Background())
		what := tc.mode + " " + tc.family
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error with %q", what, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if diff := cmp.Diff(tc.want, specNames(specs)); diff != "" {
			t.Errorf("%s: endpoints (-want +got):\n%s", what, diff)
		}
		if tc.reported == "" && len(reported) > 0 || tc.reported != "" && (len(reported) != 1 || !strings.Contains(reported[0], tc.reported)) {
			t.Errorf("%s: reported %q, want %q", what, reported, tc.reported)
		}
	}
	// Run keeps the IPv6 endpoint through the SERVFAILs.
	mode.Store("aaaa-servfail")
	cfg.Family = config.FamilyAny
	cfg.Interval = config.Duration(time.Millisecond)
	var lookups atomic.Int32
	d := &DNSSource{Config: cfg, LookupNet: func(ctx context.Context, network, host string) ([]netip.Addr, error) {
		lookups.Add(1)
		return lookup(ctx, network, host)
	}}
	emitted := runDNS(t, d, []string{"http://10.0.0.1:8000", "http://[fd00::1]:8000"})
	waitFor(t, "10 lookups", func() bool { return lookups.Load() >= 10 })
	select {
	case s := <-emitted:
		t.Errorf("a SERVFAIL on AAAA changed the set to %v", s)
	default:
	}
}
