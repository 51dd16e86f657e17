package peer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

// A host name in peers.advertise (a StatefulSet pod's name under its headless Service, a
// Compose service's name) is resolved here, once, when Run starts: memberlist takes an IP
// only, and a replica given a name failed to start ("failed to parse advertise address").
// It is not resolved again while the replica runs: memberlist advertises one address for its
// whole life, and the addresses that such names stand for change only with a restart (a pod
// gets its IP when it starts, and keeps it until it stops).

const (
	// advertiseWait bounds the resolution of peers.advertise. A pod's own name under its
	// headless Service may not be in DNS yet when the pod starts (the record follows the
	// EndpointSlice): it is asked again each advertiseRetry meanwhile, rather than the replica
	// failing and waiting for its restart back-off.
	advertiseWait  = 10 * time.Second
	advertiseRetry = time.Second
)

// unspecifiedError is Run's error for a gossip listener at gossip (peers.gossip_listen) on
// every IPv6 address or at a host name with no address to advertise: memberlist would advertise
// "::", which each peer dials as its own host (config.AdvertisesUnspecified; the config's check
// refuses it already).
func unspecifiedError(gossip string) error {
	return fmt.Errorf("peers.advertise: missing, with peers.gossip_listen %q: the gossip would advertise the unspecified address (::); give this replica's address or host name", gossip)
}

// lookupFunc resolves a host name, as net.Resolver.LookupNetIP.
type lookupFunc func(ctx context.Context, network, host string) ([]netip.Addr, error)

// ipFamilies says which address families a gossip listener bound to bindHost (memberlist's
// BindAddr: an IP, or a host name, which memberlist binds as the unspecified address) takes:
// IPv4 only for an IPv4 address (0.0.0.0 included), IPv6 only for an IPv6 one, both for "::"
// (a dual-stack socket) and for a name.
func ipFamilies(bindHost string) (v4, v6 bool) {
	ip, err := netip.ParseAddr(bindHost)
	if err != nil {
		return true, true
	}
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return true, false
	case ip.IsUnspecified():
		return true, true
	}
	return false, true
}

// candidates returns those of addrs (a name's) that may be advertised with a gossip listener
// bound to bindHost, IPv4 ones first where the listener takes both families: of the listener's
// families (ipFamilies), advertisable (config.AdvertisableIP: not link-local IPv6), and loopback
// only with the listener on loopback, as no peer on another host can reach a loopback address
// (a Debian host's name is 127.0.1.1 in its /etc/hosts). loopback says whether an address of
// the listener's family was passed over for being loopback.
func candidates(addrs []netip.Addr, bindHost string) (out []netip.Addr, loopback bool) {
	v4, v6 := ipFamilies(bindHost)
	bind, _ := netip.ParseAddr(bindHost) // a name: the zero Addr, not loopback
	onLoopback := bind.Unmap().IsLoopback()
	for _, fam := range []struct {
		ok  bool
		is4 bool
	}{{v4, true}, {v6, false}} {
		if !fam.ok {
			continue
		}
		for _, a := range addrs {
			if a = a.Unmap(); a.Is4() != fam.is4 || config.AdvertisableIP(a) != nil {
				continue
			}
			if a.IsLoopback() && !onLoopback {
				loopback = true
				continue
			}
			out = append(out, a)
		}
	}
	return out, loopback
}

// localAddr returns the first of cands that a gossip listener bound to bindHost receives on:
// its own address where it is bound to one; where it is bound to every address (0.0.0.0, ::, a
// host name), one of this host's, as ifaddrs (net.InterfaceAddrs) lists them. ok is false where
// none is, or where ifaddrs failed (err).
func localAddr(cands []netip.Addr, bindHost string, ifaddrs func() ([]net.Addr, error)) (a netip.Addr, ok bool, err error) {
	if bind, err := netip.ParseAddr(bindHost); err == nil && !bind.Unmap().IsUnspecified() {
		bind = bind.Unmap()
		for _, a := range cands {
			if a == bind {
				return a, true, nil
			}
		}
		return netip.Addr{}, false, nil
	}
	ifs, err := ifaddrs()
	if err != nil {
		return netip.Addr{}, false, fmt.Errorf("listing this host's addresses: %w", err)
	}
	own := make(map[netip.Addr]bool, len(ifs))
	for _, ia := range ifs {
		var ip net.IP
		switch v := ia.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			own[a.Unmap()] = true
		}
	}
	for _, a := range cands {
		if own[a] {
			return a, true, nil
		}
	}
	return netip.Addr{}, false, nil
}

// familyName names the families a listener takes, for errors.
func familyName(v4, v6 bool) string {
	switch {
	case v4 && v6:
		return "IPv4 or IPv6"
	case v4:
		return "IPv4"
	}
	return "IPv6"
}

// resolveAdvertise returns the IP to advertise for host (peers.advertise) with a gossip
// listener bound to bindHost: host itself when it is an IP or empty (memberlist's choice), else
// one of the addresses host resolves to; resolved says whether host was a name. A link-local
// IPv6 address, or one with a zone (fe80::1%eth0), is refused, and passed over among a name's
// (config.AdvertisableIP): the peers could not dial it (the config's check refuses the former
// already; a name's addresses are known only here).
//
// Of a name's addresses of the listener's family (candidates: IPv4 first where it takes both;
// loopback ones only with the listener on loopback, a name of loopback addresses alone being an
// error), the first that the listener receives on (localAddr, with ifaddrs listing this host's
// addresses) is picked: a name may stand for several hosts (a headless Service's, every pod's),
// and the first it gives may be another replica's. Where none is, the first is picked, as it
// may lead here through address translation, and warn (as slog.Logger.Warn) is told, naming
// the addresses and the pick.
//
// A lookup that fails is made again every retry while one more fits before wait has passed
// since the first (each ends by then); retrying, when set, is told of the first failure when
// another try follows. The errors name peers.advertise, the host and the resolver's error.
func resolveAdvertise(ctx context.Context, lookup lookupFunc, ifaddrs func() ([]net.Addr, error), host, bindHost string,
	wait, retry time.Duration, retrying func(err error), warn func(msg string, args ...any)) (ip string, resolved bool, err error) {
	if host == "" {
		return host, false, nil
	}
	// netip takes a zone, where net.ParseIP does not: "fe80::1%eth0" was looked up as a name,
	// and the system resolver answered the address without its zone.
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := config.AdvertisableIP(ip); err != nil {
			return "", false, fmt.Errorf("peers.advertise %q: %w", host, err)
		}
		return host, false, nil
	}
	start := time.Now()
	deadline := start.Add(wait)
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for tries := 1; ; tries++ {
		addrs, err := lookup(lctx, "ip", host)
		switch {
		case err == nil:
			return pickAdvertised(addrs, ifaddrs, host, bindHost, warn)
		case ctx.Err() != nil:
			return "", true, fmt.Errorf("peers.advertise: resolving host name %q: %w", host, ctx.Err())
		case time.Until(deadline) < retry:
			lookups := "1 lookup"
			if tries > 1 {
				lookups = fmt.Sprintf("%d lookups", tries)
			}
			return "", true, fmt.Errorf("peers.advertise: host name %q does not resolve (%s in %v): %w; give an IP address, or a name this host resolves",
				host, lookups, time.Since(start).Round(time.Millisecond), err)
		case tries == 1 && retrying != nil:
			retrying(err)
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", true, fmt.Errorf("peers.advertise: resolving host name %q: %w", host, ctx.Err())
		case <-t.C:
		}
	}
}

// pickAdvertised returns the address to advertise among addrs, those host (peers.advertise)
// resolved to, with a gossip listener bound to bindHost (resolveAdvertise says which).
func pickAdvertised(addrs []netip.Addr, ifaddrs func() ([]net.Addr, error), host, bindHost string,
	warn func(msg string, args ...any)) (ip string, resolved bool, err error) {
	cands, loopback := candidates(addrs, bindHost)
	if len(cands) == 0 {
		v4, v6 := ipFamilies(bindHost)
		if loopback {
			return "", true, fmt.Errorf("peers.advertise: host name %q resolves to %v: loopback, which no peer on another host can reach (the gossip listens on %q); set peers.advertise to this replica's own address (on Kubernetes, its pod IP), or map the name to that address in /etc/hosts",
				host, addrs, bindHost)
		}
		linkLocal := ""
		for _, a := range addrs {
			if config.AdvertisableIP(a) != nil {
				linkLocal = " but link-local IPv6 ones, which the peers cannot dial"
				break
			}
		}
		return "", true, fmt.Errorf("peers.advertise: host name %q resolves to %v, no %s address (the family of the gossip listener, %q)%s: give a name or an address of that family",
			host, addrs, familyName(v4, v6), bindHost, linkLocal)
	}
	a, local, lerr := localAddr(cands, bindHost, ifaddrs)
	if local {
		return a.String(), true, nil
	}
	a = cands[0]
	if warn != nil {
		args := []any{"host", host, "addrs", addrs, "ip", a}
		if lerr != nil {
			args = append(args, "err", lerr)
		}
		warn("peers.advertise resolves to no address this replica's gossip listens on: advertising the first, which reaches this replica only through address translation; if it is another host's, set peers.advertise to this replica's own address",
			args...)
	}
	return a.String(), true, nil
}
