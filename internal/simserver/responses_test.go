package simserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
)

// response is what the tests read of a Responses API response object.
type response struct {
	ID                string `json:"id"`
	Object            string `json:"object"`
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	MaxOutputTokens *int    `json:"max_output_tokens"`
	Instructions    *string `json:"instructions"`
	Previous        *string `json:"previous_response_id"`
	Output          []struct {
		Type, ID, Status, Role string
		Content                []struct{ Type, Text string }
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		TotalTokens        int `json:"total_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// text is the response's one output message's text.
func (r *response) text(t *testing.T) string {
	t.Helper()
	if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" || len(r.Output[0].Content) != 1 ||
		r.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("output %+v, want one assistant message of one output_text part", r.Output)
	}
	return r.Output[0].Content[0].Text
}

// inputTokens is the prompt length the simulator counts for a Responses body.
func inputTokens(t *testing.T, body string) int {
	t.Helper()
	req, err := openai.Parse(openai.KindResponse, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return max(1, prefix.EstimateTokens(req.CanonicalPrompt()))
}

// POST /v1/responses answers as OpenAI's Responses API does, in the members the router and a
// client read: a response object whose usage names input_tokens and output_tokens, one
// assistant message, status incomplete where max_output_tokens cut it. Before, the simulator
// answered 404 page not found, so the router's Responses path could not be tried against it.
func TestResponses(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", DefaultMaxTokens: 7}, 1)
	url := f.URLs()[0]
	m, _ := json.Marshal(DefaultModel)
	for _, tc := range []struct {
		name, members string
		status        string // completed, or incomplete for max_output_tokens
		out           int
	}{
		{"string input, max_output_tokens", `"input":"hello there","max_output_tokens":5`, "incomplete", 5},
		{"items and instructions, default length", `"input":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"c","output":"4"}],"instructions":"be brief"`, "completed", 7},
		{"n is no member of the API: one answer", `"input":"hello there","max_output_tokens":3,"n":4`, "incomplete", 3},
		{"previous_response_id alone", `"previous_response_id":"resp_x","max_output_tokens":2`, "incomplete", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := fmt.Sprintf(`{"model":%s,%s}`, m, tc.members)
			resp, _ := post(t, url, "/v1/responses", body)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			var r response
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Status != tc.status || r.Output[0].Status != tc.status {
				t.Errorf("object %q id %q status %q (item %q); want response, resp_..., %s", r.Object, r.ID, r.Status, r.Output[0].Status, tc.status)
			}
			if (tc.status == "incomplete") != (r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens") {
				t.Errorf("incomplete_details %+v with status %s", r.IncompleteDetails, tc.status)
			}
			if got := len(r.text(t)); got != tc.out*prefix.BytesPerToken {
				t.Errorf("text of %d bytes, want %d tokens", got, tc.out)
			}
			in := inputTokens(t, body)
			if r.Usage == nil || r.Usage.InputTokens != in || r.Usage.OutputTokens != tc.out || r.Usage.TotalTokens != in+tc.out {
				t.Errorf("usage %+v, want input_tokens %d, output_tokens %d, total_tokens %d", r.Usage, in, tc.out, in+tc.out)
			}
			// As the router reads them.
			if u, ok := openai.FindUsage(b); !ok || u.Prompt() != in || u.Completion() != tc.out || u.Cached() != 0 {
				t.Errorf("openai.FindUsage: %+v %v; want %d prompt, %d completion, 0 cached tokens", u, ok, in, tc.out)
			}
			if got := openai.ResponseID(b); got != r.ID {
				t.Errorf("openai.ResponseID %q, want %q", got, r.ID)
			}
		})
	}

	// What a request names is echoed.
	body := fmt.Sprintf(`{"model":%s,"input":"x","instructions":"be brief","previous_response_id":"resp_1","max_output_tokens":2}`, m)
	resp, _ := post(t, url, "/v1/responses", body)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var r response
	if err := json.Unmarshal(b, &r); err != nil || r.Instructions == nil || *r.Instructions != "be brief" ||
		r.Previous == nil || *r.Previous != "resp_1" || r.MaxOutputTokens == nil || *r.MaxOutputTokens != 2 {
		t.Errorf("%s: %v; want instructions, previous_response_id and max_output_tokens echoed", b, err)
	}

	// A bound the context cannot hold is refused naming max_output_tokens.
	resp, _ = post(t, url, "/v1/responses", fmt.Sprintf(`{"model":%s,"input":"x","max_output_tokens":200000}`, m))
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error openai.Error }
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "max_output_tokens" {
		t.Errorf("max_output_tokens 200000: %d %s; want 400 naming max_output_tokens", resp.StatusCode, b)
	}
}

// A streamed Responses call is OpenAI's semantic events, in order, numbered from 0, each
// named by an event line that its data's type repeats: the text of the deltas is the text of
// the done events and of the terminal one, which carries the usage; no [DONE]. The same body
// unstreamed gets the same text.
func TestResponsesStream(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", DefaultMaxTokens: 4}, 1)
	url := f.URLs()[0]
	m, _ := json.Marshal(DefaultModel)
	for _, tc := range []struct {
		members, terminal string
		out               int
	}{
		{`"input":"tell me","max_output_tokens":3`, "response.incomplete", 3},
		{`"input":[{"role":"user","content":"tell me"}]`, "response.completed", 4},
	} {
		body := fmt.Sprintf(`{"model":%s,"stream":true,%s}`, m, tc.members)
		resp, _ := post(t, url, "/v1/responses", body)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("%s: status %d %s: %s", body, resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		rd := openai.NewSSEReader(resp.Body, 1<<16)
		var names []string
		var deltas strings.Builder
		var doneText, partText, itemText string
		var final response
		var usage openai.Usage
		for i := range 1000 {
			ev, err := rd.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			if ev.IsDone() {
				t.Errorf("a [DONE] in a Responses stream")
				continue
			}
			var d struct {
				Type     string `json:"type"`
				Seq      int    `json:"sequence_number"`
				Delta    string `json:"delta"`
				Text     string `json:"text"`
				Part     struct{ Text string }
				Item     json.RawMessage `json:"item"`
				Response json.RawMessage `json:"response"`
			}
			if err := json.Unmarshal(ev.Data, &d); err != nil {
				t.Fatalf("event %q: %v", ev.Data, err)
			}
			if d.Type != ev.Name || d.Seq != i {
				t.Errorf("event %q: type %q sequence_number %d; want the event's name and %d", ev.Name, d.Type, d.Seq, i)
			}
			names = append(names, ev.Name)
			switch ev.Name {
			case "response.output_text.delta":
				deltas.WriteString(d.Delta)
			case "response.output_text.done":
				doneText = d.Text
			case "response.content_part.done":
				partText = d.Part.Text
			case "response.output_item.done":
				var it struct{ Content []struct{ Text string } }
				if json.Unmarshal(d.Item, &it) == nil && len(it.Content) == 1 {
					itemText = it.Content[0].Text
				}
			case tc.terminal:
				if err := json.Unmarshal(d.Response, &final); err != nil {
					t.Fatalf("%s: %v", ev.Data, err)
				}
				var ok bool
				if usage, ok = openai.FindUsage(ev.Data); !ok {
					t.Errorf("no usage in %s", ev.Data)
				}
				if !ev.Ends() {
					t.Errorf("%s does not end the stream for the router", ev.Name)
				}
			}
		}
		resp.Body.Close()
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
		for range tc.out {
			want = append(want, "response.output_text.delta")
		}
		want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", tc.terminal)
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", body, diff)
		}
		text := deltas.String()
		if len(text) != tc.out*prefix.BytesPerToken || doneText != text || partText != text || itemText != text || final.text(t) != text {
			t.Errorf("%s: deltas %q, output_text.done %q, content_part.done %q, output_item.done %q, %s %q; want one text of %d tokens",
				body, text, doneText, partText, itemText, tc.terminal, final.text(t), tc.out)
		}
		in := inputTokens(t, body)
		if usage.Prompt() != in || usage.Completion() != tc.out || usage.Cached() < 0 {
			t.Errorf("%s: usage %+v; want %d input, %d output tokens, cached tokens said", body, usage, in, tc.out)
		}

		// Unstreamed, the same text.
		plain := strings.Replace(body, `"stream":true,`, "", 1)
		resp, _ = post(t, url, "/v1/responses", plain)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r response
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if got := r.text(t); got != text {
			t.Errorf("%s unstreamed: text %q, streamed %q", plain, got, text)
		}
	}
}

// FuzzResponses sends arbitrary bodies to /v1/responses: every answer is a response object, a
// stream ending in a terminal event, or an OpenAI error; never a panic or a hang.
func FuzzResponses(f *testing.F) {
	in, err := New(Options{Profile: "instant", MaxModelLen: 2048})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = in.Close() })
	h := in.Handler()
	for _, s := range []string{
		`{"model":"` + DefaultModel + `","input":"hi","max_output_tokens":3}`,
		`{"model":"` + DefaultModel + `","input":[{"role":"user","content":"hi"}],"stream":true,"max_output_tokens":2}`,
		`{"model":"` + DefaultModel + `","input":"hi","stream":true,"instructions":"x","n":3}`,
		`{"model":"` + DefaultModel + `","previous_response_id":"resp_1"}`,
		`{"model":"` + DefaultModel + `","input":"x","max_output_tokens":9223372036854775807}`,
		`{"model":"` + DefaultModel + `","input":"x","max_output_tokens":4e1}`,
		`{`, `[]`, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/responses", strings.NewReader(body)))
		switch {
		case rec.Code == http.StatusOK && strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream"):
			out := rec.Body.String()
			last := strings.LastIndex(strings.TrimSuffix(out, "\n\n"), "\n\n")
			if !strings.HasSuffix(out, "\n\n") || !strings.HasPrefix(out[last+2:], "event: response.completed\n") &&
				!strings.HasPrefix(out[last+2:], "event: response.incomplete\n") {
				t.Errorf("stream does not end with a terminal event: %q", out)
			}
		case rec.Code == http.StatusOK:
			var r struct{ Object string }
			if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Object != "response" {
				t.Errorf("200 with a body that is no response object: %q", rec.Body.String())
			}
		case rec.Code >= 400 && rec.Code < 500:
			var e struct {
				Error struct{ Message string }
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Errorf("status %d without an OpenAI error body: %q", rec.Code, rec.Body.String())
			}
		default:
			t.Errorf("status %d: %q", rec.Code, rec.Body.String())
		}
	})
}
