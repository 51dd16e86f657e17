package peer

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
)

// Source finds the gossip addresses (host:port) of other replicas to join. Any one address of
// a running replica is enough to join the whole group; the rest is gossip. A Source for
// Kubernetes (the replicas' EndpointSlice) plugs in here.
type Source interface {
	// Addrs returns the addresses to try now. An error keeps the replica going on what it
	// knows; it is logged.
	Addrs(ctx context.Context) ([]string, error)
	// String names the source in logs.
	String() string
}

// Static is a fixed list of addresses.
type Static []string

// Addrs returns the list.
func (s Static) Addrs(context.Context) ([]string, error) { return slices.Clone(s), nil }

func (s Static) String() string { return fmt.Sprintf("static %v", []string(s)) }

// DNS finds replicas behind a name (a Kubernetes headless Service, a scaled Compose service):
// one address per A or AAAA record, at Port, with internal/discovery's resolution.
type DNS struct {
	Name string
	Port int
	// Lookup resolves names; nil: the system resolver.
	Lookup discovery.LookupFunc
}

// Addrs resolves the name.
func (d DNS) Addrs(ctx context.Context) ([]string, error) {
	src := discovery.DNSSource{
		Config: config.DNSDiscovery{Name: d.Name, Port: d.Port, Scheme: "http", Interval: config.Duration(5 * time.Second)},
		Lookup: d.Lookup,
	}
	specs, err := src.Resolve(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(specs))
	for _, s := range specs {
		u, err := url.Parse(s.Name)
		if err != nil {
			return nil, fmt.Errorf("peers.dns %s: %w", d.Name, err)
		}
		out = append(out, u.Host)
	}
	return out, nil
}

func (d DNS) String() string { return "dns " + net.JoinHostPort(d.Name, strconv.Itoa(d.Port)) }
