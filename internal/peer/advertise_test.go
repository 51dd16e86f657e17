package peer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/testlog"
)

// TestResolveAdvertise: an IP or nothing is advertised as given; a host name is resolved to the
// first address of the gossip listener's family, IPv4 first where the listener takes both (none
// of the addresses here being this host's: TestResolveAdvertiseLocal); a
// name of no address of that family, or that does not resolve within the wait, is an error
// naming peers.advertise, the host and the resolver's error.
func TestResolveAdvertise(t *testing.T) {
	v4a, v4b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	v6a, v6b := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	mapped := netip.MustParseAddr("::ffff:10.0.0.3")
	answer := func(addrs ...netip.Addr) lookupFunc {
		return func(context.Context, string, string) ([]netip.Addr, error) { return addrs, nil }
	}
	for _, tc := range []struct {
		name, host, bind string
		lookup           lookupFunc
		want             string // the IP; "": an error
		resolved         bool
		errHas           []string
	}{
		{"nothing", "", "0.0.0.0", nil, "", false, nil},
		{"an IPv4 address", "10.0.0.9", "0.0.0.0", nil, "10.0.0.9", false, nil},
		{"an IPv6 address", "fd00::9", "::", nil, "fd00::9", false, nil},
		{"IPv4 listener", "r0.peers", "0.0.0.0", answer(v6a, v4a, v4b), "10.0.0.1", true, nil},
		{"IPv4 listener at an address", "r0.peers", "10.0.0.1", answer(v6a, v4b), "10.0.0.2", true, nil},
		{"IPv4-mapped answer", "r0.peers", "0.0.0.0", answer(v6a, mapped), "10.0.0.3", true, nil},
		{"IPv6 listener", "r0.peers", "fd00::9", answer(v4a, v6b, v6a), "fd00::2", true, nil},
		{"dual-stack listener, IPv4 preferred", "r0.peers", "::", answer(v6a, v4b, v4a), "10.0.0.2", true, nil},
		{"dual-stack listener, IPv6 only", "r0.peers", "::", answer(v6b), "fd00::2", true, nil},
		{"listener at a name", "r0.peers", "gossip.local", answer(v6a, v4a), "10.0.0.1", true, nil},
		{"no IPv4 address", "r0.peers", "0.0.0.0", answer(v6a, v6b), "", true,
			[]string{"peers.advertise", `"r0.peers"`, "no IPv4 address", "fd00::1"}},
		{"no IPv6 address", "r0.peers", "::1", answer(v4a), "", true,
			[]string{"peers.advertise", `"r0.peers"`, "no IPv6 address", "10.0.0.1"}},
		{"no address", "r0.peers", "::", answer(), "", true, []string{"peers.advertise", "no IPv4 or IPv6 address"}},
		// A link-local IPv6 address is reached through a zone, the interface of the host that
		// dials; memberlist carries none. A zone given is this host's, not the peers'.
		{"link-local IPv6 address with a zone", "fe80::1%eth0", "::", nil, "", false,
			[]string{"peers.advertise", `"fe80::1%eth0"`, "link-local", "global or unique local"}},
		{"link-local IPv6 address", "fe80::1", "::", nil, "", false, []string{"peers.advertise", `"fe80::1"`, "link-local"}},
		{"zone on another address", "fd00::1%eth0", "::", nil, "", false, []string{"peers.advertise", "zone", "fd00::1"}},
		{"name of a link-local address", "r0.peers", "::", answer(netip.MustParseAddr("fe80::1")), "", true,
			[]string{"peers.advertise", `"r0.peers"`, "fe80::1", "link-local"}},
		{"name of a link-local and another address", "r0.peers", "::", answer(netip.MustParseAddr("fe80::1"), v6b), "fd00::2", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := tc.lookup
			if lookup == nil {
				lookup = func(context.Context, string, string) ([]netip.Addr, error) {
					t.Error("looked up an IP")
					return nil, errors.New("looked up")
				}
			}
			ip, resolved, err := resolveAdvertise(context.Background(), lookup, noInterfaces, tc.host, tc.bind, time.Second, time.Millisecond, nil, nil)
			if ip != tc.want || resolved != tc.resolved || (err != nil) != (tc.want == "" && tc.host != "") {
				t.Fatalf("got %q, resolved %v, err %v; want %q, resolved %v", ip, resolved, err, tc.want, tc.resolved)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

// noInterfaces stands for a host none of whose addresses a stand-in resolver gives.
func noInterfaces() ([]net.Addr, error) { return nil, nil }

// interfaces stands in for net.InterfaceAddrs: a host with the addresses given (CIDR notation).
func interfaces(t *testing.T, cidrs ...string) func() ([]net.Addr, error) {
	var out []net.Addr
	for _, c := range cidrs {
		ip, n, err := net.ParseCIDR(c)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &net.IPNet{IP: ip, Mask: n.Mask})
	}
	return func() ([]net.Addr, error) { return out, nil }
}

// TestResolveAdvertiseLocal: of the addresses a name resolves to, the first that the gossip
// listener receives on is advertised (one of this host's, for a listener on every address;
// the listener's own, for one bound to an address); a loopback address only with the listener
// on loopback, a name of loopback addresses alone being an error naming peers.advertise, the
// address and the fix; where none is this host's, the first, with a warning naming the
// addresses and the pick. Before, the first was advertised: another pod's IP for a headless
// Service's name, 127.0.1.1 for a Debian host's name, with no word.
func TestResolveAdvertiseLocal(t *testing.T) {
	pod := interfaces(t, "127.0.0.1/8", "::1/128", "10.0.0.5/24", "fd00::5/64")
	for _, tc := range []struct {
		name, bind string
		ifaddrs    func() ([]net.Addr, error)
		addrs      []string
		want       string   // the IP; "": an error
		errHas     []string // in the error
		warnHas    []string // in the one warning; nil: none
	}{
		{name: "a headless Service's name: this pod's address", bind: "0.0.0.0", ifaddrs: pod,
			addrs: []string{"10.0.0.9", "10.0.0.5", "10.0.0.7"}, want: "10.0.0.5"},
		{name: "several of this host's: the first of them", bind: "0.0.0.0",
			ifaddrs: interfaces(t, "10.0.0.7/24", "10.0.0.5/24"),
			addrs:   []string{"10.0.0.9", "10.0.0.5", "10.0.0.7"}, want: "10.0.0.5"},
		{name: "none of this host's: the first, warned", bind: "0.0.0.0", ifaddrs: pod,
			addrs: []string{"10.0.0.9", "10.0.0.7"}, want: "10.0.0.9",
			warnHas: []string{"host=r0.peers", `addrs="[10.0.0.9 10.0.0.7]"`, "ip=10.0.0.9", "own address"}},
		{name: "a Debian host's name: loopback refused", bind: "0.0.0.0", ifaddrs: pod,
			addrs:  []string{"127.0.1.1"},
			errHas: []string{"peers.advertise", `"r0.peers"`, "127.0.1.1", "loopback", `"0.0.0.0"`, "pod IP", "/etc/hosts"}},
		{name: "IPv6 loopback refused", bind: "::", ifaddrs: pod,
			addrs: []string{"::1"}, errHas: []string{"peers.advertise", "::1", "loopback"}},
		{name: "loopback passed over for this host's address", bind: "0.0.0.0", ifaddrs: pod,
			addrs: []string{"127.0.1.1", "10.0.0.5"}, want: "10.0.0.5"},
		{name: "loopback passed over for another address, warned", bind: "0.0.0.0", ifaddrs: pod,
			addrs: []string{"127.0.1.1", "203.0.113.5"}, want: "203.0.113.5",
			warnHas: []string{`addrs="[127.0.1.1 203.0.113.5]"`, "ip=203.0.113.5"}},
		{name: "dual stack: this host's IPv6 address before another's IPv4 one", bind: "::", ifaddrs: pod,
			addrs: []string{"10.0.0.9", "fd00::5"}, want: "fd00::5"},
		{name: "dual stack: IPv4 first among this host's", bind: "::", ifaddrs: pod,
			addrs: []string{"fd00::5", "10.0.0.5"}, want: "10.0.0.5"},
		{name: "listener at an address: that one", bind: "10.0.0.5", ifaddrs: pod,
			addrs: []string{"10.0.0.7", "10.0.0.5"}, want: "10.0.0.5"},
		{name: "listener on loopback: loopback taken", bind: "127.0.0.1", ifaddrs: pod,
			addrs: []string{"127.0.0.1"}, want: "127.0.0.1"},
		{name: "listener on loopback: its address before another interface's", bind: "127.0.0.1", ifaddrs: pod,
			addrs: []string{"10.0.0.5", "127.0.0.1"}, want: "127.0.0.1"},
		{name: "interfaces not listed: the first, warned with the error", bind: "0.0.0.0",
			ifaddrs: func() ([]net.Addr, error) { return nil, errors.New("route ip+net: netlinkrib: permission denied") },
			addrs:   []string{"10.0.0.9", "10.0.0.5"}, want: "10.0.0.9",
			warnHas: []string{"ip=10.0.0.9", "listing this host's addresses: route ip+net: netlinkrib: permission denied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var addrs []netip.Addr
			for _, a := range tc.addrs {
				addrs = append(addrs, netip.MustParseAddr(a))
			}
			lookup := func(context.Context, string, string) ([]netip.Addr, error) { return addrs, nil }
			var logs testlog.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			ip, resolved, err := resolveAdvertise(context.Background(), lookup, tc.ifaddrs, "r0.peers", tc.bind,
				time.Second, time.Millisecond, nil, log.Warn)
			if ip != tc.want || !resolved || (err != nil) != (tc.want == "") {
				t.Fatalf("got %q, resolved %v, err %v; want %q", ip, resolved, err, tc.want)
			}
			for _, s := range tc.errHas {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			warned := logs.Count("level=WARN msg=\"peers.advertise resolves to no address this replica's gossip listens on")
			if want := min(len(tc.warnHas), 1); warned != want || logs.Count("\n") != want {
				t.Errorf("%d warnings, %d lines; want %d:\n%s", warned, logs.Count("\n"), want, logs.String())
			}
			for _, s := range tc.warnHas {
				if !strings.Contains(logs.String(), s) {
					t.Errorf("the warning does not say %q:\n%s", s, logs.String())
				}
			}
		})
	}
}

// TestResolveAdvertiseRetries: a name not in DNS yet (a pod's own name, published after the pod
// started) is asked again until it resolves; one that never does ends in an error within the
// wait, with the resolver's error; the end of the context ends the wait.
func TestResolveAdvertiseRetries(t *testing.T) {
	notFound := &net.DNSError{Err: "no such host", Name: "r0.peers", IsNotFound: true}
	failing := func(k int32, calls *atomic.Int32) lookupFunc {
		return func(ctx context.Context, network, host string) ([]netip.Addr, error) {
			if network != "ip" || host != "r0.peers" {
				t.Errorf("looked up %s %q", network, host)
			}
			if _, ok := ctx.Deadline(); !ok {
				t.Error("a lookup without a deadline")
			}
			if calls.Add(1) <= k {
				return nil, notFound
			}
			return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
		}
	}

	var calls atomic.Int32
	var told []error
	ip, _, err := resolveAdvertise(context.Background(), failing(2, &calls), noInterfaces, "r0.peers", "0.0.0.0", 5*time.Second, 5*time.Millisecond,
		func(err error) { told = append(told, err) }, nil)
	if ip != "10.0.0.1" || err != nil || calls.Load() != 3 {
		t.Errorf("resolved after two failures: %q, %v, in %d lookups; want 10.0.0.1 in 3", ip, err, calls.Load())
	}
	if diff := cmp.Diff([]error{notFound}, told, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("failures told (-want +got):\n%s", diff)
	}

	calls.Store(0)
	start := time.Now()
	_, _, err = resolveAdvertise(context.Background(), failing(1000, &calls), noInterfaces, "r0.peers", "0.0.0.0", 100*time.Millisecond, 20*time.Millisecond, nil, nil)
	took := time.Since(start)
	if !errors.Is(err, notFound) || !strings.Contains(err.Error(), `peers.advertise: host name "r0.peers" does not resolve`) {
		t.Errorf("never resolved: err %v, want peers.advertise's error wrapping the resolver's", err)
	}
	if took > time.Second || calls.Load() < 2 || calls.Load() > 6 {
		t.Errorf("never resolved: gave up after %v and %d lookups; want within the 100 ms wait, a lookup each 20 ms", took, calls.Load())
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls.Store(0)
	done := make(chan error, 1)
	go func() {
		_, _, err := resolveAdvertise(ctx, failing(1000, &calls), noInterfaces, "r0.peers", "0.0.0.0", 2*time.Minute, time.Minute,
			func(error) { cancel() }, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled: err %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the end of the context did not end the wait")
	}
}

// TestAdvertiseHostName: a replica given a host name in peers.advertise resolves it at start,
// logs the address and advertises it; a peer joins it there. memberlist parses only an IP: the
// replica failed to start ("failed to parse advertise address \"localhost\"").
func TestAdvertiseHostName(t *testing.T) {
	var logs testlog.Buffer
	a := startReplica(t, "a", nil, func(c *Config) { c.Advertise = "localhost"; logTo(&logs)(c) })
	host, _, err := net.SplitHostPort(a.node.GossipAddr())
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("a advertises %q (%v), want 127.0.0.1", a.node.GossipAddr(), err)
	}
	if !strings.Contains(logs.String(), `level=INFO msg="peers.advertise resolved: this replica advertises its address" replica=a host=localhost ip=127.0.0.1`) {
		t.Errorf("the address resolved is not logged at info:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a warning for localhost on a loopback listener:\n%s", logs.String())
	}
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, nil)
	waitFor(t, 10*time.Second, "a and b following each other", func() bool { return isFollowing(a, "b")() && isFollowing(b, "a")() })
}

// TestAdvertiseUnresolvable: a host name that does not resolve (.invalid never does, RFC 2606)
// ends Run within the wait with an error naming peers.advertise, the host and the resolver's
// error.
func TestAdvertiseUnresolvable(t *testing.T) {
	const host = "kvroute-0.kvroute.invalid"
	// The system's resolver is not asked (tests talk to loopback only): one that answers as
	// a DNS server does for such a name stands in.
	nxdomain := func(_ context.Context, _, h string) ([]netip.Addr, error) {
		return nil, &net.DNSError{Err: "no such host", Name: h, IsNotFound: true}
	}
	r := runReplica(t, "a", nil, func(c *Config) {
		c.Advertise, c.resolveWait, c.lookup = host, 300*time.Millisecond, nxdomain
	})
	var err error
	select {
	case err = <-r.done:
		r.cancel()
		r.cancel = nil // Run has returned: nothing for r.stop to wait for
	case <-time.After(10 * time.Second):
		t.Fatal("Run still starting 10 s after it began")
	}
	var dnsErr *net.DNSError
	if err == nil || !errors.As(err, &dnsErr) || !strings.HasPrefix(err.Error(), `peers.advertise: host name "`+host+`" does not resolve`) {
		t.Fatalf("Run: %v; want peers.advertise's error with the resolver's", err)
	}
	t.Logf("Run: %v", err)
	if r.node.GossipAddr() != "" {
		t.Errorf("gossip address %q after a failed start", r.node.GossipAddr())
	}
}

// TestAdvertiseLinkLocal: a replica given a link-local IPv6 address with a zone in
// peers.advertise does not start: Run's error names peers.advertise, the address and the fix.
// Before, the zone was taken for a host name, the system resolver answered the address without
// it, and the replica advertised fe80::1, which no peer can dial (connect: invalid argument).
func TestAdvertiseLinkLocal(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	_ = ln.Close()
	r := runReplica(t, "a", nil, func(c *Config) { c.Gossip, c.Advertise = "[::1]:0", "fe80::1%lo" })
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err = <-r.done:
			r.cancel()
			r.cancel = nil // Run has returned: nothing for r.stop to wait for
		default:
			if a := r.node.GossipAddr(); a != "" {
				t.Fatalf("a started, advertising %s", a)
			}
			if time.Now().After(deadline) {
				t.Fatal("Run neither started nor failed within 10 s")
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		break
	}
	if err == nil || !strings.HasPrefix(err.Error(), `peers.advertise "fe80::1%lo": a link-local IPv6 address`) ||
		!strings.Contains(err.Error(), "global or unique local") {
		t.Fatalf("Run: %v; want peers.advertise's error naming the address and the fix", err)
	}
	t.Logf("Run: %v", err)
}
