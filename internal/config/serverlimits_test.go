package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestParse_ServerLimits: server.body_stall_timeout, max_pending_body_bytes and max_connections
// are read as given, unset they are 0 (resolved where the server starts; BodyStall gives the
// stall's default), and values that could not work are errors naming the key.
func TestParse_ServerLimits(t *testing.T) {
	c, err := Parse([]byte("server: {body_stall_timeout: 3s, max_pending_body_bytes: 67108864, max_connections: 500}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := []any{c.Server.BodyStall(), c.Server.MaxPendingBodyBytes, c.Server.MaxConnections}
	if diff := cmp.Diff([]any{3 * time.Second, int64(64 << 20), 500}, got); diff != "" {
		t.Errorf("body_stall_timeout, max_pending_body_bytes, max_connections (-want +got):\n%s", diff)
	}
	c, err = Parse([]byte("endpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got = []any{c.Server.BodyStall(), c.Server.MaxPendingBodyBytes, c.Server.MaxConnections}
	if diff := cmp.Diff([]any{DefaultBodyStallTimeout, int64(0), 0}, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	for in, want := range map[string]string{
		"server: {body_stall_timeout: -1s}":                                   "server.body_stall_timeout: -1s is negative",
		"server: {max_pending_body_bytes: -1}":                                "server.max_pending_body_bytes: -1 is negative",
		"server: {max_pending_body_bytes: 1048576}":                           "server.max_pending_body_bytes: 1048576 is less than limits.max_body_bytes (16777216)",
		"server: {max_connections: -2}":                                       "server.max_connections: -2 is negative",
		"server: {admin_max_connections: -1}":                                 "server.admin_max_connections: -1 is negative",
		"limits: {max_body_bytes: 100}\nserver: {max_pending_body_bytes: 99}": "server.max_pending_body_bytes: 99 is less than limits.max_body_bytes (100)",
	} {
		_, err := Parse([]byte(in + "\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
}

// TestParse_AdminMaxConnections: server.admin_max_connections is read as given; unset it is 0,
// resolved where the server starts.
func TestParse_AdminMaxConnections(t *testing.T) {
	for in, want := range map[string]int{"server: {admin_max_connections: 16}\n": 16, "": 0} {
		c, err := Parse([]byte(in + "endpoints: [{url: http://127.0.0.1:1}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Server.AdminMaxConnections; got != want {
			t.Errorf("%q: admin_max_connections %d, want %d", in, got, want)
		}
	}
}
