package app

import (
	"net"
	"net/netip"
	"strconv"

	"github.com/kvroute/kvroute/internal/config"
)

// selfExcluder returns what discovery leaves out as the router's own address (the sources'
// Exclude): an address and port this process listens on (listen, admin_listen, the peers'
// and ext_proc's listeners), so that a selector, a Service or a DNS name that also matches the
// router's pods does not make the router an endpoint of itself, a request forwarded to itself
// over and over (the proxy refuses a request that comes back, as a last guard). A listener on
// a wildcard address (":8080", "0.0.0.0", "::") is every loopback address and every address of
// the machine's interfaces, read once here; one on port 0 (a port chosen at start) is left
// alone. Nil when there is nothing to leave out.
func selfExcluder(cfg *config.Config) func(netip.AddrPort) bool {
	listeners := []string{cfg.Listen, cfg.AdminListen, cfg.ExtProc.Listen, cfg.ExtProc.HealthListen}
	if cfg.Peers != nil {
		listeners = append(listeners, cfg.Peers.Listen, cfg.Peers.GossipListen)
	}
	exact := map[netip.AddrPort]bool{}
	wild := map[uint16]bool{}
	for _, l := range listeners {
		host, p, err := net.SplitHostPort(l)
		if err != nil {
			continue
		}
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil || port == 0 {
			continue
		}
		switch a, err := netip.ParseAddr(host); {
		case host == "" || err == nil && a.IsUnspecified():
			wild[uint16(port)] = true
		case err == nil:
			exact[netip.AddrPortFrom(a.Unmap(), uint16(port))] = true
		case host == "localhost":
			exact[netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))] = true
			exact[netip.AddrPortFrom(netip.IPv6Loopback(), uint16(port))] = true
		}
	}
	if len(exact) == 0 && len(wild) == 0 {
		return nil
	}
	local := map[netip.Addr]bool{}
	if len(wild) > 0 {
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					local[p.Addr().Unmap()] = true
				}
			}
		}
	}
	return func(ap netip.AddrPort) bool {
		a := ap.Addr().Unmap().WithZone("")
		if exact[netip.AddrPortFrom(a, ap.Port())] {
			return true
		}
		return wild[ap.Port()] && (a.IsLoopback() || local[a])
	}
}
