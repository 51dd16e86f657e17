package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExtProc(t *testing.T) {
	c, err := Parse([]byte("extproc: {listen: ':9002', health_listen: ':9003'}\nendpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ExtProc{Listen: ":9002", HealthListen: ":9003"}, c.ExtProc); diff != "" || !c.ExtProc.Enabled() {
		t.Errorf("extproc (-want +got):\n%s", diff)
	}
	c, err = Parse([]byte("endpoints: [{url: http://127.0.0.1:1}]\n"))
	if err != nil || c.ExtProc.Enabled() {
		t.Errorf("absent: %+v, %v: want off", c, err)
	}
	// Port 0 is a free port each time: no clash.
	if _, err := Parse([]byte("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nextproc: {listen: 127.0.0.1:0, health_listen: 127.0.0.1:0}\nendpoints: [{url: http://127.0.0.1:1}]\n")); err != nil {
		t.Errorf("port 0 everywhere: %v", err)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"extproc: {health_listen: ':9003'}", "extproc.health_listen: set without extproc.listen"},
		{"extproc: {listen: '9002'}", `extproc.listen: "9002" is not host:port`},
		{"extproc: {listen: ':9002', health_listen: 'x'}", `extproc.health_listen: "x" is not host:port`},
		{"extproc: {listen: '127.0.0.1:9090'}", `extproc.listen: "127.0.0.1:9090" is also admin_listen`},
		{"extproc: {listen: ':9002', health_listen: ':9002'}", `extproc.health_listen: ":9002" is also extproc.listen`},
		{"extproc: {listen: ':9002', tls: {self_signed: true, cert_file: c.pem, key_file: k.pem}}", "extproc.tls: self_signed and certificate files both set"},
		{"extproc: {listen: ':9002', tls: {cert_file: c.pem}}", "extproc.tls.key_file: missing"},
		{"extproc: {listen: ':9002', max_endpoints: -1}", "extproc.max_endpoints: -1 is negative"},
		{"extproc: {listen: ':9002', grpc: true}", `extproc.grpc: unknown key "grpc"`},
	} {
		_, err := Parse([]byte(tc.yaml + "\nendpoints: [{url: http://127.0.0.1:1}]\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.yaml, err, tc.want)
		}
	}
}
