package simserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/openai"
)

func setFaults(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url+"/admin/faults", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func status(t *testing.T, url, path string) int {
	t.Helper()
	resp, err := http.Get(url + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestAdminFaults(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Admin: true, Seed: 1}, 1)
	url := f.URLs()[0]
	comp := fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, DefaultModel)

	if got := status(t, url, "/health"); got != http.StatusOK {
		t.Fatalf("/health = %d, want 200", got)
	}
	if code, body := setFaults(t, url, `{"unhealthy":true}`); code != http.StatusOK {
		t.Fatalf("POST /admin/faults = %d %s", code, body)
	}
	if got := status(t, url, "/health"); got != http.StatusServiceUnavailable {
		t.Errorf("unhealthy: /health = %d, want 503", got)
	}
	// Partial updates merge; bad input is a 400 naming the problem and changes nothing.
	if code, _ := setFaults(t, url, `{"fail_rate":1,"fail_status":500}`); code != http.StatusOK {
		t.Fatalf("set fail_rate: %d", code)
	}
	for _, bad := range []string{`{"fail_rate":2}`, `{"nope":1}`, `{"slow":-1}`, `[`} {
		if code, body := setFaults(t, url, bad); code != http.StatusBadRequest || !strings.Contains(body, "error") {
			t.Errorf("POST %s = %d %s, want 400 with an error body", bad, code, body)
		}
	}
	want := Faults{Unhealthy: true, FailRate: 1, FailStatus: 500}
	if diff := cmp.Diff(want, f.Instances()[0].Faults()); diff != "" {
		t.Errorf("faults (-want +got):\n%s", diff)
	}
	resp, _ := post(t, url, "/v1/completions", comp)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error openai.Error }
	if resp.StatusCode != 500 || json.Unmarshal(b, &e) != nil || e.Error.Type != openai.TypeServer {
		t.Errorf("fail_rate 1: %d %s, want 500 server_error", resp.StatusCode, b)
	}

	// Half the requests fail at rate 0.5 (seeded draws; bounds loose enough for any seed).
	if code, _ := setFaults(t, url, `{"unhealthy":false,"fail_rate":0.5,"fail_status":503}`); code != 200 {
		t.Fatal("set fail_rate 0.5")
	}
	failed := 0
	for range 40 {
		resp, _ := post(t, url, "/v1/completions", comp)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 503 {
			failed++
		} else if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if failed < 8 || failed > 32 {
		t.Errorf("fail_rate 0.5: %d of 40 failed", failed)
	}

	// Refuse: the connection closes without an answer.
	if code, _ := setFaults(t, url, `{"fail_rate":0,"refuse":true}`); code != 200 {
		t.Fatal("set refuse")
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	if resp, err := (&http.Client{Transport: tr}).Post(url+"/v1/completions", "application/json", strings.NewReader(comp)); err == nil {
		resp.Body.Close()
		t.Errorf("refuse: got status %d, want a connection error", resp.StatusCode)
	}
	if got := status(t, url, "/health"); got != http.StatusOK {
		t.Errorf("refuse: /health = %d, want 200 (only the API refuses)", got)
	}
}

func TestCutAfter(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Faults: Faults{CutAfter: 3}}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	resp, _ := post(t, url, "/v1/chat/completions", chatBody(DefaultModel, "tell me", true, 10, ""))
	rd := openai.NewSSEReader(resp.Body, 1<<16)
	tokens, done := 0, false
	var err error
	for range 100 {
		var ev openai.Event
		if ev, err = rd.Next(); err != nil {
			break
		}
		if ev.IsDone() {
			done = true
		} else if strings.Contains(string(ev.Data), `"content":" `) {
			tokens++
		}
	}
	resp.Body.Close()
	if tokens != 3 || done || err == io.EOF {
		t.Errorf("cut stream: %d tokens, [DONE] %v, end %v; want 3 tokens, no [DONE], an unexpected end", tokens, done, err)
	}
	// Non-streaming: the connection closes without an answer.
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":"x","max_tokens":10}`, DefaultModel)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Errorf("cut non-streaming: status %d, want a connection error", resp.StatusCode)
	}
	waitIdle(t, in)
}

// waitIdle polls until the instance holds no request and no block.
func waitIdle(t *testing.T, in *Instance) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := in.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.UsedBlocks == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance still busy after 5s: %+v", st)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

func TestClientDisconnectFreesBlocks(t *testing.T) {
	f := startFleet(t, Options{TimeScale: 0.1}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 5000 tokens of decode take a minute of model time: the client leaves long before.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions",
		strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":5000}`, DefaultModel, text("leave", 500))))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := openai.NewSSEReader(resp.Body, 1<<16)
	if _, err := rd.Next(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	// The stats are published by the driver after it hands out the step's events, so the
	// first chunk can reach us a moment before they show the running request: poll.
	deadline := time.Now().Add(5 * time.Second)
	for st := in.Stats(); st.Running != 1 || st.UsedBlocks == 0; st = in.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("while streaming: %+v, want one running request holding blocks", st)
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	cancel()
	resp.Body.Close()
	waitIdle(t, in)
	if st := in.Stats(); st.CachedFreeBlocks == 0 {
		t.Errorf("the aborted prompt's blocks should stay cached: %+v", st)
	}
}

func TestSlowStretchesModelTime(t *testing.T) {
	f := startFleet(t, Options{TimeScale: 0.1, Faults: Faults{Slow: 3}}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	r := streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":1}`, DefaultModel, text("slow", 1000)))
	want := 3 * in.Predict(1000, 0)
	got := time.Duration(float64(r.ttft) / 0.1)
	// A loaded machine only adds delay: the lower bound is the check that wall time stretched.
	if got < want*9/10 {
		t.Errorf("slow 3: TTFT %v (model time), want at least %v", got, want*9/10)
	}
	h := scrape(t, url)["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram()
	if s := time.Duration(h.GetSampleSum() * float64(time.Second)); s < want*99/100 || s > want*101/100 {
		t.Errorf("reported TTFT %v, want %v (stretched model time)", s, want)
	}
}
