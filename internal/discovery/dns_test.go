package discovery

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
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
	d := &DNSSource{Config: dnsConfig(t), Lookup: func(_ context.Context, host string) ([]netip.Addr, error) {
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
`))
	if err == nil {
		t.Fatal("bad discovery.dns accepted")
	}
	for _, want := range []string{
		"discovery.dns[0].name", "discovery.dns[0].port", "discovery.dns[0].scheme", "discovery.dns[0].interval",
		"discovery.dns[0].endpoint.url", "discovery.dns[0].endpoint.engine", "discovery.dns[2]: http://a.b:8000 is listed twice",
	} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	c, err := config.Parse([]byte("discovery: {dns: [{name: vllm.local., port: 8000}]}\n"))
	if err != nil {
		t.Fatalf("a config with only discovery.dns: %v", err)
	}
	if n := c.Discovery.DNS[0]; n.Name != "vllm.local" || n.Scheme != "http" || n.Interval.D() != config.DefaultDNSInterval || n.Endpoint.Engine != config.DefaultEngine {
		t.Errorf("defaults: %+v", n)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
