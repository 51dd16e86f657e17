package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/testlog"
)

func dnsConfig(t *testing.T) config.DNSDiscovery {
	t.Helper()
	c, err := config.Parse([]byte("discovery: {dns: [{name: vllm.inference.svc, port: 8000, endpoint: {models: [m], engine: vllm, labels: {pool: a}}}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	return c.Discovery.DNS[0]
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

func TestDNSResolve(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Family = config.FamilyAny
	d := &DNSSource{Config: cfg, Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
		if host != "vllm.inference.svc" {
			return nil, errors.New("unexpected name " + host)
		}
		// Unordered, a duplicate, an IPv4-mapped IPv6 form of the same address, and IPv6.
		return addrs("10.0.0.7", "fd00::2", "10.0.0.3", "10.0.0.7", "::ffff:10.0.0.3"), nil
	}}
	specs, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"http://10.0.0.3:8000", "http://10.0.0.7:8000", "http://[fd00::2]:8000"}
	if diff := cmp.Diff(want, specNames(specs)); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	for _, s := range specs {
		if s.Engine != "vllm" || !slices.Equal(s.Models, []string{"m"}) || s.Labels["pool"] != "a" || !s.CacheSalt {
			t.Errorf("%s: %+v; want the template's engine, models, labels and vllm's cache_salt default", s.Name, s)
		}
	}
	d.Lookup = func(context.Context, string) ([]netip.Addr, error) { return nil, nil }
	if _, err := d.Resolve(context.Background()); err == nil {
		t.Error("a name without addresses resolved to no endpoint without an error; want an error (the set in force stays)")
	}
}

// TestDNSRun: the set is emitted when it changes (not at start when the caller has it
// already), and a failed resolution keeps it.
func TestDNSRun(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(5 * time.Millisecond)
	var mu sync.Mutex
	answers := [][]netip.Addr{addrs("10.0.0.1"), addrs("10.0.0.1"), nil, addrs("10.0.0.1", "10.0.0.2"), addrs("10.0.0.2")}
	step := 0
	d := &DNSSource{Config: cfg}
	d.Lookup = func(context.Context, string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		i := min(step, len(answers)-1)
		step++
		if answers[i] == nil {
			return nil, errors.New("server misbehaving")
		}
		return answers[i], nil
	}
	var errs int
	d.OnError = func(error) { mu.Lock(); errs++; mu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	emitted := make(chan []string, 10)
	done := make(chan error, 1)
	have := []endpoint.Spec{{Name: "http://10.0.0.1:8000"}}
	go func() {
		done <- d.Run(ctx, have, func(s []endpoint.Spec) error { emitted <- specNames(s); return nil })
	}()
	var got [][]string
	for len(got) < 2 {
		select {
		case e := <-emitted:
			got = append(got, e)
		case <-time.After(5 * time.Second):
			t.Fatalf("emitted %v within 5 s; want two changes", got)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	want := [][]string{{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, {"http://10.0.0.2:8000"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sets emitted (-want +got):\n%s", diff)
	}
	mu.Lock()
	defer mu.Unlock()
	if errs != 1 {
		t.Errorf("%d failed resolutions reported, want 1", errs)
	}
}

func TestDNSConfigErrors(t *testing.T) {
	_, err := config.Parse([]byte(`discovery:
  dns:
    - {name: "vllm:8000", port: 0, scheme: ftp, interval: 100ms, endpoint: {url: "http://x:1", engine: nope}}
    - {name: a.b, port: 8000}
    - {name: a.b, port: 8000}
    - {name: c.d, port: 8000, family: ipv5, remove_after: -1, max_endpoints: -5}
    - {name: e.f, port: 8000, remove_after: 101}
  kubernetes:
    - {service: vllm, max_endpoints: -1}
`))
	if err == nil {
		t.Fatal("bad discovery.dns accepted")
	}
	for _, want := range []string{
		"discovery.dns[0].name", "discovery.dns[0].port", "discovery.dns[0].scheme", "discovery.dns[0].interval",
		"discovery.dns[0].endpoint.url", "discovery.dns[0].endpoint.engine", "discovery.dns[2]: http://a.b:8000 is listed twice",
		`discovery.dns[3].family: "ipv5": use auto`, "discovery.dns[3].remove_after: -1", "discovery.dns[3].max_endpoints: -5",
		"discovery.dns[4].remove_after: 101", "discovery.kubernetes[0].max_endpoints: -1",
	} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	c, err := config.Parse([]byte("discovery: {dns: [{name: vllm.local., port: 8000}, {name: v6.local, port: 8000, family: IPv6}]}\n"))
	if err != nil {
		t.Fatalf("a config with only discovery.dns: %v", err)
	}
	if n := c.Discovery.DNS[0]; n.Name != "vllm.local" || n.Scheme != "http" || n.Interval.D() != config.DefaultDNSInterval || n.Endpoint.Engine != config.DefaultEngine ||
		n.Family != config.FamilyAuto || n.RemoveAfter != 3 || n.MaxEndpoints != 1024 {
		t.Errorf("defaults: %+v", n)
	}
	if f := c.Discovery.DNS[1].Family; f != config.FamilyIPv6 {
		t.Errorf("family IPv6 read as %q", f)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// lookups is a LookupNet whose answers per network ("ip4", "ip6") the test sets, and which
// counts the lookups.
type lookups struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	errs    map[string]error
	asked   []string
	n       int
}

func (l *lookups) set(network string, a []netip.Addr, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.answers == nil {
		l.answers, l.errs = map[string][]netip.Addr{}, map[string]error{}
	}
	l.answers[network], l.errs[network] = a, err
}

func (l *lookups) lookup(_ context.Context, network, _ string) ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, network)
	if network == "ip4" {
		l.n++
	}
	if err := l.errs[network]; err != nil {
		return nil, err
	}
	if len(l.answers[network]) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: "vllm.inference.svc", IsNotFound: true}
	}
	return l.answers[network], nil
}

func (l *lookups) count() int { l.mu.Lock(); defer l.mu.Unlock(); return l.n }

var servfail = &net.DNSError{Err: "server misbehaving", Name: "vllm.inference.svc", IsTemporary: true}

// TestDNSResolve_Family: which addresses each family takes, and which lookups it makes. auto
// makes a dual-stack host one endpoint, and still finds an IPv6-only cluster's.
func TestDNSResolve_Family(t *testing.T) {
	v4, v6 := addrs("10.0.0.2", "10.0.0.1"), addrs("fd00::1", "::ffff:10.0.0.9")
	tests := []struct {
		family     string
		ip4, ip6   []netip.Addr
		want       []string
		wantLookup []string
	}{
		{config.FamilyAuto, v4, v6, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, []string{"ip4", "ip6"}},
		{config.FamilyAuto, nil, v6, []string{"http://[fd00::1]:8000"}, []string{"ip4", "ip6"}},
		{config.FamilyIPv4, v4, v6, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, []string{"ip4"}},
		{config.FamilyIPv6, v4, v6, []string{"http://[fd00::1]:8000"}, []string{"ip6"}},
		{config.FamilyAny, v4, v6, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::1]:8000"}, []string{"ip4", "ip6"}},
	}
	for _, tc := range tests {
		l := &lookups{}
		l.set("ip4", tc.ip4, nil)
		l.set("ip6", tc.ip6, nil)
		cfg := dnsConfig(t)
		cfg.Family = tc.family
		d := &DNSSource{Config: cfg, LookupNet: l.lookup}
		specs, err := d.Resolve(context.Background())
		if err != nil {
			t.Errorf("%s: %v", tc.family, err)
			continue
		}
		if diff := cmp.Diff(tc.want, specNames(specs)); diff != "" {
			t.Errorf("%s, ip4 %v: endpoints (-want +got):\n%s", tc.family, tc.ip4, diff)
		}
		slices.Sort(l.asked)
		if diff := cmp.Diff(tc.wantLookup, l.asked); diff != "" {
			t.Errorf("%s: lookups (-want +got):\n%s", tc.family, diff)
		}
	}
	// ipv4 on a name with AAAA records only says what to do.
	l := &lookups{}
	l.set("ip6", v6, nil)
	cfg := dnsConfig(t)
	cfg.Family = config.FamilyIPv4
	_, err := (&DNSSource{Config: cfg, LookupNet: l.lookup}).Resolve(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no address of family ipv4") {
		t.Errorf("ipv4 on an IPv6-only name: %v, want no address of family ipv4", err)
	}
}

// TestDNSResolve_LeavesOutUnusable: unspecified, multicast, broadcast, link-local addresses and
// those Exclude names never become endpoints, whatever the family.
func TestDNSResolve_LeavesOutUnusable(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Family = config.FamilyAny
	answer := addrs("0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "169.254.169.254",
		"fe80::1%eth0", "::ffff:0.0.0.0", "0.1.2.3", "10.0.0.1", "127.0.0.1", "fd00::1")
	d := &DNSSource{Config: cfg, Lookup: func(context.Context, string) ([]netip.Addr, error) { return answer, nil }}
	specs, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"http://10.0.0.1:8000", "http://127.0.0.1:8000", "http://[fd00::1]:8000"}
	if diff := cmp.Diff(want, specNames(specs)); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	d.Exclude = func(a netip.AddrPort) bool { return a == netip.MustParseAddrPort("127.0.0.1:8000") }
	specs, err = d.Resolve(context.Background())
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://[fd00::1]:8000"}, specNames(specs)); err != nil || diff != "" {
		t.Errorf("with the router's own address excluded (-want +got), err %v:\n%s", err, diff)
	}
	answer = addrs("169.254.169.254", "0.0.0.0")
	_, err = d.Resolve(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no usable address") || !strings.Contains(err.Error(), "169.254.169.254: link-local") {
		t.Errorf("only unusable addresses: %v, want an error naming them", err)
	}
}

// runDNS runs d from the set have until the test ends, and returns the sets it emits.
func runDNS(t *testing.T, d *DNSSource, have []string) <-chan []string {
	t.Helper()
	emitted := make(chan []string, 100)
	var last []endpoint.Spec
	for _, n := range have {
		last = append(last, endpoint.Spec{Name: n})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, last, func(s []endpoint.Spec) error { emitted <- specNames(s); return nil })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10 s of its context's end")
		}
	})
	return emitted
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// TestDNSRun_RandomSubsets: a server that answers a different few of the records each time
// (Consul, Route 53 multivalue) does not churn the set; an address leaves once remove_after
// answers in a row have lacked it.
func TestDNSRun_RandomSubsets(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	if cfg.RemoveAfter != 3 {
		t.Fatalf("remove_after defaults to %d, want 3", cfg.RemoveAfter)
	}
	answers := [][]netip.Addr{
		addrs("10.0.0.1", "10.0.0.2"), addrs("10.0.0.1", "10.0.0.3"), addrs("10.0.0.2", "10.0.0.3"),
		addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), nil, addrs("10.0.0.1"), addrs("10.0.0.1"), addrs("10.0.0.1"),
	}
	var mu sync.Mutex
	step := 0
	d := &DNSSource{Config: cfg, Lookup: func(context.Context, string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		a := answers[min(step, len(answers)-1)]
		step++
		if a == nil {
			return nil, errors.New("server misbehaving")
		}
		return a, nil
	}}
	emitted := runDNS(t, d, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"})
	var first []string
	select {
	case first = <-emitted:
	case <-time.After(10 * time.Second):
		t.Fatal("no set within 10 s")
	}
	mu.Lock()
	at := step
	mu.Unlock()
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, first); diff != "" {
		t.Errorf("first set emitted (-want +got):\n%s", diff)
	}
	// The set changes at the third answer with 10.0.0.1 alone (the eighth lookup), not before.
	if at < len(answers) {
		t.Errorf("the set changed after %d lookups, want %d (the subsets churned it)", at, len(answers))
	}
}

// TestDNSRun_PartialFailure: with family any, a SERVFAIL on AAAA alone keeps the IPv6
// endpoints in force (and says so), where it used to drop them; with auto, a failing A lookup
// does not switch a dual-stack name's endpoints to IPv6.
func TestDNSRun_PartialFailure(t *testing.T) {
	for _, tc := range []struct {
		family       string
		have         []string
		failing      string
		ip4, ip6     []netip.Addr
		wantReported string
	}{
		{config.FamilyAny, []string{"http://10.0.0.1:8000", "http://[fd00::1]:8000"}, "ip6", addrs("10.0.0.1"), nil, "AAAA (IPv6) lookup failed"},
		{config.FamilyAuto, []string{"http://10.0.0.1:8000"}, "ip4", nil, addrs("fd00::1"), "A (IPv4) lookup failed"},
	} {
		t.Run(tc.family, func(t *testing.T) {
			cfg := dnsConfig(t)
			cfg.Interval = config.Duration(time.Millisecond)
			cfg.Family = tc.family
			l := &lookups{}
			l.set("ip4", tc.ip4, nil)
			l.set("ip6", tc.ip6, nil)
			l.set(tc.failing, nil, servfail)
			var mu sync.Mutex
			var reported []string
			logs := &testlog.Buffer{}
			d := &DNSSource{Config: cfg, LookupNet: l.lookup, Log: slog.New(slog.NewTextHandler(logs, nil)), OnError: func(err error) {
				mu.Lock()
				reported = append(reported, err.Error())
				mu.Unlock()
			}}
			emitted := runDNS(t, d, tc.have)
			waitFor(t, "10 lookups", func() bool { return l.count() >= 10 })
			// Counted at every lookup, logged once while it fails.
			if n := logs.Count("lookup of one address family failed"); n != 1 {
				t.Errorf("the failing family was logged %d times in 10 lookups, want once", n)
			}
			select {
			case s := <-emitted:
				t.Errorf("a failing %s lookup changed the set to %v; want %v kept", tc.failing, s, tc.have)
			default:
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) == 0 || !strings.Contains(reported[0], tc.wantReported) || !strings.Contains(reported[0], "server misbehaving") {
				t.Errorf("reported %q, want %q with the server's error", reported, tc.wantReported)
			}
		})
	}
}

// TestDNSRun_UnusableSaidOnce: addresses left out are said when what is left out changes, not
// at every lookup.
func TestDNSRun_UnusableSaidOnce(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	cfg.Family = config.FamilyAny
	l := &lookups{}
	l.set("ip4", addrs("10.0.0.1", "169.254.169.254"), nil)
	l.set("ip6", addrs("ff02::1"), nil)
	var mu sync.Mutex
	var reported []string
	d := &DNSSource{Config: cfg, LookupNet: l.lookup, OnError: func(err error) {
		mu.Lock()
		reported = append(reported, err.Error())
		mu.Unlock()
	}}
	emitted := runDNS(t, d, nil)
	if diff := cmp.Diff([]string{"http://10.0.0.1:8000"}, <-emitted); diff != "" {
		t.Errorf("set (-want +got):\n%s", diff)
	}
	waitFor(t, "10 lookups", func() bool { return l.count() >= 10 })
	l.set("ip4", addrs("10.0.0.1", "0.0.0.0"), nil)
	waitFor(t, "10 more lookups", func() bool { return l.count() >= 20 })
	mu.Lock()
	defer mu.Unlock()
	if len(reported) != 2 {
		t.Fatalf("reported %d times: %q; want twice (each change of what is left out)", len(reported), reported)
	}
	for i, want := range []string{"169.254.169.254: link-local", "0.0.0.0: unspecified"} {
		if !strings.Contains(reported[i], want) {
			t.Errorf("report %d = %q, want it to name %q", i, reported[i], want)
		}
	}
	if !strings.Contains(reported[0], "ff02::1: a multicast address") {
		t.Errorf("report %q does not name ff02::1", reported[0])
	}
}

// TestDNSRun_MaxEndpoints: a set over max_endpoints is refused and said once, the set in force
// stays; a change logs counts and a bounded list, not the whole set.
func TestDNSRun_MaxEndpoints(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	cfg.RemoveAfter = 1
	cfg.MaxEndpoints = 500
	many := func(n int) []netip.Addr {
		out := make([]netip.Addr, n)
		for i := range out {
			out[i] = netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
		}
		return out
	}
	l := &lookups{}
	l.set("ip4", many(5000), nil)
	var mu sync.Mutex
	var reported []string
	logs := &testlog.Buffer{}
	d := &DNSSource{Config: cfg, LookupNet: l.lookup, Log: slog.New(slog.NewJSONHandler(logs, nil)), OnError: func(err error) {
		mu.Lock()
		reported = append(reported, err.Error())
		mu.Unlock()
	}}
	if _, err := d.Resolve(context.Background()); err == nil || !strings.Contains(err.Error(), "5000 addresses, more than max_endpoints (500)") {
		t.Errorf("Resolve of 5000 addresses: %v, want refused", err)
	}
	emitted := runDNS(t, d, []string{"http://10.0.0.1:8000"})
	waitFor(t, "10 lookups", func() bool { return l.count() >= 10 })
	select {
	case s := <-emitted:
		t.Fatalf("a set of %d endpoints was emitted over max_endpoints 500", len(s))
	default:
	}
	mu.Lock()
	if len(reported) != 1 || !strings.Contains(reported[0], "more than max_endpoints (500): the 1 endpoints in force stay") {
		t.Errorf("reported %q, want one refusal", reported)
	}
	mu.Unlock()
	l.set("ip4", many(400), nil)
	if s := <-emitted; len(s) != 400 {
		t.Errorf("%d endpoints emitted, want 400", len(s))
	}
	// The change is logged just after emit returns.
	var line string
	waitFor(t, "the change logged", func() bool {
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "endpoints found by DNS changed") {
				line = l
			}
		}
		return line != ""
	})
	if !strings.Contains(line, `"endpoints":400`) || !strings.Contains(line, "and 390 more") || !strings.Contains(line, `"removed":["http://10.0.0.1:8000"]`) || len(line) > 2000 {
		t.Errorf("change logged as %d bytes: %.600s; want counts and a bounded list", len(line), line)
	}
}

// TestDNSResolve_LookupIgnoresContext: a lookup that never returns costs one lookup timeout,
// not the router's discovery, and a second one is not started on top of it.
func TestDNSResolve_LookupIgnoresContext(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Second)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	d := &DNSSource{Config: cfg, Lookup: func(context.Context, string) ([]netip.Addr, error) {
		<-release
		return addrs("10.0.0.1"), nil
	}}
	for i, want := range []string{"no answer within 1s", "the previous lookup has not returned yet"} {
		start := time.Now()
		_, err := d.Resolve(context.Background())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Resolve %d: %v, want %q", i, err, want)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("Resolve %d took %v", i, el)
		}
	}
}

// TestResolveAll: names are resolved at the same time, so that one that hangs does not hold
// up the others.
func TestResolveAll(t *testing.T) {
	var started sync.WaitGroup
	started.Add(3)
	var sources []*DNSSource
	for i := range 3 {
		cfg := dnsConfig(t)
		cfg.Interval = config.Duration(2 * time.Second)
		sources = append(sources, &DNSSource{Config: cfg, LookupNet: func(ctx context.Context, network, _ string) ([]netip.Addr, error) {
			if network != "ip4" {
				return nil, nil
			}
			started.Done()
			// Each lookup answers once all three have started: one after another, the first
			// would wait for the others and time out.
			waited := make(chan struct{})
			go func() { started.Wait(); close(waited) }()
			select {
			case <-waited:
				return addrs(fmt.Sprintf("10.0.0.%d", i+1)), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}})
	}
	sets, errs := ResolveAll(context.Background(), sources)
	for i := range sources {
		if want := fmt.Sprintf("http://10.0.0.%d:8000", i+1); errs[i] != nil || len(sets[i]) != 1 || sets[i][0].Name != want {
			t.Errorf("source %d: %v, %v; want %s", i, specNames(sets[i]), errs[i], want)
		}
	}
}

// TestDNSRun_ReplacedFleetNearMax: every pod replaced at once (a Recreate rollout, a node
// drain) with max_endpoints near the fleet's size: the new addresses go in at the first answer,
// with as many of the old, held ones as fit, and the old ones leave after remove_after answers.
// Judged with the held ones, the answer was refused at every lookup and the dead set kept for
// good.
func TestDNSRun_ReplacedFleetNearMax(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	cfg.MaxEndpoints = 16
	gen := func(b byte) (addrs []netip.Addr, names []string) {
		for i := range 10 {
			a := netip.AddrFrom4([4]byte{10, b, 0, byte(i + 1)})
			addrs, names = append(addrs, a), append(names, "http://"+a.String()+":8000")
		}
		return addrs, names
	}
	l := &lookups{}
	old, oldNames := gen(1)
	l.set("ip4", old, nil)
	d := &DNSSource{Config: cfg, LookupNet: l.lookup}
	emitted := runDNS(t, d, oldNames)
	waitFor(t, "3 lookups", func() bool { return l.count() >= 3 })
	fresh, freshNames := gen(2)
	l.set("ip4", fresh, nil)
	var first []string
	select {
	case first = <-emitted:
	case <-time.After(10 * time.Second):
		t.Fatal("the new addresses never went in: the answer was refused with the old ones held")
	}
	if len(first) != 16 || !isSubset(freshNames, first) {
		t.Errorf("first set after the replacement: %d endpoints %v; want the 10 new and 6 of the old held", len(first), first)
	}
	var last []string
	for deadline := time.After(10 * time.Second); len(last) != 10; {
		select {
		case last = <-emitted:
		case <-deadline:
			t.Fatalf("the old addresses never left: last set %v", last)
		}
	}
	if !isSubset(freshNames, last) {
		t.Errorf("final set %v, want the 10 new addresses", last)
	}
}

func isSubset(want, got []string) bool {
	for _, w := range want {
		if !slices.Contains(got, w) {
			return false
		}
	}
	return true
}

// TestDNSRun_AutoKeepsIPv4: with family auto, an answer without A records does not double a
// dual-stack engine with its IPv6 address while its IPv4 one is held; a name whose A records
// stay gone for remove_after answers goes over to IPv6, its IPv4 endpoints gone by then.
func TestDNSRun_AutoKeepsIPv4(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	l := &lookups{}
	l.set("ip4", nil, nil) // no A record in this answer
	l.set("ip6", addrs("fd00::1"), nil)
	d := &DNSSource{Config: cfg, LookupNet: l.lookup}
	emitted := runDNS(t, d, []string{"http://10.0.0.1:8000"})
	var sets [][]string
	for deadline := time.After(10 * time.Second); len(sets) == 0 || !slices.Equal(sets[len(sets)-1], []string{"http://[fd00::1]:8000"}); {
		select {
		case s := <-emitted:
			sets = append(sets, s)
		case <-deadline:
			t.Fatalf("never went over to IPv6: sets %v", sets)
		}
	}
	for _, s := range sets {
		if len(s) > 1 {
			t.Errorf("sets emitted %v: an engine was two endpoints at once", sets)
		}
	}
	if l.count() < config.DefaultRemoveAfter {
		t.Errorf("went over to IPv6 after %d answers, want remove_after (%d)", l.count(), config.DefaultRemoveAfter)
	}
}

// script is a Lookup that gives its answers in turn (the last one again and again) and counts
// the lookups.
type script struct {
	mu      sync.Mutex
	answers [][]netip.Addr
	n       int
}

func (s *script) lookup(context.Context, string) ([]netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.answers[min(s.n, len(s.answers)-1)]
	s.n++
	return a, nil
}

func (s *script) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

// TestDNSRun_AutoBriefIPv4: with family auto, a name that answers only AAAA and whose A
// records show up for fewer than remove_after answers in a row keeps its IPv6 endpoints, and
// is never two endpoints per engine; A records that stay remove_after answers take it over to
// IPv4 in one step. It used to double every engine at the first A answer, then keep the IPv4
// endpoints alone, then go back to IPv6 as new endpoints.
func TestDNSRun_AutoBriefIPv4(t *testing.T) {
	cfg := dnsConfig(t)
	cfg.Interval = config.Duration(time.Millisecond)
	if cfg.RemoveAfter != 3 {
		t.Fatalf("remove_after defaults to %d, want 3", cfg.RemoveAfter)
	}
	six := addrs("fd00::1", "fd00::2")
	both := append(addrs("10.0.0.1", "10.0.0.2"), six...)
	have := []string{"http://[fd00::1]:8000", "http://[fd00::2]:8000"}

	t.Run("brief", func(t *testing.T) {
		// A records in one answer, then in two in a row: neither is remove_after answers.
		s := &script{answers: [][]netip.Addr{both, six, six, both, both, six}}
		emitted := runDNS(t, &DNSSource{Config: cfg, Lookup: s.lookup}, have)
		waitFor(t, "20 lookups", func() bool { return s.count() >= 20 })
		select {
		case got := <-emitted:
			t.Errorf("brief A records changed the set to %v; want %v kept", got, have)
		default:
		}
	})
	t.Run("lasting", func(t *testing.T) {
		s := &script{answers: [][]netip.Addr{both, six, both, both, both}}
		emitted := runDNS(t, &DNSSource{Config: cfg, Lookup: s.lookup}, have)
		var got []string
		select {
		case got = <-emitted:
		case <-time.After(10 * time.Second):
			t.Fatal("lasting A records never took the name over to IPv4")
		}
		at := s.count()
		if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, got); diff != "" {
			t.Errorf("first set emitted (-want +got):\n%s", diff)
		}
		// The fifth answer is the third in a row with A records.
		if at < 5 {
			t.Errorf("went over to IPv4 after %d answers, want 5 (remove_after in a row with A records)", at)
		}
		waitFor(t, "10 more lookups", func() bool { return s.count() >= at+10 })
		select {
		case got := <-emitted:
			t.Errorf("the set changed again, to %v", got)
		default:
		}
	})
}

// TestDNSRun_AutoNoAddressKeeps: with family auto, answers without any address (the name
// briefly gone) keep the endpoints in force, as with ipv4 or ipv6, rather than counting as
// answers that lack them: one endpoint used to leave after them.
func TestDNSRun_AutoNoAddressKeeps(t *testing.T) {
	for _, family := range []string{config.FamilyAuto, config.FamilyIPv4} {
		t.Run(family, func(t *testing.T) {
			cfg := dnsConfig(t)
			cfg.Interval = config.Duration(time.Millisecond)
			cfg.Family = family
			s := &script{answers: [][]netip.Addr{addrs("10.0.0.1"), nil}}
			var mu sync.Mutex
			var reported []string
			d := &DNSSource{Config: cfg, Lookup: s.lookup, OnError: func(err error) {
				mu.Lock()
				reported = append(reported, err.Error())
				mu.Unlock()
			}}
			emitted := runDNS(t, d, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"})
			waitFor(t, "10 lookups", func() bool { return s.count() >= 10 })
			select {
			case got := <-emitted:
				t.Errorf("answers without an address changed the set to %v; want it kept", got)
			default:
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reported) == 0 || !strings.Contains(reported[0], "no address") {
				t.Errorf("reported %q, want answers without an address reported", reported)
			}
		})
	}
}
