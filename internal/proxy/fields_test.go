package proxy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tenant"
	"github.com/kvroute/kvroute/internal/testlog"
)

// A tenant's priority (and the other engineFields) does not reach the engine unless
// the tenant's allow_fields names it: every other one is removed, however the body names it
// (escaped, twice); a body that names none is forwarded as it came (the salt spliced in);
// without tenants the body passes unchanged.
func TestEngineFieldsRemoved(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"say \"priority\": 1"}]`
	gate := func() *tenant.Gate {
		return tenantGate(t, metrics.New(prometheus.NewRegistry()).Tenant, `tenants:
  - {name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}
  - {name: t2, api_keys: ["`+tenant.HashKey("sk-2")+`"], allow_fields: [priority]}
`)
	}
	tests := []struct {
		name, body string
		key        string // "": no tenant
		want       string // the body the engine gets, before the tenant's cache_salt
		removed    string // the access line's removed_fields
	}{
		{name: "tenant, priority", body: `{"model":"m","priority":-100,` + msgs + `}`, key: "sk-1",
			want: `{"model":"m",` + msgs + `}`, removed: "priority"},
		{name: "tenant, every field", key: "sk-1",
			body: `{"model":"m", "priority" : -5, "kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9","remote_port":5600,"remote_block_ids":[1,2]},` +
				`"ec_transfer_params":{},"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":7,` + msgs + `}`,
			want:    `{"model":"m",` + msgs + `}`,
			removed: "priority,kv_transfer_params,ec_transfer_params,bootstrap_host,bootstrap_port,bootstrap_room"},
		{name: "tenant, escaped and twice", key: "sk-1", body: `{"model":"m","priorit\u0079":-1,` + msgs + `,"priority":-2}`,
			want: `{"model":"m",` + msgs + `}`, removed: "priority"},
		{name: "tenant, only in a message and in another case", key: "sk-1",
			body: `{"model":"m","Priority_hint":1,"messages":[{"role":"user","content":"x","priority":1}]}`,
			want: `{"model":"m","Priority_hint":1,"messages":[{"role":"user","content":"x","priority":1}]}`},
		{name: "tenant, stream", key: "sk-1", body: `{"model":"m","stream":true,"priority":-100,` + msgs + `}`,
			want: `{"model":"m","stream":true,` + msgs + `,"stream_options":{"include_usage":true}}`, removed: "priority"},
		{name: "no tenant", body: `{"model":"m","priority":-100,"kv_transfer_params":{},` + msgs + `}`,
			want: `{"model":"m","priority":-100,"kv_transfer_params":{},` + msgs + `}`},
		{name: "tenant allowed priority", key: "sk-2", body: `{"model":"m","priority":-100,"kv_transfer_params":{},` + msgs + `}`,
			want: `{"model":"m","priority":-100,` + msgs + `}`, removed: "kv_transfer_params"},
	}
	for _, tt := range tests {
		e := newFakeEngine(t)
		f := newFixture(t, spec(e.srv.URL, "m"))
		var logs testlog.Buffer
		f.h.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		var hdr []string
		if tt.key != "" {
			f.h.Gate = gate()
			hdr = []string{"Authorization", "Bearer " + tt.key}
		}
		if resp, got := f.post(t, "/v1/chat/completions", tt.body, hdr...); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tt.name, resp.StatusCode, got)
		}
		want := []byte(tt.want)
		if tt.key != "" {
			salt := strconv.Quote(tenant.Salt([]byte(testSecret), "t"+tt.key[len("sk-"):]))
			var err error
			if want, err = openai.Patch(want, openai.Set{Key: "cache_salt", Value: []byte(salt)}); err != nil {
				t.Fatal(err)
			}
		}
		got := e.received()
		if len(got) != 1 || !jsonEqual(got[0], want) {
			t.Errorf("%s: the engine got %q, want %q", tt.name, got, want)
			continue
		}
		if tt.removed == "" && tt.key == "" && string(got[0]) != tt.body {
			t.Errorf("%s: the body was changed: %q, want %q byte for byte", tt.name, got[0], tt.body)
		}
		var line struct {
			Removed string `json:"removed_fields"`
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(logs.String())), &line); err != nil || line.Removed != tt.removed {
			t.Errorf("%s: access line's removed_fields %q (%v), want %q", tt.name, line.Removed, err, tt.removed)
		}
	}
}

// jsonEqual reports whether a and b are the same JSON value, member order aside.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func TestTopLevelNames(t *testing.T) {
	names := []string{"priority", "kv_transfer_params"}
	for _, tc := range []struct {
		body  string
		found uint
		ok    bool
	}{
		{`{}`, 0, true},
		{` { } `, 0, true},
		{`{"model":"m"}`, 0, true},
		{`{"priority":1}`, 1, true},
		{`{"a":"x\"priority\":1","b":[{"priority":1}],"c":{"priority":{"kv_transfer_params":1}}}`, 0, true},
		{`{"a":"\\","priority":null}`, 1, true},
		{`{"a":"\\\"","priority":null}`, 1, true},
		{"{\n\t\"kv_transfer_params\" :\n{\"x\":[1,2,{\"y\":\"]}\"}]}, \"priority\":-1e3 }", 3, true},
		{`{"priorit\u0079":true,"kv\u005ftransfer_params":false}`, 3, true},
		{`{"Priority":1,"priority ":2,"prio":3}`, 0, true},
		{`{"a":[1,2,3],"b":true,"c":null,"priority":[]}`, 1, true},
		{`[{"priority":1}]`, 0, false},
		{`{"priority":1`, 0, false},
		{`{"priority" 1}`, 0, false},
		{`{"a":"unterminated}`, 0, false},
		{`{"a":[1,2}`, 0, false},
		{`{"priorit\u00":1}`, 0, false},
		{``, 0, false},
	} {
		found, ok := topLevelNames([]byte(tc.body), names)
		if found != tc.found || ok != tc.ok {
			t.Errorf("topLevelNames(%q) = %b, %v; want %b, %v", tc.body, found, ok, tc.found, tc.ok)
		}
	}
}

// FuzzTopLevelNames: for any JSON object, topLevelNames finds the names encoding/json finds at
// its top level (the engines' readers decode names the same way), and never panics.
func FuzzTopLevelNames(f *testing.F) {
	for _, s := range []string{`{"priority":1}`, `{"a":"\"","priorit\u0079":[{"priority":1}]}`, `{"a":{"b":["priority"]},"kv_transfer_params":{}}`,
		` {"x" : -1.5e3 , "priority":"\\\\"} `, `{}`, `[1]`, `{"a":"\ud800"}`} {
		f.Add([]byte(s))
	}
	names := []string{"priority", "kv_transfer_params", "a"}
	f.Fuzz(func(t *testing.T, body []byte) {
		found, ok := topLevelNames(body, names)
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || m == nil {
			return // not one JSON object: what topLevelNames says of it is not used to skip Patch
		}
		// encoding/json matches a struct's names ignoring case, but a map's keys are as decoded.
		var want uint
		for k := range m {
			if i := slices.Index(names, k); i >= 0 {
				want |= 1 << i
			}
		}
		if !ok || found != want {
			t.Errorf("topLevelNames(%q) = %b, %v; encoding/json finds %b", body, found, ok, want)
		}
	})
}

// FuzzBestOf: for any JSON object, bestOf reads best_of as encoding/json decodes the object's
// top level (names unescaped, the last of a repeated one, as the engines' readers take them):
// nothing where it is absent or null, its value where that is an integer from 1 to maxChoices,
// else a 400 naming it; and it never panics.
func FuzzBestOf(f *testing.F) {
	for _, s := range []string{`{"best_of":3}`, `{"best\u005fof":129}`, `{"best_of":1,"best_of":-1}`, `{"best_of":null,"prompt":"best_of"}`,
		`{"best_of":2.0}`, `{"best_of":"2"}`, `{"best_of":99999999999999999999}`, `{"a":{"best_of":300}}`, `{}`, `[1]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, oe := bestOf(body)
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil || m == nil {
			return // not one JSON object: openai.Parse refuses it before
		}
		v, named := m["best_of"]
		var want int
		wantErr := false
		if named && string(v) != "null" {
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 1 || n > maxChoices || strings.ContainsAny(string(v), "+") {
				wantErr = true
			} else {
				want = n
			}
		}
		switch {
		case wantErr && (oe == nil || oe.Param == nil || *oe.Param != "best_of"):
			t.Errorf("bestOf(%q) = %d, %v; want a 400 naming best_of", body, got, oe)
		case !wantErr && (oe != nil || got != want):
			t.Errorf("bestOf(%q) = %d, %v; want %d", body, got, oe, want)
		}
	})
}

// BenchmarkBestOf is what reading best_of costs a completions request (the top-level scan
// topLevelNames makes, with nothing to decode): a 4 KB text prompt, and a prompt of 100,000
// token ids, the worst case (numbers are read a byte at a time).
func BenchmarkBestOf(b *testing.B) {
	sys := strings.Repeat("You are a helpful assistant who answers briefly. ", 80)[:3900]
	p := make([]int, 100000)
	for i := range p {
		p[i] = 10000 + i%90000
	}
	ids, _ := json.Marshal(map[string]any{"model": "m", "prompt": p, "n": 2})
	for _, bc := range []struct {
		name string
		body []byte
	}{{"text=4KB", []byte(`{"model":"m","max_tokens":64,"n":2,"prompt":` + strconv.Quote(sys) + `}`)}, {"ids/tokens=100000", ids}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if n, oe := bestOf(bc.body); n != 0 || oe != nil {
					b.Fatal(n, oe)
				}
			}
		})
	}
}

// The body a tenant's request is forwarded with is left alone when it names no engine field:
// the check reads it without copying it.
func TestDropEngineFieldsKeepsBody(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"priority"}]}`)
	c := &call{h: &Handler{}, id: &tenant.Identity{Name: "t1"}, body: body}
	if oe := c.dropEngineFields(); oe != nil || &c.body[0] != &body[0] || c.removed != nil {
		t.Errorf("dropEngineFields: %v, body copied %v, removed %v; want the body as it was", oe, &c.body[0] != &body[0], c.removed)
	}
	c.body = []byte(`{"model":"m","priority":1}`)
	if oe := c.dropEngineFields(); oe != nil || string(c.body) != `{"model":"m"}` {
		t.Errorf("dropEngineFields: %v, body %s; want priority removed", oe, c.body)
	}
	c = &call{h: &Handler{}, id: &tenant.Identity{Name: "t1"}, body: []byte(`["priority"]`)}
	if oe := c.dropEngineFields(); oe == nil || oe.Status != http.StatusBadRequest {
		t.Errorf("a body that is no object: %v, want a 400 (never sent with the fields)", oe)
	}
}

// BenchmarkTopLevelNames is what a tenant's request costs to find its engine fields in (none
// here, the usual case: the body is then forwarded as it came), beside openai.Patch, which the
// check spares such bodies (it decodes and copies the whole body). "ids" is a completion whose
// prompt is token ids, the worst case: numbers are read a byte at a time.
func BenchmarkTopLevelNames(b *testing.B) {
	ids := func(n int) []byte {
		p := make([]int, n)
		for i := range p {
			p[i] = 10000 + i%90000
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "prompt": p})
		return body
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{{"chat/tokens=1000", conversation(1000)}, {"chat/tokens=100000", conversation(100000)}, {"ids/tokens=100000", ids(100000)}} {
		b.Run(bc.name+"/scan", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if found, ok := topLevelNames(bc.body, engineFields[:]); found != 0 || !ok {
					b.Fatal(found, ok)
				}
			}
		})
		b.Run(bc.name+"/patch", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if _, err := openai.Patch(bc.body, openai.Set{Key: "priority"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
