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
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
	"go.uber.org/goleak"
)

// zmq4 v0.17.0 never stops a PUB socket's writer goroutine (its Close does not close it).
var zmqPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

func startFleet(t *testing.T, opts Options, n int) *Fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := StartFleet(ctx, opts, n, "127.0.0.1", 0)
	if err != nil {
		t.Fatalf("StartFleet: %v", err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

// text returns n tokens' worth (4n bytes) of prompt text that starts with tag.
func text(tag string, n int) string {
	var b strings.Builder
	b.WriteString(tag)
	for i := 0; b.Len() < 4*n; i++ {
		fmt.Fprintf(&b, " w%d", i%97)
	}
	return b.String()[:4*n]
}

func chatBody(model, content string, stream bool, maxTokens int, extra string) string {
	c, _ := json.Marshal(content)
	m, _ := json.Marshal(model)
	return fmt.Sprintf(`{"model":%s,"messages":[{"role":"user","content":%s}],"stream":%v,"max_tokens":%d%s}`, m, c, stream, maxTokens, extra)
}

type streamResult struct {
	status int
	header http.Header
	ttft   time.Duration // wall time to the first content chunk
	chunks []map[string]any
	done   bool
	text   string
	usage  *openai.Usage
}

func post(t *testing.T, url, path, body string) (*http.Response, time.Time) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp, start
}

func streamCall(t *testing.T, url, path, body string) streamResult {
	t.Helper()
	resp, start := post(t, url, path, body)
	defer resp.Body.Close()
	res := streamResult{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	rd := openai.NewSSEReader(resp.Body, 1<<16)
	var sb strings.Builder
	for range 100000 {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		if ev.IsDone() {
			res.done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(ev.Data, &m); err != nil {
			t.Fatalf("chunk %q: %v", ev.Data, err)
		}
		res.chunks = append(res.chunks, m)
		if u, ok := openai.FindUsage(ev.Data); ok {
			res.usage = &u
		}
		for _, c := range m["choices"].([]any) {
			ch := c.(map[string]any)
			s, _ := ch["text"].(string)
			if d, ok := ch["delta"].(map[string]any); ok {
				s, _ = d["content"].(string)
			}
			if s != "" && res.ttft == 0 {
				res.ttft = time.Since(start)
			}
			sb.WriteString(s)
		}
	}
	res.text = sb.String()
	return res
}

func TestChatNonStreaming(t *testing.T) {
	fixed := time.Unix(1700000000, 0)
	f := startFleet(t, Options{Profile: "instant", Seed: 7, Now: func() time.Time { return fixed }}, 1)
	url := f.URLs()[0]
	body := chatBody(DefaultModel, text("hello", 100), false, 5, "")
	var first map[string]any
	for i := range 2 {
		resp, _ := post(t, url, "/v1/chat/completions", body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if resp.Header.Get("X-Request-Id") == "" {
			t.Error("no x-request-id header")
		}
		var got map[string]any
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(got["id"].(string), "chatcmpl-") || got["object"] != "chat.completion" ||
			got["model"] != DefaultModel || got["created"] != float64(fixed.Unix()) {
			t.Errorf("response head = id %v object %v model %v created %v", got["id"], got["object"], got["model"], got["created"])
		}
		ch := got["choices"].([]any)[0].(map[string]any)
		msg := ch["message"].(map[string]any)
		if ch["finish_reason"] != "length" || msg["role"] != "assistant" || len(msg["content"].(string)) != 5*4 {
			t.Errorf("choice = %v", ch)
		}
		// 100 prompt tokens = 6 full blocks of 16; the second request hits them all (96 tokens).
		wantCached := 0.0
		if i == 1 {
			wantCached = 96
			if msg["content"] != first["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"] {
				t.Error("the same request generated different text")
			}
		}
		wantUsage := map[string]any{"prompt_tokens": 100.0 + 0, "completion_tokens": 5.0, "total_tokens": 105.0,
			"prompt_tokens_details": map[string]any{"cached_tokens": wantCached}}
		// the chat rendering adds the role tags: count them from the canonical prompt
		req, err := openai.Parse(openai.KindChat, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		p := float64((len(req.CanonicalPrompt()) + 3) / 4)
		wantUsage["prompt_tokens"], wantUsage["total_tokens"] = p, p+5
		if diff := cmp.Diff(wantUsage, got["usage"]); diff != "" {
			t.Errorf("request %d usage (-want +got):\n%s", i, diff)
		}
		first = got
	}
}

func TestStreamingShapes(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant"}, 1)
	url := f.URLs()[0]

	chat := streamCall(t, url, "/v1/chat/completions", chatBody(DefaultModel, "hi there", true, 3, `,"stream_options":{"include_usage":true}`))
	if !chat.done || len(chat.text) != 12 {
		t.Errorf("chat stream: done %v text %q, want [DONE] and 3 tokens of 4 bytes", chat.done, chat.text)
	}
	// role chunk, 3 token chunks, usage chunk
	if len(chat.chunks) != 5 {
		t.Fatalf("chat stream: %d chunks, want 5: %v", len(chat.chunks), chat.chunks)
	}
	role := chat.chunks[0]["choices"].([]any)[0].(map[string]any)["delta"]
	if diff := cmp.Diff(map[string]any{"role": "assistant", "content": ""}, role); diff != "" {
		t.Errorf("role chunk (-want +got):\n%s", diff)
	}
	last := chat.chunks[3]["choices"].([]any)[0].(map[string]any)
	if last["finish_reason"] != "length" || chat.chunks[3]["object"] != "chat.completion.chunk" {
		t.Errorf("last token chunk = %v", chat.chunks[3])
	}
	if u := chat.usage; u == nil || u.CompletionTokens != 3 || u.PromptTokensDetails == nil || len(chat.chunks[4]["choices"].([]any)) != 0 {
		t.Errorf("usage chunk = %v", chat.chunks[4])
	}

	comp := streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"once upon a time","stream":true,"max_tokens":4}`, DefaultModel))
	if !comp.done || len(comp.chunks) != 4 || comp.usage != nil || len(comp.text) != 16 {
		t.Errorf("completion stream: done %v, %d chunks, usage %v, text %q", comp.done, len(comp.chunks), comp.usage, comp.text)
	}
	if comp.chunks[0]["object"] != "text_completion" || !strings.HasPrefix(comp.chunks[0]["id"].(string), "cmpl-") {
		t.Errorf("completion chunk = %v", comp.chunks[0])
	}
}

func TestErrors(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", MaxModelLen: 1000}, 1)
	url := f.URLs()[0]
	tests := []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"bad json", "/v1/chat/completions", `{"model":`, 400, ""},
		{"unknown model", "/v1/chat/completions", chatBody("nope", "hi", false, 1, ""), 404, "model"},
		{"too long", "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"hi","max_tokens":5000}`, DefaultModel), 400, "max_tokens"},
	}
	for _, tt := range tests {
		resp, _ := post(t, url, tt.path, tt.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status {
			t.Errorf("%s: status %d, want %d (%s)", tt.name, resp.StatusCode, tt.status, b)
			continue
		}
		var e struct{ Error openai.Error }
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
			t.Errorf("%s: error body %s: %v", tt.name, b, err)
		}
		if tt.param != "" && (e.Error.Param == nil || *e.Error.Param != tt.param) {
			t.Errorf("%s: param = %v, want %q", tt.name, e.Error.Param, tt.param)
		}
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string
		Data   []struct {
			ID, Object  string
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != DefaultModel || models.Data[0].MaxModelLen != 1000 {
		t.Errorf("/v1/models = %+v, %v", models, err)
	}
}

// TestTTFTMatchesModel checks a lone request's first token against the engine model's
// prediction, in real time and ten times faster.
func TestTTFTMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		scale  float64
		tokens int
	}{{1, 2000}, {0.1, 8000}} {
		t.Run(fmt.Sprint("scale=", tc.scale), func(t *testing.T) {
			f := startFleet(t, Options{TimeScale: tc.scale}, 1)
			in, url := f.Instances()[0], f.URLs()[0]
			body := fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":2}`, DefaultModel, text(fmt.Sprint(tc.scale), tc.tokens))
			want := in.Predict(tc.tokens, 0)
			// The best of five distinct prompts: a loaded test machine only ever adds delay.
			best := time.Duration(1 << 62)
			for i := range 5 {
				body := strings.Replace(body, `"prompt":"`, fmt.Sprintf(`"prompt":"%d`, i), 1)
				r := streamCall(t, url, "/v1/completions", body)
				best = min(best, time.Duration(float64(r.ttft)/tc.scale))
				if r.usage != nil {
					t.Errorf("usage without include_usage")
				}
			}
			// Above, 10 % plus 5 ms of real time: the scheduling delay of a loaded machine is
			// real time, and ten times faster it is ten times more model time (ratio 1.191
			// once at scale 0.1, load 11-16).
			slack := time.Duration(float64(5*time.Millisecond) / tc.scale)
			if ratio := float64(best) / float64(want); ratio < 0.9 || best > want+want/10+slack {
				t.Errorf("TTFT %v (model time), predicted %v: ratio %.3f, want within 10%% (+%v above)", best, want, ratio, slack)
			} else {
				t.Logf("TTFT %v (model time), predicted %v: ratio %.3f", best, want, ratio)
			}
		})
	}
}

func TestMetricsAgreeWithUsage(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", BlockSize: 16}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	var cached, prompt int
	shared := text("system", 300)
	for i := range 6 {
		body := chatBody(DefaultModel, shared+text(fmt.Sprint(" q", i%3), 50+i), true, 2, `,"stream_options":{"include_usage":true}`)
		r := streamCall(t, url, "/v1/chat/completions", body)
		if r.usage == nil {
			t.Fatal("no usage chunk")
		}
		cached += r.usage.PromptTokensDetails.CachedTokens
		prompt += r.usage.PromptTokens
	}
	st := in.Stats()
	if cached == 0 || int64(cached) != st.PrefixHitTokens || int64(prompt) != st.PrefixQueryTokens {
		t.Errorf("usage: cached %d of %d prompt tokens; engine: hits %d of %d queries", cached, prompt, st.PrefixHitTokens, st.PrefixQueryTokens)
	}
	fams := scrape(t, url)
	if got := fams["vllm:prefix_cache_hits_total"].GetMetric()[0].GetCounter().GetValue(); got != float64(cached) {
		t.Errorf("vllm:prefix_cache_hits_total = %v, want %d (sum of cached_tokens)", got, cached)
	}
	if got := fams["vllm:prefix_cache_queries_total"].GetMetric()[0].GetCounter().GetValue(); got != float64(prompt) {
		t.Errorf("vllm:prefix_cache_queries_total = %v, want %d (sum of prompt_tokens)", got, prompt)
	}
	if got := fams["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); got != 6 {
		t.Errorf("TTFT samples = %d, want 6", got)
	}
}

// TestMain checks that no test leaves a goroutine behind (servers, drivers, publishers,
// client connections): every test closes its fleet in t.Cleanup, which runs after a deferred
// goleak.VerifyNone would, so the check is done once for the package.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, zmqPubWriter)
}

func TestCacheSaltAndTokenPrompts(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant"}, 1)
	url := f.URLs()[0]
	prompt := text("salted", 200) // 12 full blocks: a hit is 192 tokens
	cached := func(extra string) int {
		t.Helper()
		r := streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"stream":true,"max_tokens":1,"stream_options":{"include_usage":true}%s}`, DefaultModel, prompt, extra))
		if r.usage == nil || r.usage.PromptTokens != 200 {
			t.Fatalf("usage = %+v, want 200 prompt tokens", r.usage)
		}
		return r.usage.PromptTokensDetails.CachedTokens
	}
	steps := []struct {
		extra string
		want  int
	}{
		{`,"cache_salt":"tenant-a"`, 0},
		{`,"cache_salt":"tenant-a"`, 192},
		{`,"cache_salt":"tenant-b"`, 0}, // another salt shares nothing
		{``, 0},
		{``, 192},
	}
	for i, s := range steps {
		if got := cached(s.extra); got != s.want {
			t.Errorf("step %d (%s): cached_tokens %d, want %d", i, s.extra, got, s.want)
		}
	}
	// Token-id prompts count one token per id.
	r := streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":[1,2,3,4,5],"stream":true,"max_tokens":2,"stream_options":{"include_usage":true}}`, DefaultModel))
	if r.usage == nil || r.usage.PromptTokens != 5 || r.usage.CompletionTokens != 2 {
		t.Errorf("token prompt usage = %+v, want 5 prompt and 2 completion tokens", r.usage)
	}
}

func TestShutdownDrainsStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := StartFleet(ctx, Options{TimeScale: 0.1}, 1, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	url := f.URLs()[0]
	resp, _ := post(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":"drain me","stream":true,"max_tokens":40}`, DefaultModel))
	defer resp.Body.Close()
	rd := openai.NewSSEReader(resp.Body, 1<<16)
	if _, err := rd.Next(); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() { shut <- f.Shutdown(ctx) }()
	done := false
	for range 1000 {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		if ev.IsDone() {
			done = true
		}
	}
	if !done {
		t.Error("the stream open at shutdown did not finish with [DONE]")
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if _, err := http.Get(url + "/health"); err == nil {
		t.Error("the fleet still answers after Shutdown")
	}
}

func TestBlockHashesMatchEngineWithSalt(t *testing.T) {
	prof, err := engine.LookupProfile("instant")
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Profile: prof, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []byte(text("salted hashes", 100)) // 6 full blocks of 16
	keys := prefix.ContentKeys(nil, prompt, 16)
	if len(keys) != 6 {
		t.Fatalf("%d keys, want 6", len(keys))
	}
	for _, salt := range []string{"", "tenant-a"} {
		want := eng.BlockHashes(engine.Request{PromptTokens: 100, BlockKeys: keys, Salt: salt})
		if diff := cmp.Diff(want, BlockHashes(prompt, 16, salt)); diff != "" {
			t.Errorf("salt %q (-engine +BlockHashes):\n%s", salt, diff)
		}
	}
}

func TestUnencryptedHTTP2(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant"}, 1)
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	body := fmt.Sprintf(`{"model":%q,"prompt":"h2","stream":true,"max_tokens":3}`, DefaultModel)
	resp, err := (&http.Client{Transport: tr}).Post(f.URLs()[0]+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.ProtoMajor != 2 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"text":" `) != 3 {
		t.Errorf("h2c stream: proto %s, err %v, body %q", resp.Proto, err, b)
	}
}

// TestStartFleetBadOptions: options every instance would refuse are refused once, before any
// port is taken, and the message names no instance (nor the package twice). Each field's
// problem is an OptionError naming the field, for a command to name its flag.
func TestStartFleetBadOptions(t *testing.T) {
	for _, tt := range []struct {
		opts   Options
		n      int
		want   string
		fields []string // of the OptionErrors
	}{
		{Options{Profile: "nope"}, 3, `simserver: profile nope: unknown profile: use one of `, []string{"Profile"}},
		{Options{Profile: "instnat"}, 3, `simserver: profile instnat: unknown profile (did you mean instant?): use one of `, []string{"Profile"}},
		{Options{Faults: Faults{FailRate: 2}}, 3, "simserver: faults: fail_rate 2: want a fraction in [0, 1]", []string{"Faults.FailRate"}},
		{Options{Faults: Faults{Slow: 0.5}}, 3, "simserver: faults: slow 0.5: want a factor >= 1 (0 for none)", []string{"Faults.Slow"}},
		{Options{Faults: Faults{FailStatus: 302}}, 3, "simserver: faults: fail_status 302: want an HTTP error status from 400 to 599, such as 500 or 503", []string{"Faults.FailStatus"}},
		{Options{TimeScale: -1, BlockSize: -1}, 3, "simserver: time scale -1: want a positive factor (0.1 runs ten times faster)\nblock size -1: ", []string{"TimeScale", "BlockSize"}},
		// Said by each instance as it started, after "simserver: instance 0: simserver: ".
		{Options{KVEvents: "bogus"}, 1, `simserver: kv events endpoint "bogus": want tcp://HOST:PORT (or ipc://, inproc://)`, []string{"KVEvents"}},
		{Options{KVEvents: "tcp://127.0.0.1:0", KVEventsReplay: "udp://x"}, 1, `simserver: kv events replay endpoint "udp://x": want tcp://HOST:PORT`, []string{"KVEventsReplay"}},
		// Said by instance 1 as it started.
		{Options{KVEvents: "inproc://kv"}, 2, `simserver: kv events endpoint "inproc://kv": want tcp://HOST:PORT for a fleet of more than one instance`, []string{"KVEvents"}},
	} {
		f, err := StartFleet(context.Background(), tt.opts, tt.n, "127.0.0.1", 0)
		if err == nil {
			_ = f.Close()
			t.Errorf("%+v: started, want %q", tt.opts, tt.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), tt.want) || strings.Contains(err.Error(), "instance 0") || strings.Contains(err.Error(), "instance 1") || strings.Count(err.Error(), "simserver") != 1 {
			t.Errorf("%+v: %v, want %q", tt.opts, err, tt.want)
		}
		var fields []string
		var walk func(error)
		walk = func(e error) {
			switch w := e.(type) {
			case *OptionError:
				fields = append(fields, w.Field)
			case interface{ Unwrap() []error }:
				for _, inner := range w.Unwrap() {
					walk(inner)
				}
			case interface{ Unwrap() error }:
				walk(w.Unwrap())
			}
		}
		walk(err)
		if diff := cmp.Diff(tt.fields, fields); diff != "" {
			t.Errorf("%+v: fields of the OptionErrors (-want +got):\n%s", tt.opts, diff)
		}
	}
}
