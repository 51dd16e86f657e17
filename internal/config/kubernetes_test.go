package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse_Kubernetes(t *testing.T) {
	c, err := Parse([]byte(`
auth: {mode: none}
discovery:
  kubernetes:
    - {service: vllm, port_name: http, pod_metadata: true, endpoint: {models: [llama3-70b]}}
    - {namespace: peers, selector: "app.kubernetes.io/name=kvroute,tier in (a,b)", port: 7946, scheme: https}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []KubernetesDiscovery{
		{Service: "vllm", PortName: "http", Scheme: "http", PodMetadata: true, MaxEndpoints: DefaultMaxEndpoints, Endpoint: Endpoint{Models: []string{"llama3-70b"}}},
		{Namespace: "peers", Selector: "app.kubernetes.io/name=kvroute,tier in (a,b)", Port: 7946, Scheme: "https", MaxEndpoints: DefaultMaxEndpoints},
	}
	if diff := cmp.Diff(want, c.Discovery.Kubernetes); diff != "" {
		t.Errorf("discovery.kubernetes (-want +got):\n%s", diff)
	}
	if got := c.Discovery.Kubernetes[1].Key(); got != "peers/app.kubernetes.io/name=kvroute,tier in (a,b)" {
		t.Errorf("Key() = %q", got)
	}
	if got := c.Discovery.Kubernetes[0].Key(); got != "vllm" {
		t.Errorf("Key() = %q", got)
	}
}

func TestParse_KubernetesProblems(t *testing.T) {
	const bad = `
discovery:
  kubernetes:
    - {}
    - {service: vllm, selector: app=vllm}
    - {service: VLLM_svc, namespace: "Bad NS", port_name: "http port", port: 70000, scheme: ftp}
    - {selector: "app in (", endpoint: {url: "http://x:1", engine: vlm}}
    - {service: vllm, port_name: http, port: 8000}
    - {service: a}
    - {service: a}
`
	// A misspelt key is a decoding error, reported before validation.
	_, err := Parse([]byte(bad + "    - {service: b, kubernets: true}\n"))
	if err == nil || !strings.Contains(err.Error(), `discovery.kubernetes[7].kubernets: unknown key "kubernets"`) {
		t.Errorf("the misspelt key is not named: %v", err)
	}
	_, err = Parse([]byte(bad))
	if err == nil {
		t.Fatal("want an error")
	}
	msg := err.Error()
	for _, want := range []string{
		"discovery.kubernetes[0]: give service (a Service name, like vllm) or selector",
		"discovery.kubernetes[1]: give service or selector, not both",
		`discovery.kubernetes[2].service: "VLLM_svc" is not a Service name`,
		`discovery.kubernetes[2].namespace: "Bad NS" is not a namespace name`,
		`discovery.kubernetes[2].port_name: "http port" is not a port name`,
		"discovery.kubernetes[2].port: give port_name or port, not both",
		"discovery.kubernetes[2].port: 70000 is not a port",
		`discovery.kubernetes[2].scheme: "ftp": use http or https`,
		`discovery.kubernetes[3].selector: "app in (" does not parse`,
		"discovery.kubernetes[3].endpoint.url: remove it",
		`discovery.kubernetes[3].endpoint.engine: unknown engine "vlm"`,
		"discovery.kubernetes[4].port: give port_name or port, not both",
		"discovery.kubernetes[6]: watches the same slices and port as discovery.kubernetes[5]: remove one",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q; got:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "no endpoints") {
		t.Errorf("discovery.kubernetes alone is a source of endpoints: %s", msg)
	}
}
