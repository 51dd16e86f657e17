package workload

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"
)

// twoLines is a small good trace.
const twoLines = `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [0]}
`

func gzipped(t testing.TB, text string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(text)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func utf16Bytes(text string, bigEndian, bom bool) []byte {
	var b []byte
	units := utf16.Encode([]rune(text))
	if bom {
		units = append([]uint16{0xFEFF}, units...)
	}
	for _, u := range units {
		if bigEndian {
			b = append(b, byte(u>>8), byte(u))
		} else {
			b = append(b, byte(u), byte(u>>8))
		}
	}
	return b
}

// TestReadMooncakeEncodings: gzip (one stream or several, as cat a.gz b.gz makes) and a UTF-8
// byte order mark are read as the trace they hold; UTF-16, other compressions and a gzip
// stream cut short or damaged are bad traces that say what they are and how to convert.
func TestReadMooncakeEncodings(t *testing.T) {
	gz := gzipped(t, twoLines)
	damaged := bytes.Clone(gz)
	damaged[len(damaged)-6] ^= 0xFF // the CRC-32
	tests := []struct {
		name string
		in   []byte
		want string // "" read: two requests; else a substring of the error
	}{
		{"gzip", gz, ""},
		{"two gzip members", append(gzipped(t, twoLines[:len(twoLines)/2]), gzipped(t, twoLines[len(twoLines)/2:])...), ""},
		{"utf-8 bom", append([]byte{0xEF, 0xBB, 0xBF}, twoLines...), ""},
		{"gzip of a bom", gzipped(t, "\uFEFF"+twoLines), ""},
		{"utf-16le bom", utf16Bytes(twoLines, false, true), "the trace is UTF-16 text, with a byte order mark (what Windows PowerShell's > and Out-File write); kvroute reads UTF-8: convert it with iconv -f UTF-16 -t UTF-8 FILE > trace.jsonl, or in PowerShell with Get-Content FILE | Set-Content -Encoding utf8 trace.jsonl"},
		{"utf-16be bom", utf16Bytes(twoLines, true, true), "the trace is UTF-16 text, with a byte order mark"},
		{"utf-16le", utf16Bytes(twoLines, false, false), "the trace is UTF-16 text (it has a NUL byte in every other place)"},
		{"gzip of utf-16", gzipped(t, string(utf16Bytes(twoLines, false, true))), "the trace is UTF-16 text"},
		{"zstd", []byte{0x28, 0xB5, 0x2F, 0xFD, 0, 0, 0}, "the trace is compressed with zstd; kvroute reads plain or gzip-compressed text: decompress it first (zstd -dc FILE > trace.jsonl, or zstd -dc FILE | kvroute ... --trace -)"},
		{"xz", []byte{0xFD, '7', 'z', 'X', 'Z', 0, 1}, "compressed with xz"},
		{"bzip2", []byte("BZh91AY&SY"), "compressed with bzip2"},
		{"zip", []byte("PK\x03\x04\x14\x00"), "compressed with zip"},
		{"gzip cut short", gz[:len(gz)-10], "unexpected EOF (the gzip file is damaged or cut short)"},
		{"gzip damaged", damaged, "gzip: invalid checksum (the gzip file is damaged or cut short)"},
		{"gzip header only", []byte{0x1F, 0x8B, 8}, "(the gzip file is damaged or cut short)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs, err := ReadMooncake(bytes.NewReader(tt.in))
			if tt.want == "" {
				if err != nil || len(reqs) != 2 || reqs[1].PromptTokens != 512 {
					t.Fatalf("ReadMooncake = %d requests, %v; want the 2 of the trace", len(reqs), err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadTrace) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want a bad trace error with %q", err, tt.want)
			}
		})
	}
	// LoadMooncake reads a gzip file whatever its name.
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, gz, 0o600); err != nil {
		t.Fatal(err)
	}
	if reqs, err := LoadMooncake(path); err != nil || len(reqs) != 2 {
		t.Errorf("LoadMooncake(gzip file) = %d requests, %v; want 2", len(reqs), err)
	}
}

// TestReadMooncakeOtherFormats: a trace in another format is refused with what it is and the
// command that converts it, not with the JSON decoder's complaint about its first byte.
func TestReadMooncakeOtherFormats(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n",
			"the trace is an Azure LLM inference trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens), not Mooncake JSON Lines: convert it with kvroute trace convert --from azure FILE > trace.jsonl; it has no prompt text, so the converted trace shows no prefix sharing"},
		{"burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n",
			"the trace is a BurstGPT trace (CSV: Timestamp,Model,Request tokens,Response tokens,...), not Mooncake JSON Lines: convert it with kvroute trace convert --from burstgpt FILE"},
		{"burstgpt v1.1", "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
			"--from burstgpt"},
		{"sharegpt", "[\n  {\n    \"id\": \"x\",\n    \"conversations\": [\n      {\"from\": \"human\", \"value\": \"hi\"}]}]\n",
			"the trace is a ShareGPT data set (a JSON array of conversations), not Mooncake JSON Lines: convert it with kvroute trace convert --from sharegpt FILE"},
		{"sharegpt lines", `{"id": "x", "conversations": [{"from": "human", "value": "hi"}]}` + "\n",
			"the trace is a ShareGPT data set (JSON Lines of conversations)"},
		{"chat bodies", `{"model": "m", "messages": [{"role": "user", "content": "hi"}]}` + "\n",
			"the trace is OpenAI chat completion request bodies (JSON Lines, as a gateway logs them), not Mooncake JSON Lines: convert it with kvroute trace convert --from openai FILE"},
		{"completion bodies", `{"model": "m", "prompt": "hi", "max_tokens": 5}` + "\n", "the trace is OpenAI completion request bodies"},
		{"responses bodies", `{"model": "m", "input": "hi"}` + "\n", "the trace is OpenAI Responses request bodies"},
		{"batch", `{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}` + "\n",
			"the trace is an OpenAI Batch API input file"},
		{"vllm", `{"prompt": "hi", "output_tokens": 5}` + "\n", `the trace is vLLM benchmark prompts (JSON Lines of {"prompt": ...}), not Mooncake JSON Lines: convert it with kvroute trace convert --from openai FILE`},
		{"json array", "[1, 2, 3]\n", "the trace is a JSON array, not JSON Lines (one object a line) (want Mooncake JSON Lines"},
		{"pretty json", "{\n  \"timestamp\": 0\n}\n", "the trace is JSON spread over several lines, not JSON Lines (one object a line)"},
		{"other csv", "a,b,c\n1,2,3\n", `the trace is a CSV file (its first line: "a,b,c") (want Mooncake JSON Lines`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadMooncake(strings.NewReader(tt.in))
			if err == nil || !errors.Is(err, ErrBadTrace) || !strings.HasPrefix(err.Error(), tt.want) && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v\nwant one with %q", err, tt.want)
			}
		})
	}
	// After more blank lines than the sniffed head holds, the first line that is not blank
	// still tells the format.
	for _, tt := range tests[:2] {
		_, err := ReadMooncake(strings.NewReader(strings.Repeat("\n", sniffBytes+10) + tt.in))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s after a long blank start: error %v\nwant one with %q", tt.name, err, tt.want)
		}
	}
	// A later bad line is the line's own error, even if it looks like another format.
	_, err := ReadMooncake(strings.NewReader(twoLines + `{"model": "m", "messages": []}` + "\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "line 3: field timestamp: missing") {
		t.Errorf("error %v; want line 3's own", err)
	}
}
