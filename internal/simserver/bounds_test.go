package simserver

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/openai"
)

// A completion's length is bounded by its max_tokens alone, as vLLM's and SGLang's
// CompletionRequest read it (neither declares max_completion_tokens; vLLM logs it as ignored):
// a chat's by the larger of max_tokens and max_completion_tokens. Before b24e302 the simulator
// took max_completion_tokens on completions too, and answered the QA's
// {"prompt":"hello","max_completion_tokens":60,"max_tokens":50}, which the router had held to a
// tenant's cap of 50, with 60 tokens.
func TestCompletionBoundIsMaxTokens(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", DefaultMaxTokens: 7}, 1)
	url := f.URLs()[0]
	const msgs = `"messages":[{"role":"user","content":"hello"}]`
	for _, tc := range []struct {
		path, members string
		want          int
	}{
		{"/v1/completions", `"max_completion_tokens":60,"max_tokens":50`, 50},
		{"/v1/completions", `"max_completion_tokens":60`, 7}, // the default: no bound read
		{"/v1/completions", `"max_tokens":50,"max_completion_tokens":3`, 50},
		{"/v1/chat/completions", `"max_completion_tokens":60,"max_tokens":50`, 60},
		{"/v1/chat/completions", `"max_completion_tokens":60`, 60},
	} {
		body := fmt.Sprintf(`{"model":%q,"prompt":"hello",%s}`, DefaultModel, tc.members)
		if tc.path == "/v1/chat/completions" {
			body = fmt.Sprintf(`{"model":%q,%s,%s}`, DefaultModel, msgs, tc.members)
		}
		for _, stream := range []bool{false, true} {
			var got int
			if stream {
				r := streamCall(t, url, tc.path, body[:len(body)-1]+`,"stream":true,"stream_options":{"include_usage":true}}`)
				if r.usage == nil {
					t.Fatalf("%s %s: no usage", tc.path, body)
				}
				got = r.usage.Completion()
			} else {
				u := nonStreamed(t, url, tc.path, body)
				got = u.Completion()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s %s stream %v: completion tokens (-want +got):\n%s", tc.path, body, stream, diff)
			}
		}
	}
}

// nonStreamed posts body to path, wants a 200, and returns the answer's usage.
func nonStreamed(t *testing.T, url, path, body string) openai.Usage {
	t.Helper()
	resp, _ := post(t, url, path, body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s %s: status %d: %s", path, body, resp.StatusCode, b)
	}
	u, ok := openai.FindUsage(b)
	if !ok {
		t.Fatalf("POST %s %s: no usage in %s", path, body, b)
	}
	return u
}
