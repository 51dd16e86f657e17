package openai

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRewriteText(t *testing.T) {
	upper := strings.ToUpper
	tests := []struct {
		kind        Kind
		body, want  string
		wantChanged bool
	}{
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"hi","x":1},{"role":"user","content":[{"type":"text","text":"a","y":2},{"type":"image_url","image_url":{"url":"u"}}]}],"z":3}`,
			`{"model":"m","messages":[{"role":"user","content":"HI","x":1},{"role":"user","content":[{"type":"text","text":"A","y":2},{"type":"image_url","image_url":{"url":"u"}}]}],"z":3}`, true},
		{KindChat, `{"model":"m","messages":[{"role":"user","content":"HI"}]}`, `{"model":"m","messages":[{"role":"user","content":"HI"}]}`, false},
		{KindCompletion, `{"prompt":"ab","model":"m"}`, `{"prompt":"AB","model":"m"}`, true},
		{KindCompletion, `{"prompt":[1,2],"model":"m"}`, `{"prompt":[1,2],"model":"m"}`, false},
		{KindResponse, `{"input":"q","instructions":"s"}`, `{"input":"Q","instructions":"S"}`, true},
	}
	for _, tt := range tests {
		got, changed, err := RewriteText(tt.kind, []byte(tt.body), upper)
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if changed != tt.wantChanged {
			t.Errorf("%s: changed = %v", tt.body, changed)
		}
		if diff := cmp.Diff(tt.want, string(got)); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	}
}

func TestTimingsCached(t *testing.T) {
	for _, tc := range []struct {
		body string
		n    int
		ok   bool
	}{
		{`{"choices":[],"timings":{"cache_n":1520,"prompt_n":41}}`, 1520, true},
		{`{"choices":[],"timings":{"prompt_n":41}}`, 0, false},
		{`{"choices":[],"usage":{"prompt_tokens":3}}`, 0, false},
		{`{"timings":{"cache_n":-1}}`, 0, false},
		{`{"timings": nul`, 0, false},
	} {
		if n, ok := TimingsCached([]byte(tc.body)); n != tc.n || ok != tc.ok {
			t.Errorf("TimingsCached(%s) = %d, %v; want %d, %v", tc.body, n, ok, tc.n, tc.ok)
		}
	}
}
