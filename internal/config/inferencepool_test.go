package config

import (
	"time"

	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse_InferencePool(t *testing.T) {
	c, err := Parse([]byte(`
auth: {mode: none}
discovery:
  inference_pool: {name: " llama3-70b ", endpoint: {engine: vllm, models: [llama3-70b]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &InferencePoolDiscovery{Name: "llama3-70b", Scheme: "http", Grace: Duration(5 * time.Minute), Endpoint: Endpoint{Engine: "vllm", Models: []string{"llama3-70b"}}}
	if diff := cmp.Diff(want, c.Discovery.InferencePool); diff != "" {
		t.Errorf("discovery.inference_pool (-want +got):\n%s", diff)
	}
	c, err = Parse([]byte(`
auth: {mode: none}
endpoints: [{url: "http://127.0.0.1:8001"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Discovery.InferencePool != nil {
		t.Errorf("discovery.inference_pool %+v without the key: want none", c.Discovery.InferencePool)
	}
}

func TestParse_InferencePoolProblems(t *testing.T) {
	for _, tc := range []struct {
		name, pool string
		want       []string
	}{
		{"empty", "{}", []string{"discovery.inference_pool.name: missing: give the InferencePool's name"}},
		{"bad names", `{name: "Llama_3", namespace: "Bad NS", scheme: ftp, grace: -1m}`, []string{
			`discovery.inference_pool.grace: -1m0s is negative`,
			`discovery.inference_pool.name: "Llama_3" is not an InferencePool name`,
			`discovery.inference_pool.namespace: "Bad NS" is not a namespace name`,
			`discovery.inference_pool.scheme: "ftp": use http or https`,
		}},
		{"template", `{name: llama, endpoint: {url: "http://x:1", engine: vlm}}`, []string{
			"discovery.inference_pool.endpoint.url: remove it",
			`discovery.inference_pool.endpoint.engine: unknown engine "vlm"`,
		}},
		{"misspelt", `{name: llama, namspace: x}`, []string{`discovery.inference_pool.namspace: unknown key "namspace"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("discovery:\n  inference_pool: " + tc.pool + "\n"))
			if err == nil {
				t.Fatal("want an error")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q; got:\n%s", w, msg)
				}
			}
			if strings.Contains(msg, "no endpoints") {
				t.Errorf("discovery.inference_pool alone is a source of endpoints: %s", msg)
			}
		})
	}
}
