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

// TestFailStatusType: a failure answers with an error type that fits its status: a 4xx set
// through POST /admin/faults (a 429 of a rate limiter, a 404) is not a server_error, as a 404
// was.
func TestFailStatusType(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Admin: true, Seed: 1}, 1)
	url := f.URLs()[0]
	comp := fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":2}`, DefaultModel)
	for _, tt := range []struct {
		status int
		typ    string
	}{
		{500, openai.TypeServer},
		{502, openai.TypeServer},
		{503, openai.TypeUnavailable},
		{404, openai.TypeNotFound},
		{429, openai.TypeInvalidRequest},
	} {
		if code, body := setFaults(t, url, fmt.Sprintf(`{"fail_rate":1,"fail_status":%d}`, tt.status)); code != http.StatusOK {
			t.Fatalf("POST /admin/faults fail_status %d = %d %s", tt.status, code, body)
		}
		resp, _ := post(t, url, "/v1/completions", comp)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error openai.Error }
		if resp.StatusCode != tt.status || json.Unmarshal(b, &e) != nil || e.Error.Type != tt.typ {
			t.Errorf("fail_status %d: %d %s, want %d %s", tt.status, resp.StatusCode, b, tt.status, tt.typ)
		}
	}
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
	for _, bad := range []string{`{"fail_rate":2}`, `{"nope":1}`, `{"slow":-1}`, `[`, `{"drop_all":true}`} {
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

// faultCount reads kvroute_sim_faults_total for one fault.
func faultCount(t *testing.T, url, fault string) float64 {
	t.Helper()
	for _, m := range scrape(t, url)["kvroute_sim_faults_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "fault" && l.GetValue() == fault {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no kvroute_sim_faults_total{fault=%q}", fault)
	return 0
}

// waitCount polls a fault's count until it reaches want (5 s at most).
func waitCount(t *testing.T, url, fault string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for got := faultCount(t, url, fault); got != want; got = faultCount(t, url, fault) {
		if time.Now().After(deadline) {
			t.Fatalf("kvroute_sim_faults_total{fault=%q} = %v after 5s, want %v", fault, got, want)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// oneShot posts body on a connection of its own (so that no request meets another's drop) and
// returns the status and body, or the error.
func oneShot(ctx context.Context, url, path, body string) (int, string, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestHang: a hanging instance holds API requests without an answer while /health answers; a
// client that leaves ends its request, and clearing the fault lets a held request run.
func TestHang(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Admin: true, Faults: Faults{Hang: true}}, 1)
	url := f.URLs()[0]
	body := chatBody(DefaultModel, "are you there", true, 3, "")

	// A client that gives up: its request ends (Close would wait for it otherwise).
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if code, b, err := oneShot(ctx, url, "/v1/chat/completions", body); err == nil {
		t.Errorf("hang: answered %d %s, want no answer", code, b)
	}
	if got := status(t, url, "/health"); got != http.StatusOK {
		t.Errorf("hang: /health = %d, want 200", got)
	}

	// A held request runs once the fault is cleared.
	type answer struct {
		code int
		body string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		code, b, err := oneShot(context.Background(), url, "/v1/chat/completions", body)
		got <- answer{code, b, err}
	}()
	waitCount(t, url, "hang", 2)
	select {
	case a := <-got:
		t.Fatalf("hang: answered %+v while the fault is set", a)
	default:
	}
	if code, b := setFaults(t, url, `{"hang":false}`); code != http.StatusOK {
		t.Fatalf("clear hang: %d %s", code, b)
	}
	select {
	case a := <-got:
		if a.err != nil || a.code != http.StatusOK || !strings.Contains(a.body, "data: [DONE]") {
			t.Errorf("after the hang: %d %q %v, want a complete stream", a.code, a.body, a.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held request did not run within 10s of clearing the fault")
	}
}

// TestDropOn: a request whose body holds the drop_on text loses its connection once read,
// counted once; other requests are served (their bodies reach the handler whole).
func TestDropOn(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Faults: Faults{DropOn: "POISON"}}, 1)
	url := f.URLs()[0]
	ctx := context.Background()
	if code, b, err := oneShot(ctx, url, "/v1/chat/completions", chatBody(DefaultModel, "a harmless question", false, 2, "")); err != nil || code != http.StatusOK || !strings.Contains(b, `"chat.completion"`) {
		t.Errorf("harmless request: %d %s %v, want 200", code, b, err)
	}
	if code, b, err := oneShot(ctx, url, "/v1/chat/completions", chatBody(DefaultModel, "the POISON question", false, 2, "")); err == nil {
		t.Errorf("poisoned request: %d %s, want a dropped connection", code, b)
	}
	if got := faultCount(t, url, "drop_on"); got != 1 {
		t.Errorf("drop_on struck %v times, want 1", got)
	}
	if code, _, err := oneShot(ctx, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"after","max_tokens":2}`, DefaultModel)); err != nil || code != http.StatusOK {
		t.Errorf("after the drop: %d %v, want 200", code, err)
	}
}

// TestDropAll: with drop_all, a query of death drops the streams in flight too (no [DONE], their
// blocks freed), and the instance serves new requests at once.
func TestDropAll(t *testing.T) {
	f := startFleet(t, Options{TimeScale: 0.1, Faults: Faults{DropOn: "POISON", DropAll: true}}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	// 5000 tokens of decode take a minute of model time: the stream is in flight at the crash.
	resp, _ := post(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":5000}`, DefaultModel, text("victim", 300)))
	defer resp.Body.Close()
	rd := openai.NewSSEReader(resp.Body, 1<<16)
	if _, err := rd.Next(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	if _, _, err := oneShot(context.Background(), url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"POISON","max_tokens":2}`, DefaultModel)); err == nil {
		t.Error("poisoned request answered, want a dropped connection")
	}
	var err error
	for range 100000 {
		var ev openai.Event
		if ev, err = rd.Next(); err != nil {
			break
		}
		if ev.IsDone() {
			t.Fatal("the stream in flight reached [DONE] after the crash")
		}
	}
	if err == nil || err == io.EOF {
		t.Errorf("stream in flight ended with %v, want its connection dropped", err)
	}
	waitIdle(t, in)
	if code, _, err := oneShot(context.Background(), url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"after","max_tokens":2}`, DefaultModel)); err != nil || code != http.StatusOK {
		t.Errorf("after the crash: %d %v, want 200", code, err)
	}
}
