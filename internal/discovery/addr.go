package discovery

import (
	"fmt"
	"net/netip"
)

// Unusable says why no endpoint may have addr, or "" when one may. Every source asks it of
// each address it finds (DNS answers, EndpointSlices, pods), so that a record or a slice that
// is wrong, or hostile, cannot send the router's health checks and prompts where they must
// not go:
//
//   - unspecified (0.0.0.0, ::) and the rest of 0.0.0.0/8: a connection to 0.0.0.0 or :: reaches
//     this host on Linux, which for the router is a loop to itself;
//   - multicast and the limited broadcast address 255.255.255.255: no engine answers there;
//   - link-local (169.254.0.0/16, fe80::/10): 169.254.169.254 is the cloud metadata service,
//     and an IPv6 link-local address means nothing without its interface, which DNS cannot say.
//
// Loopback stays usable: an engine beside the router, and every test, listen there. The
// router's own listen address is a loop too, but only the router knows it: each source has
// an Exclude hook for it.
func Unusable(addr netip.Addr) string {
	a := addr.Unmap()
	switch {
	case !a.IsValid():
		return "not an IP address"
	case a.IsUnspecified():
		return "unspecified (0.0.0.0 or ::): a connection to it reaches this host"
	case a.Is4() && a.As4()[0] == 0:
		return "in 0.0.0.0/8 (this host's network): no engine can be reached there"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "the broadcast address: no engine can be reached there"
	case a.IsMulticast():
		return "a multicast address: no engine can be reached there"
	case a.IsLinkLocalUnicast():
		return "link-local (169.254.0.0/16 or fe80::/10): 169.254.169.254 is the cloud metadata service, and an IPv6 one needs its interface"
	}
	return ""
}

// Excluded is the reason an Exclude hook's address is left out.
const Excluded = "excluded: the router's own address (a routing loop)"

// Check is Unusable with a source's Exclude hook (nil: none) for the address at port.
func Check(addr netip.Addr, port int, exclude func(netip.AddrPort) bool) string {
	if why := Unusable(addr); why != "" {
		return why
	}
	if exclude != nil && port > 0 && port <= 65535 && exclude(netip.AddrPortFrom(addr.Unmap(), uint16(port))) {
		return Excluded
	}
	return ""
}

// LogNames is what a log line says of a set of names: all of them when they are few, else the
// first limit and how many more, so that a set of thousands does not make a line of hundreds of
// kilobytes at each change.
func LogNames(names []string, limit int) []string {
	if len(names) <= limit {
		return names
	}
	out := make([]string, limit+1)
	copy(out, names[:limit])
	out[limit] = fmt.Sprintf("and %d more", len(names)-limit)
	return out
}

// logNamesMax is how many names a change's log line lists.
const logNamesMax = 10

// Changes returns what a change from the names before to those after added and removed, each
// cut for a log line (LogNames).
func Changes(before, after []string) (added, removed []string) {
	was := make(map[string]bool, len(before))
	for _, n := range before {
		was[n] = true
	}
	is := make(map[string]bool, len(after))
	for _, n := range after {
		is[n] = true
		if !was[n] {
			added = append(added, n)
		}
	}
	for _, n := range before {
		if !is[n] {
			removed = append(removed, n)
		}
	}
	return LogNames(added, logNamesMax), LogNames(removed, logNamesMax)
}
