package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// LookupFunc resolves a host name to its addresses of both families at once
// (net.Resolver.LookupNetIP's shape with network "ip").
type LookupFunc func(ctx context.Context, host string) ([]netip.Addr, error)

// NetLookupFunc resolves a host name to its addresses of one network, "ip4" or "ip6"
// (net.Resolver.LookupNetIP).
type NetLookupFunc func(ctx context.Context, network, host string) ([]netip.Addr, error)

// DNSSource makes one endpoint of every address a name resolves to, and resolves it again
// every interval: a Kubernetes headless service or a Compose service gives its replicas this
// way, and the set follows them as they come and go.
//
// Four things keep a flaky or hostile DNS server from breaking the set: an address no
// endpoint may have (Unusable, Exclude) is left out and said once; an address that an answer
// lacks stays until remove_after answers in a row have lacked it, so that a server answering a
// random few of the records does not make each address that comes back a new, cold endpoint;
// with family auto, the name goes over from one family to the other only once remove_after
// answers in a row have asked for it, in one step, so that A records seen briefly on an IPv6
// name (or missing briefly on an IPv4 one) never make each engine two endpoints; and with
// family auto or any, a family whose lookup fails while the other answers keeps its addresses
// in force rather than losing them.
type DNSSource struct {
	// Config is the name, port, scheme, interval, family, limits and the endpoints' other keys.
	Config config.DNSDiscovery
	// LookupNet resolves names one family at a time, so that a family that fails is told from
	// one that has no address; nil: net.DefaultResolver.
	LookupNet NetLookupFunc
	// Lookup, when set, is used instead of LookupNet: both families in one call, whose failure
	// is both families' (it cannot tell which failed).
	Lookup LookupFunc
	// Exclude, when set, leaves out each address (at the entry's port) it returns true for:
	// the router's own listen addresses, which would make a loop. It is reported like an
	// unusable address.
	Exclude func(netip.AddrPort) bool
	// Log receives failed resolutions, addresses left out and changes (discarded when nil).
	Log *slog.Logger
	// OnError, when set, also receives each failed resolution, each change of the addresses
	// left out and each refused set (for a metric or a test).
	OnError func(error)

	busy atomic.Bool // a lookup is running (one that ignores its deadline may outlive it)
}

// Key names the source in logs and in the router's merge order.
func (d *DNSSource) Key() string {
	return fmt.Sprintf("dns %s port %d", d.Config.Name, d.Config.Port)
}

// answer is one resolution: the addresses found of each family (unmapped), and the failure of
// a family whose lookup failed.
type answer struct {
	v4, v6     []netip.Addr
	err4, err6 error
}

// Resolve looks the name up once and returns its endpoints, ordered by address. A name with no
// usable address, or with more than max_endpoints, is an error: the caller keeps what it had
// (engines that are really gone fail their health checks). A family that fails while the other
// answers is logged and reported, and the other's addresses are returned.
func (d *DNSSource) Resolve(ctx context.Context) ([]endpoint.Spec, error) {
	a, err := d.lookup(ctx)
	if err != nil {
		return nil, err
	}
	d.partial(d.logger(), a, new([2]bool))
	addrs, dropped := d.choose(a, nil, d.family())
	if len(addrs) == 0 {
		return nil, d.noAddress(dropped)
	}
	if n := d.maxEndpoints(); len(addrs) > n {
		return nil, fmt.Errorf("discovery.dns %s: %d addresses, more than max_endpoints (%d): raise max_endpoints if the name really has that many engines", d.Config.Name, len(addrs), n)
	}
	return d.specs(addrs), nil
}

// ResolveAll resolves each source once, all at the same time, so that at start names that do
// not answer cost one lookup timeout in all rather than one each: sets[i] and errs[i] are
// sources[i]'s.
func ResolveAll(ctx context.Context, sources []*DNSSource) (sets [][]endpoint.Spec, errs []error) {
	sets, errs = make([][]endpoint.Spec, len(sources)), make([]error, len(sources))
	var wg sync.WaitGroup
	for i, d := range sources {
		wg.Go(func() { sets[i], errs[i] = d.Resolve(ctx) })
	}
	wg.Wait()
	return sets, errs
}

// Run resolves the name at once and then every interval, and calls emit with the endpoints
// whenever they differ from the last set emitted (last: what the caller holds already, nil if
// nothing). A failed resolution, or one without any usable address, is logged and the set in
// force stays; an address the answers lack leaves after remove_after of them, and with auto the
// name changes family after remove_after answers that ask for the other one; a set over
// max_endpoints is refused, said once, and the set in force stays. It blocks until ctx ends.
func (d *DNSSource) Run(ctx context.Context, last []endpoint.Spec, emit func([]endpoint.Spec) error) error {
	log := d.logger()
	interval := d.Config.Interval.D()
	if interval <= 0 {
		interval = config.DefaultDNSInterval
	}
	removeAfter := cmp.Or(d.Config.RemoveAfter, config.DefaultRemoveAfter)
	names := specNames(last)
	var held []netip.Addr
	for _, n := range names {
		if a, ok := addrOf(n); ok {
			held = append(held, a)
		}
	}
	missed := map[netip.Addr]int{}
	streak := 0        // auto: answers in a row that asked for the family not in force
	left := ""         // the addresses left out, as last said
	over := false      // the last answer was refused for its size, and that was said
	var partly [2]bool // the A, the AAAA lookups fail while the other family answers, and that was said
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		a, err := d.lookup(ctx)
		if err == nil {
			d.partial(log, a, &partly)
			now, dropped := d.choose(a, held, d.family())
			// auto: the name stays in the family of the endpoints in force until remove_after
			// answers in a row have asked for the other one, as an address stays until
			// remove_after answers have lacked it. Going over at the first such answer made
			// each dual-stack engine two endpoints (the new family's, and the old one's held
			// as missing) and one brief answer was enough. Meanwhile the answer is read in the
			// family in force, whose addresses it lacks age out; the name goes over in one
			// step once the streak is long enough or none of them is left, and the endpoints
			// of the family it leaves go with that set.
			base, fading := held, false
			if d.family() == config.FamilyAuto && len(now) > 0 {
				in, asked := familyOf(held), familyOf(now)
				if in == "" || in == asked {
					streak = 0
				} else {
					streak++
					stay, _ := d.choose(a, held, in)
					if kept, _ := hold(held, missed, stay, removeAfter); streak < removeAfter && len(kept) > 0 {
						now, fading = stay, len(stay) == 0
					} else {
						base = slices.DeleteFunc(slices.Clone(held), func(h netip.Addr) bool { return h.Is4() == (in == config.FamilyIPv4) })
					}
				}
			}
			if s := strings.Join(dropped, "; "); s != left {
				left = s
				if s != "" {
					d.report(log, "DNS discovery left addresses out", fmt.Errorf("discovery.dns %s: %d addresses left out: %s",
						d.Config.Name, len(dropped), strings.Join(LogNames(dropped, logNamesMax), "; ")))
				}
			}
			if len(now) == 0 && !fading {
				err = d.noAddress(dropped)
			} else {
				kept, stillMissed := hold(base, missed, now, removeAfter)
				if n := d.maxEndpoints(); len(now) > n {
					if !over {
						d.report(log, "DNS discovery refused a set over max_endpoints, keeping the endpoints in force",
							fmt.Errorf("discovery.dns %s: %d addresses, more than max_endpoints (%d): the %d endpoints in force stay; raise max_endpoints if the name really has that many engines",
								d.Config.Name, len(now), n, len(names)))
					}
					over = true
				} else {
					over = false
					// The answer fits, and the addresses held for it go first where they do
					// not (a fleet replaced at once): judged with them, it would be refused at
					// every answer, their misses never counted, and the dead set kept for good.
					kept = fit(kept, now, stillMissed, n)
					specs := d.specs(kept)
					got := specNames(specs)
					if !slices.Equal(names, got) {
						err = emit(specs)
						if err == nil {
							added, removed := Changes(names, got)
							log.Info("endpoints found by DNS changed", "name", d.Config.Name, "endpoints", len(got),
								"added", added, "removed", removed)
							names = got
						}
					}
					if err == nil {
						held, missed = kept, stillMissed
					}
				}
			}
		}
		if err != nil && ctx.Err() == nil {
			d.report(log, "DNS discovery failed, keeping the endpoints in force", err)
		}
		t.Reset(interval)
	}
}

func (d *DNSSource) logger() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// report logs a problem as a warning and passes it to OnError.
func (d *DNSSource) report(log *slog.Logger, msg string, err error) {
	log.Warn(msg, "name", d.Config.Name, "err", err)
	if d.OnError != nil {
		d.OnError(err)
	}
}

func (d *DNSSource) maxEndpoints() int {
	return cmp.Or(d.Config.MaxEndpoints, config.DefaultMaxEndpoints)
}

func (d *DNSSource) family() string { return cmp.Or(d.Config.Family, config.FamilyAuto) }

// lookup resolves the name once, within the lookup timeout even when the lookup function
// ignores its context (the lookup then goes on alone, and no other starts until it returns).
// It fails when every family it asked for failed.
func (d *DNSSource) lookup(ctx context.Context) (answer, error) {
	// Within the interval (at least 1 s, as config allows) and at most 5 s.
	timeout := min(max(d.Config.Interval.D(), time.Second), 5*time.Second)
	if !d.busy.CompareAndSwap(false, true) {
		return answer{}, fmt.Errorf("discovery.dns %s: the previous lookup has not returned yet, long after its deadline", d.Config.Name)
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan answer, 1)
	go func() {
		a := d.ask(lctx)
		d.busy.Store(false) // before the answer goes: the next lookup may start as soon as it is read
		done <- a
	}()
	var a answer
	select {
	case a = <-done:
	case <-lctx.Done():
		if ctx.Err() != nil {
			return answer{}, ctx.Err()
		}
		return answer{}, fmt.Errorf("discovery.dns %s: no answer within %v", d.Config.Name, timeout)
	}
	var failed error
	switch d.family() {
	case config.FamilyIPv4:
		failed = a.err4
	case config.FamilyIPv6:
		failed = a.err6
	default:
		switch {
		case a.err4 == nil || a.err6 == nil:
		case a.err4 == a.err6:
			failed = a.err4
		default:
			failed = fmt.Errorf("the A lookup: %w; the AAAA lookup: %w", a.err4, a.err6)
		}
	}
	if failed != nil {
		return answer{}, fmt.Errorf("discovery.dns %s: %w", d.Config.Name, failed)
	}
	return a, nil
}

// ask makes the lookups the family needs, at the same time when it needs two.
func (d *DNSSource) ask(ctx context.Context) answer {
	var a answer
	if d.Lookup != nil {
		addrs, err := d.Lookup(ctx, d.Config.Name)
		err = noAddressIsNoError(err)
		a.err4, a.err6 = err, err
		for _, ad := range addrs {
			if ad = ad.Unmap(); ad.Is4() {
				a.v4 = append(a.v4, ad)
			} else {
				a.v6 = append(a.v6, ad)
			}
		}
		return a
	}
	look := d.LookupNet
	if look == nil {
		look = net.DefaultResolver.LookupNetIP
	}
	one := func(network string, want func(netip.Addr) bool) ([]netip.Addr, error) {
		addrs, err := look(ctx, network, d.Config.Name)
		var out []netip.Addr
		for _, ad := range addrs {
			if ad = ad.Unmap(); want(ad) {
				out = append(out, ad)
			}
		}
		return out, noAddressIsNoError(err)
	}
	switch d.family() {
	case config.FamilyIPv4:
		a.v4, a.err4 = one("ip4", netip.Addr.Is4)
	case config.FamilyIPv6:
		a.v6, a.err6 = one("ip6", netip.Addr.Is6)
	default:
		var wg sync.WaitGroup
		wg.Go(func() { a.v6, a.err6 = one("ip6", netip.Addr.Is6) })
		a.v4, a.err4 = one("ip4", netip.Addr.Is4)
		wg.Wait()
	}
	return a
}

// noAddressIsNoError reads a lookup's "no such host" (NXDOMAIN, or no record of the family) and
// "no suitable address" (the hosts file has the name, in the other family only) as an answer
// without an address: the family answered.
func noAddressIsNoError(err error) error {
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return nil
	}
	var ae *net.AddrError
	if errors.As(err, &ae) && strings.Contains(ae.Err, "no suitable address") {
		return nil
	}
	return err
}

// partial says a lookup of one family that failed while the other answered, when the failed
// family counts: always with any; with auto, A's, and AAAA's when A found no address (a
// server that fails every AAAA query in an IPv4 cluster is no news at every lookup).
func (d *DNSSource) partial(log *slog.Logger, a answer, said *[2]bool) {
	f := d.family()
	if f != config.FamilyAuto && f != config.FamilyAny {
		return
	}
	for i, fam := range []struct {
		name string
		err  error
	}{{"A (IPv4)", a.err4}, {"AAAA (IPv6)", a.err6}} {
		if fam.err == nil || f == config.FamilyAuto && fam.err == a.err6 && len(a.v4) > 0 {
			said[i] = false
			continue
		}
		err := fmt.Errorf("discovery.dns %s: %s lookup failed while the other family answered, its addresses in force stay: %w", d.Config.Name, fam.name, fam.err)
		// Counted at every lookup, as a whole failure is, but logged once while it lasts: a
		// server that fails every AAAA query would otherwise warn every interval for good.
		if !said[i] {
			said[i] = true
			log.Warn("DNS lookup of one address family failed, keeping its endpoints in force (said once while it fails)", "name", d.Config.Name, "err", err)
		}
		if d.OnError != nil {
			d.OnError(err)
		}
	}
}

// choose returns the usable addresses of an answer that family (the config's, or with auto
// the one in force) asks for, in order, and what it left out (each address with the reason);
// held are the addresses in force, which a family whose lookup failed keeps.
func (d *DNSSource) choose(a answer, held []netip.Addr, family string) (addrs []netip.Addr, dropped []string) {
	of := func(fresh []netip.Addr, err error, is func(netip.Addr) bool) (out []netip.Addr, left []string) {
		if err != nil {
			for _, h := range held {
				if is(h) {
					out = append(out, h)
				}
			}
			return out, nil
		}
		for _, ad := range fresh {
			if why := Check(ad, d.Config.Port, d.Exclude); why != "" {
				left = append(left, ad.String()+": "+why)
				continue
			}
			out = append(out, ad.WithZone(""))
		}
		return out, left
	}
	v4, left4 := of(a.v4, a.err4, netip.Addr.Is4)
	v6, left6 := of(a.v6, a.err6, netip.Addr.Is6)
	switch family {
	case config.FamilyIPv4:
		addrs, dropped = v4, left4
	case config.FamilyIPv6:
		addrs, dropped = v6, left6
	case config.FamilyAny:
		addrs, dropped = append(v4, v6...), append(left4, left6...)
	default: // auto: one endpoint per dual-stack host, by its IPv4 address
		if len(v4) > 0 {
			addrs, dropped = v4, left4
		} else {
			addrs, dropped = v6, append(left4, left6...)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	slices.Sort(dropped)
	return slices.Compact(addrs), slices.Compact(dropped)
}

// familyOf is the family auto reads addrs in: ipv4 when any is IPv4, else ipv6 when there is
// any, else "".
func familyOf(addrs []netip.Addr) string {
	switch {
	case slices.ContainsFunc(addrs, netip.Addr.Is4):
		return config.FamilyIPv4
	case len(addrs) > 0:
		return config.FamilyIPv6
	}
	return ""
}

// noAddress is the error of an answer with no usable address.
func (d *DNSSource) noAddress(dropped []string) error {
	if len(dropped) > 0 {
		return fmt.Errorf("discovery.dns %s: no usable address (%s left out)", d.Config.Name, strings.Join(LogNames(dropped, logNamesMax), "; "))
	}
	if f := d.family(); f == config.FamilyIPv4 || f == config.FamilyIPv6 {
		return fmt.Errorf("discovery.dns %s: no address of family %s: check the name's records, or set family", d.Config.Name, f)
	}
	return fmt.Errorf("discovery.dns %s: no address", d.Config.Name)
}

// hold returns the addresses in force after an answer that has now: now's, and those in force
// that fewer than removeAfter answers in a row have lacked, in order; and the number of answers
// in a row that have lacked each of the latter.
func hold(held []netip.Addr, missed map[netip.Addr]int, now []netip.Addr, removeAfter int) ([]netip.Addr, map[netip.Addr]int) {
	out := slices.Clone(now)
	still := map[netip.Addr]int{}
	for _, h := range held {
		if _, found := slices.BinarySearchFunc(now, h, netip.Addr.Compare); found {
			continue
		}
		if m := missed[h] + 1; m < removeAfter {
			out = append(out, h)
			still[h] = m
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, still
}

// fit returns kept (the addresses of the answer now, and those held though missing, sorted)
// cut to n: every address of now, then the held ones missed the fewest answers in a row; the
// ones left out leave missed too.
func fit(kept, now []netip.Addr, missed map[netip.Addr]int, n int) []netip.Addr {
	if len(kept) <= n {
		return kept
	}
	var extra []netip.Addr
	for _, a := range kept {
		if _, found := slices.BinarySearchFunc(now, a, netip.Addr.Compare); !found {
			extra = append(extra, a)
		}
	}
	slices.SortStableFunc(extra, func(a, b netip.Addr) int { return cmp.Compare(missed[a], missed[b]) })
	out := append(slices.Clone(now), extra[:n-len(now)]...)
	for _, a := range extra[n-len(now):] {
		delete(missed, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func (d *DNSSource) specs(addrs []netip.Addr) []endpoint.Spec {
	specs := make([]endpoint.Spec, len(addrs))
	for i, a := range addrs {
		e := d.Config.Endpoint
		e.URL = d.Config.URL(a.String())
		specs[i] = Spec(&e)
	}
	return specs
}

// addrOf is the address of an endpoint name this source made (scheme://address:port).
func addrOf(name string) (netip.Addr, bool) {
	u, err := url.Parse(name)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(u.Hostname())
	return a.Unmap(), err == nil
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
