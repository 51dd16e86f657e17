package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// LookupFunc resolves a host name to its addresses (net.Resolver.LookupNetIP's shape).
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// DNSSource makes one endpoint of every address a name resolves to, and resolves it again
// every interval: a Kubernetes headless service or a Compose service gives its replicas this
// way, and the set follows them as they come and go.
type DNSSource struct {
	// Config is the name, port, scheme, interval and the endpoints' other keys.
	Config config.DNSDiscovery
	// Lookup resolves names; nil: net.DefaultResolver (A and AAAA records).
	Lookup LookupFunc
	// Log receives failed resolutions and changes (discarded when nil).
	Log *slog.Logger
	// OnError, when set, also receives each failed resolution (for a metric or a test).
	OnError func(error)
}

// Key names the source in logs and in the router's merge order.
func (d *DNSSource) Key() string {
	return fmt.Sprintf("dns %s port %d", d.Config.Name, d.Config.Port)
}

// Resolve looks the name up once and returns its endpoints, ordered by address. A name with no
// address is an error: the caller keeps what it had (engines that are really gone fail their
// health checks).
func (d *DNSSource) Resolve(ctx context.Context) ([]endpoint.Spec, error) {
	lookup := d.Lookup
	if lookup == nil {
		lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	timeout := min(d.Config.Interval.D(), 5*time.Second)
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addrs, err := lookup(lctx, d.Config.Name)
	if err != nil {
		return nil, fmt.Errorf("discovery.dns %s: %w", d.Config.Name, err)
	}
	seen := make(map[netip.Addr]bool, len(addrs))
	uniq := addrs[:0:0]
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if a.IsValid() && !seen[a] {
			seen[a] = true
			uniq = append(uniq, a)
		}
	}
	if len(uniq) == 0 {
		return nil, fmt.Errorf("discovery.dns %s: no address", d.Config.Name)
	}
	slices.SortFunc(uniq, netip.Addr.Compare)
	specs := make([]endpoint.Spec, len(uniq))
	for i, a := range uniq {
		e := d.Config.Endpoint
		e.URL = d.Config.URL(a.String())
		specs[i] = Spec(&e)
	}
	return specs, nil
}

// Run resolves the name at once and then every interval, and calls emit with the endpoints
// whenever they differ from the last set emitted (last: what the caller holds already, nil if
// nothing). A failed resolution is logged and the set in force stays. It blocks until ctx ends.
func (d *DNSSource) Run(ctx context.Context, last []endpoint.Spec, emit func([]endpoint.Spec) error) error {
	log := d.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	interval := d.Config.Interval.D()
	if interval <= 0 {
		interval = config.DefaultDNSInterval
	}
	names := specNames(last)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		specs, err := d.Resolve(ctx)
		if err == nil && !slices.Equal(names, specNames(specs)) {
			if err = emit(specs); err == nil {
				log.Info("endpoints found by DNS changed", "name", d.Config.Name, "endpoints", specNames(specs))
				names = specNames(specs)
			}
		}
		if err != nil && ctx.Err() == nil {
			log.Warn("DNS discovery failed, keeping the endpoints in force", "name", d.Config.Name, "err", err)
			if d.OnError != nil {
				d.OnError(err)
			}
		}
		t.Reset(interval)
	}
}

func specNames(specs []endpoint.Spec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.Name
	}
	return out
}

// DNSFromConfig returns a source for each of the config's discovery.dns names.
func DNSFromConfig(c *config.Config, log *slog.Logger) []*DNSSource {
	out := make([]*DNSSource, len(c.Discovery.DNS))
	for i := range c.Discovery.DNS {
		out[i] = &DNSSource{Config: c.Discovery.DNS[i], Log: log}
	}
	return out
}
