package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
)

// convert runs ConvertTrace on in and reads its output back with ReadMooncake, which every
// output must pass.
func convert(t *testing.T, in string, o ConvertOptions) ([]Request, ConvertStats) {
	t.Helper()
	var out bytes.Buffer
	stats, err := ConvertTrace(&out, strings.NewReader(in), o)
	if err != nil {
		t.Fatalf("ConvertTrace: %v", err)
	}
	reqs, err := ReadMooncake(&out)
	if err != nil {
		t.Fatalf("ReadMooncake of the output: %v\n%s", err, out.String())
	}
	if stats.Requests != len(reqs) {
		t.Errorf("stats say %d requests, the output has %d", stats.Requests, len(reqs))
	}
	return reqs, stats
}

// convertErr runs ConvertTrace on in and returns its error.
func convertErr(in string, o ConvertOptions) error {
	_, err := ConvertTrace(&bytes.Buffer{}, strings.NewReader(in), o)
	return err
}

func hasNote(stats ConvertStats, sub string) bool {
	for _, n := range stats.Notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}

// words is text of n bytes, different for each seed.
func words(seed, n int) string {
	var b strings.Builder
	for b.Len() < n {
		fmt.Fprintf(&b, "w%d-%d ", seed, b.Len())
	}
	return b.String()[:n]
}

// canonical is what the router hashes for a chat body: its tokens are the request's
// input_length, at 4 bytes a token.
func canonical(t *testing.T, body string) string {
	t.Helper()
	r, err := openai.Parse(openai.KindChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r.CanonicalPrompt()
}

// TestConvertOpenAI: chat bodies with a common system prompt share the blocks it fills and no
// more; lengths are the router's estimate of the canonical text; times are synthesised at
// the rate; ids are numbered from 0 in order of first appearance.
func TestConvertOpenAI(t *testing.T) {
	system := words(0, 5000) // two full 2,048-byte blocks and part of a third
	chat := func(user string, extra string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": user}}})
		s := string(b)
		if extra != "" {
			s = strings.TrimSuffix(s, "}") + "," + extra + "}"
		}
		return s
	}
	in := chat(words(1, 3000), `"max_tokens": 40`) + "\n\n" + chat(words(2, 100), `"max_completion_tokens": 7`) + "\n" + chat(words(1, 3000), "") + "\n"
	reqs, stats := convert(t, in, ConvertOptions{Rate: 4})
	if stats.Format != FormatOpenAI || len(reqs) != 3 {
		t.Fatalf("format %q, %d requests; want openai and 3", stats.Format, len(reqs))
	}
	text := canonical(t, chat(words(1, 3000), ""))
	if want := prefix.EstimateTokens(text); reqs[0].PromptTokens != want {
		t.Errorf("input_length %d, want the router's estimate %d", reqs[0].PromptTokens, want)
	}
	wantOut := []int{40, 7, DefaultOutputTokens}
	for i, r := range reqs {
		if r.OutputTokens != wantOut[i] {
			t.Errorf("request %d: output_length %d, want %d", i, r.OutputTokens, wantOut[i])
		}
		if want := time.Duration(i) * 250 * time.Millisecond; r.Arrival != want {
			t.Errorf("request %d: arrival %v, want %v (4 a second)", i, r.Arrival, want)
		}
	}
	// The system prompt fills two blocks (its third is shared only in part): equal there.
	if diff := cmp.Diff(reqs[0].Blocks[:2], reqs[1].Blocks[:2]); diff != "" {
		t.Errorf("shared system prompt, different ids (-0 +1):\n%s", diff)
	}
	if reqs[0].Blocks[2] == reqs[1].Blocks[2] {
		t.Errorf("block 2 differs in text but has the same id %d", reqs[0].Blocks[2])
	}
	// The same body again: the same ids.
	if diff := cmp.Diff(reqs[0].Blocks, reqs[2].Blocks); diff != "" {
		t.Errorf("the same body twice, different ids (-first +again):\n%s", diff)
	}
	for i, id := range reqs[0].Blocks {
		if id != uint64(i) {
			t.Errorf("first request's ids %v, want 0, 1, 2, ...", reqs[0].Blocks)
			break
		}
	}
	if !hasNote(stats, "openai has no times: the requests are spaced evenly, 250ms apart (4 a second)") || !hasNote(stats, "1 request(s) without max_tokens written with output_length 256") {
		t.Errorf("notes %q", stats.Notes)
	}
}

// TestConvertOpenAIKinds: completions (one prompt, several, token ids), Responses bodies,
// Batch API lines and vLLM benchmark prompts each become requests; another model's prompt
// shares nothing, as in the router, whose chains start from the model's seed.
func TestConvertOpenAIKinds(t *testing.T) {
	long := words(3, 3000)
	lines := []string{
		`{"model": "m", "prompt": "` + long + `", "max_tokens": 3}`,
		`{"model": "other", "prompt": "` + long + `", "max_tokens": 3}`,
		`{"model": "m", "prompt": ["` + long + `", "short"], "max_tokens": 2}`,
		`{"model": "m", "prompt": [1, 2, 3, 4, 5], "max_tokens": 1}`,
		`{"model": "m", "input": "hello there", "max_output_tokens": 9}`,
		`{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "` + long + `", "max_tokens": 3}}`,
		`{"prompt": "` + long + `", "output_tokens": 11}`,
		`{"prompt": "abc", "output_len": 12}`,
	}
	reqs, stats := convert(t, strings.Join(lines, "\n"), ConvertOptions{From: FormatOpenAI})
	type summary struct {
		Input, Output int
		SharesWith0   bool
	}
	var got []summary
	for _, r := range reqs {
		got = append(got, summary{r.PromptTokens, r.OutputTokens, r.Blocks[0] == reqs[0].Blocks[0]})
	}
	want := []summary{
		{750, 3, true},
		{750, 3, false},  // another model
		{750, 2, true},   // the list's first prompt, alone
		{2, 2, false},    // "short"
		{5, 1, false},    // five token ids, 4 bytes each
		{3, 9, false},    // "hello there" as a Responses input
		{750, 3, true},   // the Batch API line's body
		{750, 11, false}, // a vLLM prompt has no model: the seed of none
		{1, 12, false},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if !hasNote(stats, "1 completion request(s) with a list of prompts written as one request per prompt") {
		t.Errorf("notes %q", stats.Notes)
	}
}

// TestConvertShareGPT: one request per assistant turn, its prompt the conversation before it:
// each turn's prompt extends the one before, so its full blocks repeat the earlier ids.
func TestConvertShareGPT(t *testing.T) {
	conv := func(id int, from, value string) string {
		var turns []string
		for i := range 3 {
			turns = append(turns, fmt.Sprintf(`{"%s": "human", "%s": "%s"}, {"%s": "gpt", "%s": "%s"}`,
				from, value, words(10*id+i, 2500), from, value, words(100+10*id+i, 400)))
		}
		return `{"id": "c` + fmt.Sprint(id) + `", "conversations": [` + strings.Join(turns, ", ") + `]}`
	}
	array := "[\n" + conv(1, "from", "value") + ",\n" + conv(2, "from", "value") + "\n]\n"
	reqs, stats := convert(t, array, ConvertOptions{Rate: 2})
	if stats.Format != FormatShareGPT || len(reqs) != 6 {
		t.Fatalf("format %q, %d requests; want sharegpt and 6 (3 assistant turns in each of 2)", stats.Format, len(reqs))
	}
	for i := 1; i < 3; i++ {
		prev, cur := reqs[i-1], reqs[i]
		full := prev.PromptTokens / 512
		if diff := cmp.Diff(prev.Blocks[:full], cur.Blocks[:full]); diff != "" {
			t.Errorf("turn %d does not repeat turn %d's %d full blocks (-prev +cur):\n%s", i, i-1, full, diff)
		}
		if cur.PromptTokens <= prev.PromptTokens {
			t.Errorf("turn %d: %d prompt tokens, not more than turn %d's %d", i, cur.PromptTokens, i-1, prev.PromptTokens)
		}
	}
	if reqs[3].Blocks[0] == reqs[0].Blocks[0] {
		t.Error("two conversations share their first block")
	}
	if reqs[0].OutputTokens != 100 || reqs[5].Arrival != 2500*time.Millisecond {
		t.Errorf("output %d, last arrival %v; want 100 (400 bytes) and 2.5s (2 a second)", reqs[0].OutputTokens, reqs[5].Arrival)
	}
	if !hasNote(stats, "one request per assistant turn") || !hasNote(stats, "500ms apart (2 a second)") {
		t.Errorf("notes %q", stats.Notes)
	}
	// JSON Lines of conversations, and OpenAI's names for the same fields, give the same trace.
	lines, _ := convert(t, conv(1, "from", "value")+"\n"+conv(2, "from", "value")+"\n", ConvertOptions{From: FormatShareGPT, Rate: 2})
	named, _ := convert(t, strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(strings.ReplaceAll(
		"["+conv(1, "from", "value")+", "+conv(2, "from", "value")+"]", `"from"`, `"role"`), `"value"`, `"content"`), `"human"`, `"user"`), `"gpt"`, `"assistant"`),
		ConvertOptions{From: FormatShareGPT, Rate: 2})
	if diff := cmp.Diff(reqs, lines); diff != "" {
		t.Errorf("JSON Lines differ from the array (-array +lines):\n%s", diff)
	}
	if diff := cmp.Diff(reqs, named); diff != "" {
		t.Errorf("role/content differ from from/value (-from +role):\n%s", diff)
	}
}

// TestConvertCSV: the Azure and BurstGPT traces keep their times and lengths; every request
// has ids of its own; a request without prompt is left out and one without output gets 1.
func TestConvertCSV(t *testing.T) {
	azure := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2023-11-16 18:15:46.6805900,374,44\n" +
		"2023-11-16 18:15:50.9951690,1396,109\n" +
		"2023-11-16 18:15:51.2407390,0,5\n" +
		"2023-11-16 18:15:52.0000000,879,0\n"
	azure24 := "TIMESTAMP,ContextTokens,GeneratedTokens\n" +
		"2024-05-10 00:00:00.009930+00:00,374,44\n" +
		"2024-05-10 00:00:04.324999+00:00,1396,109\n" +
		"2024-05-10 00:00:04.570739+00:00,0,5\n" +
		"2024-05-10 00:00:05.329000+00:00,879,0\n"
	burst := "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
		"5,1,0,ChatGPT,374,44,418,Conversation log\n" +
		"9.315,2,0,ChatGPT,1396,109,1505,Conversation log\n" +
		"9.5,3,0,GPT-4,0,5,5,API log\n" +
		"10.319,4,0,GPT-4,879,0,879,API log\n"
	type row struct {
		Arrival       time.Duration
		Input, Output int
		Blocks        []uint64
	}
	want := []row{
		{0, 374, 44, []uint64{0}},
		{4315 * time.Millisecond, 1396, 109, []uint64{1, 2, 3}},
		{5319 * time.Millisecond, 879, 1, []uint64{4, 5}},
	}
	for name, in := range map[string]string{"azure 2023": azure, "azure 2024": azure24, "burstgpt": burst} {
		t.Run(name, func(t *testing.T) {
			reqs, stats := convert(t, in, ConvertOptions{})
			var got []row
			for _, r := range reqs {
				got = append(got, row{r.Arrival, r.PromptTokens, r.OutputTokens, r.Blocks})
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			for _, n := range []string{"has token counts but no prompt text: each request has hash_ids of its own, so analyze, simulate and plan see no prefix sharing", "1 request(s) without prompt tokens left out", "1 request(s) with 0 output tokens written with output_length 1"} {
				if !hasNote(stats, n) {
					t.Errorf("notes %q lack %q", stats.Notes, n)
				}
			}
		})
	}
	// Rows out of order, a bad number, a bad time, a short row.
	for in, want := range map[string]string{
		azure + "2023-11-16 18:15:40.0,5,5\n":                        "line 6: column TIMESTAMP: before the first row's time",
		"TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1\n":           `line 2: column TIMESTAMP: "x", want a date and time such as 2023-11-16 18:15:46.6805900`,
		azure + "2023-11-16 18:15:53,12.5,1\n":                       `line 6: column ContextTokens: "12.5", want a whole number of tokens`,
		azure + "2023-11-16 18:15:53,12\n":                           "line 6: wrong number of fields",
		"Timestamp,Model,Request tokens,Response tokens\n-1,m,1,1\n": `line 2: column Timestamp: "-1", want seconds from the trace's start`,
		"TIMESTAMP,Context,GeneratedTokens\n":                        `line 1: no column "contexttokens"`,
	} {
		from := FormatAzure
		if strings.HasPrefix(in, "Timestamp") {
			from = FormatBurstGPT
		}
		err := convertErr(in, ConvertOptions{From: from})
		if err == nil || !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v; want a bad trace error with %q", err, want)
		}
	}
}

// TestConvertMooncake: timestamps in seconds, microseconds or nanoseconds become milliseconds
// from the first; blocks of another size are regrouped into 512-token blocks that keep the
// trace's sharing.
func TestConvertMooncake(t *testing.T) {
	line := func(ts string, input int, ids ...int) string {
		s := make([]string, len(ids))
		for i, id := range ids {
			s[i] = fmt.Sprint(id)
		}
		return fmt.Sprintf(`{"timestamp": %s, "input_length": %d, "output_length": 3, "hash_ids": [%s]}`+"\n", ts, input, strings.Join(s, ", "))
	}
	for unit, stamps := range map[time.Duration][3]string{
		time.Second:      {"1733500000.25", "1733500000.5", "1733500002.125"},
		time.Microsecond: {"1733500000250000", "1733500000500000", "1733500002125000"},
		time.Nanosecond:  {"1733500000250000000", "1733500000500000000", "1733500002125000000"},
		time.Millisecond: {"250.4", "500", "2125.2"},
	} {
		in := line(stamps[0], 600, 1, 2) + line(stamps[1], 100, 1) + line(stamps[2], 1100, 1, 2, 3)
		reqs, _ := convert(t, in, ConvertOptions{TimeUnit: unit})
		if diff := cmp.Diff([]time.Duration{0, 250 * time.Millisecond, 1875 * time.Millisecond}, arrivals(reqs)); diff != "" {
			t.Errorf("%v: arrivals (-want +got):\n%s", unit, diff)
		}
	}
	// Without a unit, a trace in seconds or Unix microseconds is refused as the reader
	// refuses it.
	err := convertErr(line("0.5", 10, 1)+line("1.25", 10, 2), ConvertOptions{})
	if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), "has a fraction of a millisecond") {
		t.Errorf("seconds without a unit: %v", err)
	}
	err = convertErr(line("1733500000250000", 10, 1)+line("1733500000500000", 10, 2), ConvertOptions{})
	if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), "line 1: field timestamp: 1.73350000025e+15 out of range for milliseconds: it looks like Unix time in microseconds") {
		t.Errorf("microseconds without a unit: %v", err)
	}
	// 64-token blocks: requests that share their first 20 small blocks (1,280 tokens) share
	// two 512-token blocks, and differ from the third on.
	small := func(n, from int) []int {
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
			if i >= 20 {
				ids[i] = from + i
			}
		}
		return ids
	}
	in := line("0", 64*30, small(30, 1000)...) + line("10", 64*30, small(30, 2000)...) + line("20", 64*24-10, small(24, 1000)...)
	reqs, _ := convert(t, in, ConvertOptions{BlockTokens: 64})
	got := [][]uint64{reqs[0].Blocks, reqs[1].Blocks, reqs[2].Blocks}
	want := [][]uint64{{0, 1, 2, 3}, {0, 1, 4, 5}, {0, 1, 2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("64-token blocks regrouped (-want +got):\n%s", diff)
	}
	// 1,024-token blocks: each covers two 512-token blocks, shared or not together.
	in = line("0", 2048, 7, 8) + line("10", 2048, 7, 9) + line("20", 1000, 7)
	reqs, _ = convert(t, in, ConvertOptions{BlockTokens: 1024})
	got = [][]uint64{reqs[0].Blocks, reqs[1].Blocks, reqs[2].Blocks}
	want = [][]uint64{{0, 1, 2, 3}, {0, 1, 4, 5}, {0, 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("1,024-token blocks regrouped (-want +got):\n%s", diff)
	}
	// Out of order: the converted trace is measured from the first line.
	err = convertErr(line("100", 10, 1)+line("50", 10, 2), ConvertOptions{TimeUnit: time.Millisecond})
	if !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), "line 2: field timestamp: 50 is before the first line's 100") {
		t.Errorf("out of order: %v", err)
	}
}

// TestConvertErrors: the input's faults are bad trace errors naming where; the options'
// faults are option errors; an input of no known format asks for --from.
func TestConvertErrors(t *testing.T) {
	for _, tt := range []struct {
		in   string
		o    ConvertOptions
		is   error
		want string
	}{
		{"hello\n", ConvertOptions{}, ErrBadTrace, "the input is in no format known here: give its format with --from (one of openai, sharegpt, azure, burstgpt, mooncake)"},
		{"[1]\n", ConvertOptions{}, ErrBadTrace, "the input is a JSON array, not JSON Lines (one object a line): give its format with --from"},
		{`{"model": "m", "messages": [{"role": "user", "content": "hi"}]}` + "\n" + `{"model": "m"}` + "\n", ConvertOptions{}, ErrBadTrace, "line 2: no messages, prompt or input"},
		{`{"model": "m", "messages": "hi"}` + "\n", ConvertOptions{From: FormatOpenAI}, ErrBadTrace, "line 1: "},
		{`{"prompt": 5}` + "\n", ConvertOptions{From: FormatOpenAI}, ErrBadTrace, `line 1: field prompt: want a string`},
		{"[{\"conversations\": 5}]", ConvertOptions{From: FormatShareGPT}, ErrBadTrace, "conversation 1 (byte "},
		{"[{\"conversations\": []}", ConvertOptions{From: FormatShareGPT}, ErrBadTrace, "the array does not end"},
		{"", ConvertOptions{From: FormatOpenAI}, ErrNoRequests, "no requests: the input has no request to convert"},
		// Nothing to tell a format from: not "in no format known here".
		{"", ConvertOptions{}, ErrNoRequests, "no requests: the input is empty"},
		{" \n\r\n\t\n", ConvertOptions{}, ErrNoRequests, "no requests: the input is blank (white space only)"},
		{"TIMESTAMP,ContextTokens,GeneratedTokens\n", ConvertOptions{}, ErrNoRequests, "no requests"},
		{"x", ConvertOptions{Rate: -1}, ErrBadConvertOption, "rate -1: want a positive number"},
		{"x", ConvertOptions{TimeUnit: time.Minute}, ErrBadConvertOption, "time unit 1m0s: want s, ms, us or ns"},
		{"TIMESTAMP,ContextTokens,GeneratedTokens\n", ConvertOptions{BlockTokens: 64}, ErrBadConvertOption, "the time unit and the block size are settings of a Mooncake trace, not of an azure one"},
	} {
		err := convertErr(tt.in, tt.o)
		if !errors.Is(err, tt.is) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%.40q %+v: error %v; want %v with %q", tt.in, tt.o, err, tt.is, tt.want)
		}
	}
}

// TestConvertLongBlankStart: an input that starts with more white space than the format is
// told from (sniffBytes) and then has records is converted, not called blank; its errors
// name the line or byte of the whole input, the white space counted.
func TestConvertLongBlankStart(t *testing.T) {
	blank := strings.Repeat(" \t\r\n", sniffBytes/4+10) // sniffBytes/4+10 lines
	lines := sniffBytes/4 + 10
	for _, tt := range []struct {
		name, in string
		format   TraceFormat
	}{
		{"openai", `{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}` + "\n", FormatOpenAI},
		{"sharegpt array", `[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]`, FormatShareGPT},
		{"azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n", FormatAzure},
		{"mooncake", `{"timestamp": 1000, "input_length": 100, "output_length": 3, "hash_ids": [1]}` + "\n", FormatMooncake},
	} {
		reqs, stats := convert(t, blank+tt.in, ConvertOptions{})
		if stats.Format != tt.format || len(reqs) != 1 {
			t.Errorf("%s: format %q, %d requests; want %s and 1", tt.name, stats.Format, len(reqs), tt.format)
		}
	}
	for _, tt := range []struct {
		name, in, want string
	}{
		{"openai", `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}` + "\n" + `{"model": "m"}` + "\n",
			fmt.Sprintf("line %d: no messages, prompt or input", lines+2)},
		{"azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,x,44\n",
			fmt.Sprintf("line %d: column ContextTokens: \"x\"", lines+2)},
		{"azure header", "TIMESTAMP,Tokens,GeneratedTokens\n", ""},
		{"sharegpt", `[{"conversations": 5}]`, fmt.Sprintf("conversation 1 (byte %d)", len(blank)+21)},
	} {
		o := ConvertOptions{}
		if tt.name == "azure header" {
			o.From, tt.want = FormatAzure, fmt.Sprintf("line %d: no column \"contexttokens\"", lines+1)
		}
		if err := convertErr(blank+tt.in, o); !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v; want a bad trace error with %q", tt.name, err, tt.want)
		}
	}
	// White space only, however long, is blank.
	if err := convertErr(blank+blank, ConvertOptions{}); !errors.Is(err, ErrNoRequests) || !strings.Contains(err.Error(), "the input is blank (white space only)") {
		t.Errorf("long blank input: error %v", err)
	}
}

// TestConvertGzip: ConvertTrace reads gzip as ReadMooncake does.
func TestConvertGzip(t *testing.T) {
	in := string(gzipped(t, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"))
	reqs, stats := convert(t, in, ConvertOptions{})
	if stats.Format != FormatAzure || len(reqs) != 1 {
		t.Errorf("format %q, %d requests; want azure and 1", stats.Format, len(reqs))
	}
}

// FuzzConvertTrace: whatever the input, ConvertTrace returns (never panics), and what it
// writes is Mooncake lines that the reader accepts one by one.
func FuzzConvertTrace(f *testing.F) {
	f.Add(`{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}`, uint8(0))
	f.Add(`[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]`, uint8(1))
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n", uint8(2))
	f.Add("Timestamp,Model,Request tokens,Response tokens\n5,m,472,18\n", uint8(3))
	f.Add(`{"timestamp": 1.5, "input_length": 100, "output_length": 3, "hash_ids": [1, 2]}`, uint8(4))
	f.Add(`{"prompt": "abc", "output_tokens": 0}`, uint8(5))
	f.Fuzz(func(t *testing.T, in string, pick uint8) {
		formats := append([]TraceFormat{""}, TraceFormats()...)
		o := ConvertOptions{From: formats[int(pick)%len(formats)]}
		if o.From == FormatMooncake {
			o.TimeUnit, o.BlockTokens = time.Second, 64
		}
		var out bytes.Buffer
		_, _ = ConvertTrace(&out, strings.NewReader(in), o)
		for i, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if l == "" {
				continue
			}
			if _, _, err := parseMooncakeLine([]byte(l)); err != nil {
				t.Fatalf("output line %d %q: %v", i+1, l, err)
			}
		}
	})
}
