package app

import (
	"context"
	"net/netip"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// The router's own listen addresses are never its endpoints: a DNS name (or a selector) that
// also finds the router would make it forward requests to itself.
func TestSelfExcluder(t *testing.T) {
	cfg, err := config.Parse([]byte("listen: ':18080'\nadmin_listen: '127.0.0.1:19090'\nendpoints: [{url: 'http://127.0.0.1:8001', models: [m]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	self := selfExcluder(cfg)
	if self == nil {
		t.Fatal("no excluder for a config with listeners")
	}
	for addr, want := range map[string]bool{
		"127.0.0.1:18080": true,  // the API on every address: loopback
		"[::1]:18080":     true,  // the same, IPv6
		"192.0.2.1:18080": false, // another machine's (TEST-NET) at the same port
		"127.0.0.1:19090": true,  // the admin listener, exact
		"127.0.0.2:19090": false, // another loopback address at the admin's port
		"127.0.0.1:8001":  false, // an engine beside the router
	} {
		if got := self(netip.MustParseAddrPort(addr)); got != want {
			t.Errorf("self(%s) = %v, want %v", addr, got, want)
		}
	}
	if got := selfExcluder(&config.Config{Listen: "127.0.0.1:0"}); got != nil {
		t.Error("a listener on port 0 (chosen at start) cannot be matched, yet an excluder came back")
	}

	// Through a DNS source as NewRouter sets it up: a name answering the engine's address and
	// the router's own keeps the engine alone.
	d := &discovery.DNSSource{
		Config: config.DNSDiscovery{Name: "engines", Port: 18080, Scheme: "http"},
		Lookup: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.1")}, nil
		},
		Exclude: self,
	}
	specs, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 1 || specs[0].Name != "http://192.0.2.1:18080" {
		t.Errorf("endpoints %v; want only http://192.0.2.1:18080", specs)
	}
}
