package discovery

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnusable(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		usable bool
	}{
		{"10.0.0.1", true},
		{"192.168.1.5", true},
		{"127.0.0.1", true}, // an engine beside the router, and the tests
		{"::1", true},
		{"fd00::5", true},
		{"2001:db8::1", true},
		{"100.64.0.1", true},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"::", false},
		{"::ffff:0.0.0.0", false},
		{"224.0.0.1", false},
		{"239.255.255.250", false},
		{"ff02::1", false},
		{"ff05::2", false},
		{"255.255.255.255", false},
		{"169.254.169.254", false},
		{"::ffff:169.254.169.254", false},
		{"fe80::1", false},
		{"fe80::1%eth0", false},
	} {
		why := Unusable(netip.MustParseAddr(tc.addr))
		if (why == "") != tc.usable {
			t.Errorf("Unusable(%s) = %q, want usable %v", tc.addr, why, tc.usable)
		}
	}
	if why := Unusable(netip.Addr{}); why == "" {
		t.Error("the zero Addr is usable")
	}
	own := func(a netip.AddrPort) bool { return a == netip.MustParseAddrPort("10.0.0.9:8080") }
	if why := Check(netip.MustParseAddr("::ffff:10.0.0.9"), 8080, own); why != Excluded {
		t.Errorf("Check of the router's own address = %q, want %q", why, Excluded)
	}
	if why := Check(netip.MustParseAddr("10.0.0.9"), 8000, own); why != "" {
		t.Errorf("Check of another port = %q, want usable", why)
	}
}

func TestLogNames(t *testing.T) {
	if diff := cmp.Diff([]string{"a", "b"}, LogNames([]string{"a", "b"}, 2)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a", "b", "and 3 more"}, LogNames([]string{"a", "b", "c", "d", "e"}, 2)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	added, removed := Changes([]string{"a", "b", "c"}, []string{"b", "c", "d", "e"})
	if diff := cmp.Diff([][]string{{"d", "e"}, {"a"}}, [][]string{added, removed}); diff != "" {
		t.Errorf("Changes (-want +got):\n%s", diff)
	}
}
