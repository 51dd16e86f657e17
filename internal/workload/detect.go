package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// TraceFormat is a trace format that ConvertTrace reads.
type TraceFormat string

// The formats ConvertTrace reads.
const (
	// FormatMooncake is the form every verb replays, with its timestamps in another unit or its
	// blocks of another size.
	FormatMooncake TraceFormat = "mooncake"
	// FormatOpenAI is JSON Lines of OpenAI request bodies (chat completions, completions,
	// Responses), what a gateway logs; lines of the Batch API's input file ({"body": {...}});
	// and vLLM benchmark prompts ({"prompt": "...", "output_tokens": N}).
	FormatOpenAI TraceFormat = "openai"
	// FormatShareGPT is a ShareGPT data set: a JSON array (or JSON Lines) of conversations,
	// {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}.
	FormatShareGPT TraceFormat = "sharegpt"
	// FormatAzure is the Azure LLM inference trace: CSV with TIMESTAMP (a date and time),
	// ContextTokens and GeneratedTokens.
	FormatAzure TraceFormat = "azure"
	// FormatBurstGPT is the BurstGPT trace: CSV with Timestamp (seconds from its start),
	// Model, Request tokens, Response tokens, Total tokens and Log Type.
	FormatBurstGPT TraceFormat = "burstgpt"
)

// TraceFormats are the formats ConvertTrace reads, in the order help lists them.
func TraceFormats() []TraceFormat {
	return []TraceFormat{FormatOpenAI, FormatShareGPT, FormatAzure, FormatBurstGPT, FormatMooncake}
}

// ParseTraceFormat returns the format called name.
func ParseTraceFormat(name string) (TraceFormat, error) {
	for _, f := range TraceFormats() {
		if string(f) == name {
			return f, nil
		}
	}
	return "", fmt.Errorf("unknown trace format %q, want one of %s", name, formatNames())
}

// detectTraceFormat tells a trace's format from its first bytes (UTF-8 text, as after
// openText): the format and what was seen, in words ("an Azure LLM inference trace (CSV:
// TIMESTAMP,ContextTokens,GeneratedTokens)"). A format it does not know gives "" and, when it
// can tell, what the input is ("a JSON array"), else "" too.
func detectTraceFormat(head []byte) (TraceFormat, string) {
	b := bytes.TrimLeft(head, " \t\r\n")
	if len(b) == 0 {
		return "", ""
	}
	first, _, _ := bytes.Cut(b, []byte("\n"))
	first = bytes.TrimSpace(first)
	switch b[0] {
	case '[':
		if bytes.Contains(b, []byte(`"conversations"`)) {
			return FormatShareGPT, "a ShareGPT data set (a JSON array of conversations)"
		}
		return "", "a JSON array, not JSON Lines (one object a line)"
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(first, &m) != nil {
			if len(first) == 1 && len(bytes.TrimSpace(b[1:])) > 0 {
				return "", "JSON spread over several lines, not JSON Lines (one object a line)"
			}
			return "", ""
		}
		return detectObject(m)
	}
	// A CSV header: the column names say whose trace it is.
	if bytes.ContainsRune(first, ',') {
		cols := csvColumns(string(first))
		switch {
		case cols["contexttokens"] && cols["generatedtokens"]:
			return FormatAzure, "an Azure LLM inference trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens)"
		case cols["request tokens"] && cols["response tokens"]:
			return FormatBurstGPT, "a BurstGPT trace (CSV: Timestamp,Model,Request tokens,Response tokens,...)"
		}
		return "", fmt.Sprintf("a CSV file (its first line: %.80q)", first)
	}
	return "", ""
}

// detectObject tells the format of JSON Lines from the names in its first object.
func detectObject(m map[string]json.RawMessage) (TraceFormat, string) {
	has := func(k string) bool { _, ok := m[k]; return ok }
	switch {
	case has("hash_ids") || has("input_length"):
		return FormatMooncake, "a Mooncake trace"
	case has("conversations"):
		return FormatShareGPT, "a ShareGPT data set (JSON Lines of conversations)"
	case has("body") && has("url"):
		return FormatOpenAI, "an OpenAI Batch API input file (JSON Lines of requests with a body)"
	case has("messages"):
		return FormatOpenAI, "OpenAI chat completion request bodies (JSON Lines, as a gateway logs them)"
	case has("prompt") && has("model"):
		return FormatOpenAI, "OpenAI completion request bodies (JSON Lines, as a gateway logs them)"
	case has("prompt"):
		return FormatOpenAI, `vLLM benchmark prompts (JSON Lines of {"prompt": ...})`
	case has("input") && has("model"):
		return FormatOpenAI, "OpenAI Responses request bodies (JSON Lines, as a gateway logs them)"
	}
	return "", ""
}

// csvColumns is the set of a CSV header's column names, trimmed, unquoted and in lower case.
func csvColumns(header string) map[string]bool {
	cols := map[string]bool{}
	for c := range strings.SplitSeq(header, ",") {
		cols[strings.ToLower(strings.Trim(strings.TrimSpace(c), `"`))] = true
	}
	return cols
}

// otherFormat is the error for a trace whose first line is not a Mooncake line, when its head
// shows what it is instead; nil when it does not (the line's own error says more).
func otherFormat(head []byte) error {
	f, what := detectTraceFormat(head)
	switch {
	case f == FormatMooncake || what == "":
		return nil
	case f == "":
		return fmt.Errorf("the trace is %s (want %s)", what, mooncakeFormat)
	}
	note := ""
	if f == FormatAzure || f == FormatBurstGPT {
		note = "; it has no prompt text, so the converted trace shows no prefix sharing"
	}
	return fmt.Errorf("the trace is %s, not Mooncake JSON Lines: convert it with kvroute trace convert --from %s FILE > trace.jsonl%s", what, f, note)
}
