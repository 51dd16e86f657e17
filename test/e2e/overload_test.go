package e2e

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

// TestTenantOverloadQueue: while the only endpoint is saturated (a long prefill queued on it
// predicts a TTFT over overload.max_predicted_ttft), a request waits in the admission queue
// and gets 503 with Retry-After after overload.max_wait; one that finds the queue full gets
// 503 at once; once the long request is done, requests go through again.
func TestTenantOverloadQueue(t *testing.T) {
	s := startTenantStack(t, 1, simserver.Options{Profile: "llama3-70b-h100-tp4", DefaultMaxTokens: 2},
		"overload: {max_predicted_ttft: 500ms, max_wait: 300ms, queue_size: 1}\n"+tenantYAML(nil, "a=sk-a", "b=sk-b"), nil)
	// About 32k tokens: seconds of prefill on this profile, 3.2 s predicted at 10k tokens/s (the
	// prefix-aware policy's prior prefill rate, which the router gives the gate).
	// Not streamed: the router counts its prefill as queued until the answer comes.
	long := chatJSON(strings.Repeat("lorem ipsum dolor sit amet ", 4800), "")
	req, _ := http.NewRequest(http.MethodPost, s.api+"/v1/chat/completions", strings.NewReader(long))
	req.Header.Set("Authorization", "Bearer sk-a")
	longDone := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			longDone <- 0
			return
		}
		defer resp.Body.Close()
		_, _ = bufio.NewReader(resp.Body).WriteTo(&strings.Builder{})
		longDone <- resp.StatusCode
	}()
	ep := s.router.Pool().All()[0]
	deadline := time.Now().Add(10 * time.Second)
	for ep.PendingPrefill() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if ep.PendingPrefill() == 0 {
		t.Fatal("the long request never reached the endpoint")
	}

	waited := make(chan chatResult, 1)
	start := time.Now()
	go func() { waited <- postNoFatal(s.api, "sk-b", chatJSON("short", "")) }()
	for s.gate.Waiting() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	full := post(t, s.api, "sk-a", chatJSON("short", ""))
	if full.status != http.StatusServiceUnavailable || full.header.Get("Retry-After") == "" || !strings.Contains(full.body, `"overloaded"`) {
		t.Errorf("queue full: %d Retry-After %q %s; want 503 with Retry-After", full.status, full.header.Get("Retry-After"), full.body)
	}
	w := <-waited
	if el := time.Since(start); w.status != http.StatusServiceUnavailable || w.header.Get("Retry-After") == "" || el < 300*time.Millisecond {
		t.Errorf("waited: %d Retry-After %q after %v; want 503 with Retry-After after max_wait 300ms (%s)", w.status, w.header.Get("Retry-After"), el, w.body)
	}
	select {
	case st := <-longDone:
		if st != http.StatusOK {
			t.Errorf("the long request: %d, want 200", st)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the long request did not end")
	}
	if r := post(t, s.api, "sk-b", chatJSON("short", "")); r.status != http.StatusOK {
		t.Errorf("after the prefill: %d, want 200 (%s)", r.status, r.body)
	}
}

// postNoFatal is post for goroutines other than the test's: errors become status 0.
func postNoFatal(api, key, body string) chatResult {
	req, err := http.NewRequest(http.MethodPost, api+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return chatResult{}
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return chatResult{body: err.Error()}
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return chatResult{status: resp.StatusCode, header: resp.Header, body: b.String()}
}
