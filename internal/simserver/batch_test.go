package simserver

import (
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
)

// choiceOut is what a test reads of one choice.
type choiceOut struct {
	Index  int
	Text   string
	Finish string
}

// completionAs posts a completion, streamed or not as its body asks (stream says which), and
// returns its choices and usage; a stream must end with [DONE] and carry usage.
func completionAs(t *testing.T, url, body string, stream bool) ([]choiceOut, openai.Usage) {
	t.Helper()
	if !stream {
		return completion(t, url, body)
	}
	r := streamCall(t, url, "/v1/completions", body)
	if !r.done || r.usage == nil {
		t.Fatalf("stream: done %v usage %v", r.done, r.usage)
	}
	return streamedChoices(t, r), *r.usage
}

// completion posts a non-streamed completion and returns its choices and usage.
func completion(t *testing.T, url, body string) ([]choiceOut, openai.Usage) {
	t.Helper()
	resp, _ := post(t, url, "/v1/completions", body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var got struct {
		Object  string
		Choices []struct {
			Index        int
			Text         string
			FinishReason string `json:"finish_reason"`
		}
		Usage openai.Usage
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if got.Object != "text_completion" {
		t.Errorf("object %q, want text_completion", got.Object)
	}
	out := make([]choiceOut, len(got.Choices))
	for i, c := range got.Choices {
		out[i] = choiceOut{Index: c.Index, Text: c.Text, Finish: c.FinishReason}
	}
	return out, got.Usage
}

// streamedChoices joins a completion stream's chunks into one choice per index (in index order),
// checking that every chunk has one choice and one id.
func streamedChoices(t *testing.T, r streamResult) []choiceOut {
	t.Helper()
	var out []choiceOut
	id := ""
	for _, ch := range r.chunks {
		if id == "" {
			id = ch["id"].(string)
		} else if ch["id"] != id {
			t.Errorf("chunk id %v, want %s as in the first chunk", ch["id"], id)
		}
		cs := ch["choices"].([]any)
		if len(cs) == 0 {
			continue // the usage chunk
		}
		if len(cs) != 1 {
			t.Fatalf("chunk with %d choices: %v", len(cs), ch)
		}
		c := cs[0].(map[string]any)
		i := int(c["index"].(float64))
		for len(out) <= i {
			out = append(out, choiceOut{Index: len(out)})
		}
		out[i].Text += c["text"].(string)
		if f, ok := c["finish_reason"].(string); ok {
			if out[i].Finish != "" {
				t.Errorf("choice %d: a second finish_reason %q", i, f)
			}
			out[i].Finish = f
		}
	}
	return out
}

// waitFinished polls until the engine has finished n requests (the driver publishes its stats
// after it has woken the handlers) and returns its stats.
func waitFinished(t *testing.T, in *Instance, n int64) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := in.Stats()
		if st.Finished >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s the engine finished %d requests, want %d", st.Finished, n)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

// TestCompletionPromptList sends completions whose prompt is a list: each prompt is its own
// engine request (its own prefix-cache lookup and first token) and gets its own choice, with
// the same text it would get alone; usage sums over the prompts.
func TestCompletionPromptList(t *testing.T) {
	a, b, c := text("alpha", 100), text("beta", 60), text("gamma", 35) // 6, 3 and 2 full blocks of 16
	tests := []struct {
		name    string
		prompt  string // JSON
		alone   []string
		output  int // max_tokens
		prompts int // engine requests
		tokens  int // prompt tokens in all
		cached  int // on a fresh instance
	}{
		{"three strings", fmt.Sprintf("[%q,%q,%q]", a, b, c), []string{a, b, c}, 3, 3, 195, 0},
		// The second copy of a hits the 6 blocks the first stored in the same step.
		{"a repeated prompt", fmt.Sprintf("[%q,%q]", a, a), []string{a, a}, 2, 2, 200, 96},
		{"a shared prefix", fmt.Sprintf("[%q,%q]", a, a+b), []string{a, a + b}, 2, 2, 260, 96},
		{"one-element list", fmt.Sprintf("[%q]", b), []string{b}, 4, 1, 60, 0},
		// Token ids render as 4 bytes each: 20 ids are one full block and a bit.
		{"token arrays", `[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21]]`, nil, 1, 2, 41, 16},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tt.name, stream), func(t *testing.T) {
				f := startFleet(t, Options{Profile: "instant", BlockSize: 16}, 1)
				in, url := f.Instances()[0], f.URLs()[0]
				body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":%d,"stream":%v,"stream_options":{"include_usage":true}}`, DefaultModel, tt.prompt, tt.output, stream)
				got, usage := completionAs(t, url, body, stream)
				wantUsage := openai.Usage{PromptTokens: tt.tokens, CompletionTokens: tt.prompts * tt.output,
					TotalTokens: tt.tokens + tt.prompts*tt.output, PromptTokensDetails: &openai.TokenDetails{CachedTokens: tt.cached}}
				if diff := cmp.Diff(wantUsage, usage); diff != "" {
					t.Errorf("usage (-want +got):\n%s", diff)
				}
				st := waitFinished(t, in, int64(tt.prompts))
				if st.Finished != int64(tt.prompts) || st.PrefixQueryTokens != int64(tt.tokens) || st.PrefixHitTokens != int64(tt.cached) {
					t.Errorf("engine: %d requests finished, %d tokens looked up, %d hit; want %d, %d, %d",
						st.Finished, st.PrefixQueryTokens, st.PrefixHitTokens, tt.prompts, tt.tokens, tt.cached)
				}
				if tt.alone == nil {
					if len(got) != tt.prompts {
						t.Fatalf("%d choices, want %d", len(got), tt.prompts)
					}
					return
				}
				// Each choice is what its prompt gets alone (the text depends on the prompt only).
				var want []choiceOut
				for i, p := range tt.alone {
					one, _ := completion(t, url, fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, DefaultModel, p, tt.output))
					if len(one) != 1 {
						t.Fatalf("prompt %d alone: %d choices", i, len(one))
					}
					one[0].Index = i
					want = append(want, one[0])
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("choices (-alone +list):\n%s", diff)
				}
			})
		}
	}
}

// TestCompletionPromptListTTFT checks that each prompt of a list gets its own first token: the
// TTFT histogram counts one sample per prompt, and the repeated prompt's TTFT is that of a
// cache hit.
func TestCompletionPromptListTTFT(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", BlockSize: 16}, 1)
	url := f.URLs()[0]
	p := text("ttft", 64)
	got, usage := completion(t, url, fmt.Sprintf(`{"model":%q,"prompt":[%q,%q,%q],"max_tokens":1}`, DefaultModel, p, p, p))
	if len(got) != 3 {
		t.Fatalf("%d choices, want 3", len(got))
	}
	// The last block of a fully cached prompt is recomputed: 3 of 4 blocks hit for each copy.
	if usage.PromptTokensDetails == nil || usage.PromptTokensDetails.CachedTokens != 2*48 {
		t.Errorf("usage %+v, want 96 cached tokens (48 for each repeat)", usage)
	}
	waitFinished(t, f.Instances()[0], 3) // the driver records a request's end after waking its handler
	fams := scrape(t, url)
	if n := fams["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); n != 3 {
		t.Errorf("TTFT samples = %d, want 3 (one per prompt)", n)
	}
	success := map[string]float64{}
	for _, m := range fams["vllm:request_success_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" {
				success[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if diff := cmp.Diff(map[string]float64{"length": 3, "stop": 0, "abort": 0}, success); diff != "" {
		t.Errorf("vllm:request_success_total by finished_reason (-want +got):\n%s", diff)
	}
}

func TestCompletionPromptListErrors(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", MaxModelLen: 1000}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	many := "[" + strings.Repeat(`"x",`, maxPrompts) + `"x"]`
	tests := []struct {
		name, prompt string
		param        string
	}{
		{"too many prompts", many, "prompt"},
		{"one prompt too long", fmt.Sprintf(`["short",%q]`, text("long", 999)), "max_tokens"},
	}
	for _, tt := range tests {
		resp, _ := post(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2}`, DefaultModel, tt.prompt))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error openai.Error }
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s: %s: %v", tt.name, b, err)
		}
		got := ""
		if e.Error.Param != nil {
			got = *e.Error.Param
		}
		if resp.StatusCode != http.StatusBadRequest || got != tt.param {
			t.Errorf("%s: status %d param %q, want 400 %q (%s)", tt.name, resp.StatusCode, got, tt.param, b)
		}
	}
	if st := in.Stats(); st.Finished != 0 || st.PrefixQueryTokens != 0 {
		t.Errorf("a refused list reached the engine: %+v", st)
	}
}

// TestCompletionPromptListStreamsAsTokensCome streams a list on a real-time profile: the
// prompts decode side by side, so the second prompt's first chunk comes before the first
// prompt's last one, and each prompt's chunks still join into its own text.
func TestCompletionPromptListStreamsAsTokensCome(t *testing.T) {
	f := startFleet(t, Options{TimeScale: 0.1, StreamInterval: -1}, 1)
	url := f.URLs()[0]
	a, b := text("side", 300), text("by side", 200)
	const outTokens = 60 // at least 60 steps of 12 ms: 72 ms of wall time
	r := streamCall(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":[%q,%q],"max_tokens":%d,"stream":true}`, DefaultModel, a, b, outTokens))
	if !r.done || r.usage != nil {
		t.Fatalf("stream: done %v, usage %v (not asked for)", r.done, r.usage)
	}
	var order []int
	for _, ch := range r.chunks {
		order = append(order, int(ch["choices"].([]any)[0].(map[string]any)["index"].(float64)))
	}
	first1, last0 := -1, -1
	for i, idx := range order {
		if idx == 1 && first1 < 0 {
			first1 = i
		}
		if idx == 0 {
			last0 = i
		}
	}
	if first1 < 0 || first1 > last0 {
		t.Errorf("prompt 1's first chunk at %d, prompt 0's last at %d: want them interleaved (%v)", first1, last0, order)
	}
	got := streamedChoices(t, r)
	var want []choiceOut
	for i, p := range []string{a, b} {
		one, _ := completion(t, url, fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d}`, DefaultModel, p, outTokens))
		one[0].Index = i
		want = append(want, one[0])
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("choices (-alone +list):\n%s", diff)
	}
}

// TestChoicesN: n asks for n choices of each prompt, as vLLM answers it: one engine request per
// choice, choices indexed prompt by prompt, each with its own text; usage counts each prompt's
// tokens once and every choice's output; n below 1 is refused.
func TestChoicesN(t *testing.T) {
	a, b := text("alpha", 100), text("beta", 60)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			f := startFleet(t, Options{Profile: "instant", BlockSize: 16}, 1)
			in, url := f.Instances()[0], f.URLs()[0]
			body := fmt.Sprintf(`{"model":%q,"prompt":[%q,%q],"n":2,"max_tokens":3,"stream":%v,"stream_options":{"include_usage":true}}`, DefaultModel, a, b, stream)
			got, usage := completionAs(t, url, body, stream)
			if usage.PromptTokens != 160 || usage.CompletionTokens != 12 || usage.TotalTokens != 172 {
				t.Errorf("usage %+v, want 160 prompt tokens (each prompt once), 12 completion tokens (4 choices of 3)", usage)
			}
			if len(got) != 4 {
				t.Fatalf("%d choices, want 4: %+v", len(got), got)
			}
			for i, c := range got {
				if c.Index != i || c.Finish != "length" || c.Text == "" {
					t.Errorf("choice %d: %+v, want index %d, a text, finish_reason length", i, c, i)
				}
			}
			if got[0].Text == got[1].Text || got[2].Text == got[3].Text {
				t.Errorf("a prompt's two choices have the same text: %+v", got)
			}
			if st := waitFinished(t, in, 4); st.Finished != 4 {
				t.Errorf("engine finished %d requests, want 4 (one per choice)", st.Finished)
			}
		})
	}
	f := startFleet(t, Options{Profile: "instant", BlockSize: 16}, 1)
	resp, _ := post(t, f.URLs()[0], "/v1/chat/completions", chatBody(DefaultModel, a, false, 2, `,"n":3`))
	var chat struct {
		Choices []struct {
			Index   int
			Message struct{ Content string }
		}
		Usage openai.Usage
	}
	err := json.NewDecoder(resp.Body).Decode(&chat)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(chat.Choices) != 3 || chat.Choices[2].Index != 2 || chat.Usage.CompletionTokens != 6 {
		t.Errorf("chat with n 3: status %d, %+v (%v); want 3 choices of 2 tokens", resp.StatusCode, chat, err)
	}
	for _, n := range []string{"0", "-1", "2000"} {
		resp, _ := post(t, f.URLs()[0], "/v1/chat/completions", chatBody(DefaultModel, a, false, 2, `,"n":`+n))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"param":"n"`) {
			t.Errorf("n %s: status %d %s, want 400 naming n", n, resp.StatusCode, b)
		}
	}
}
