package discovery

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

func names(specs []endpoint.Spec) []string {
	out := []string{}
	for _, s := range specs {
		out = append(out, s.Name)
	}
	return out
}

// TestSpecs: the config's endpoints in the pool's form, defaults applied by config and
// "metrics_path: -" meaning no scraping.
func TestSpecs(t *testing.T) {
	c, err := config.Parse([]byte(`
auth: {mode: none}
endpoints:
  - {url: "http://127.0.0.1:1/", models: [llama3-70b], engine: vllm, labels: {pool: a}, kv_tokens: 4096}
  - {url: "http://127.0.0.1:2", engine: sglang, step_tokens: 16384}
  - {url: "http://127.0.0.1:3", engine: vllm, cache_salt: false, metrics_path: "-", health_path: /ping}
  - {url: "http://127.0.0.1:4", engine: auto}
  - {url: "http://127.0.0.1:5", engine: auto, cache_salt: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []endpoint.Spec{
		{Name: "http://127.0.0.1:1", Models: []string{"llama3-70b"}, Engine: "vllm", Labels: map[string]string{"pool": "a"},
			KVCapacityTokens: 4096, CacheSalt: true, MetricsPath: "/metrics"},
		{Name: "http://127.0.0.1:2", Engine: "sglang", StepTokens: 16384, MetricsPath: "/metrics"},
		{Name: "http://127.0.0.1:3", Engine: "vllm", HealthPath: "/ping"},
		{Name: "http://127.0.0.1:4", Engine: "auto", CacheSaltAuto: true, MetricsPath: "/metrics"},
		{Name: "http://127.0.0.1:5", Engine: "auto", MetricsPath: "/metrics"},
	}
	got := Specs(c.Endpoints)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("specs (-want +got):\n%s", diff)
	}
	// The specs share nothing with the config: the pool may keep them while a reload edits it.
	got[0].Models[0], got[0].Labels["pool"] = "x", "x"
	if c.Endpoints[0].Models[0] != "llama3-70b" || c.Endpoints[0].Labels["pool"] != "a" {
		t.Errorf("changing a spec changed the config: %+v", c.Endpoints[0])
	}
}

func TestMerge_FirstWins(t *testing.T) {
	got := Merge(
		[]endpoint.Spec{{Name: "a", Engine: "vllm"}, {Name: "b"}},
		[]endpoint.Spec{{Name: "a", Engine: "sglang"}, {Name: "c"}},
	)
	if diff := cmp.Diff([]string{"a", "b", "c"}, names(got)); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	if got[0].Engine != "vllm" {
		t.Errorf("a came from the later set: %+v", got[0])
	}
}

func TestMerge_FeedsPool(t *testing.T) {
	pool := endpoint.NewPool()
	static := []endpoint.Spec{{Name: "http://s:1"}}
	update := func(file []endpoint.Spec) []string {
		t.Helper()
		d, err := pool.Update(Merge(static, file))
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		var removed []string
		for _, e := range d.Removed {
			removed = append(removed, e.Name)
		}
		return removed
	}
	update(nil)
	update([]endpoint.Spec{{Name: "http://f:1"}, {Name: "http://s:1", Engine: "other"}})
	s := pool.ByName("http://s:1")
	if pool.Len() != 2 || s == nil || s.ID != 0 || s.Engine != "" {
		t.Fatalf("pool has %d endpoints, s = %+v; want the static s (ID 0) and f", pool.Len(), s)
	}
	if diff := cmp.Diff([]string{"http://f:1"}, update(nil)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	if pool.ByName("http://s:1") != s {
		t.Error("the static endpoint lost its object when the file changed")
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestFileSource_ReloadsAndKeepsOldOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	write(t, path, "- url: http://10.0.0.1:8000\n  engine: vllm\n")
	sets := make(chan []endpoint.Spec, 10)
	errs := make(chan error, 10)
	f := &FileSource{Path: path, Debounce: 5 * time.Millisecond, Poll: 20 * time.Millisecond,
		OnError: func(err error) { errs <- err }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- f.Run(ctx, func(s []endpoint.Spec) error {
			if len(s) == 1 && s[0].Name == "http://10.0.0.9:8000" {
				return errors.New("pool says no")
			}
			sets <- s
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	next := func() []endpoint.Spec {
		t.Helper()
		select {
		case s := <-sets:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no endpoint set within 10s")
			return nil
		}
	}
	first := next()
	want := []endpoint.Spec{{Name: "http://10.0.0.1:8000", Engine: "vllm", CacheSalt: true, MetricsPath: "/metrics"}}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("first set (-want +got):\n%s", diff)
	}

	write(t, path, "- url: http://10.0.0.1:8000\n  engnie: vllm\n")
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), `unknown key "engnie"`) {
			t.Errorf("error = %v, want the bad key named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a bad file was not reported")
	}
	if len(sets) != 0 {
		t.Fatalf("a bad file emitted a set: %v", <-sets)
	}

	// A set the receiver rejects is reported the same way.
	write(t, path, "- url: http://10.0.0.9:8000\n")
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "pool says no") {
			t.Errorf("error = %v, want the receiver's reason", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a rejected set was not reported")
	}

	write(t, path, "endpoints:\n  - url: http://10.0.0.2:8000\n    engine: sglang\n  - url: http://10.0.0.3:8000\n")
	if diff := cmp.Diff([]string{"http://10.0.0.2:8000", "http://10.0.0.3:8000"}, names(next())); diff != "" {
		t.Errorf("after the fix (-want +got):\n%s", diff)
	}
}

func TestFromConfig(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "kvroute.yaml")
	write(t, cfgPath, "discovery: {file: eps.yaml, poll_interval: 7s}\n")
	c, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	f := FromConfig(c, nil)
	if f == nil || f.Path != filepath.Join(dir, "eps.yaml") || f.Poll != 7*time.Second {
		t.Errorf("file source = %+v", f)
	}
	write(t, f.Path, "- url: http://10.0.0.1:8000\n")
	specs, err := f.Load()
	if err != nil || len(specs) != 1 || specs[0].Name != "http://10.0.0.1:8000" {
		t.Errorf("Load = %+v, %v", specs, err)
	}
	write(t, f.Path, "- url: 5\n")
	if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), "eps.yaml") {
		t.Errorf("Load of a bad file: %v, want an error naming the file", err)
	}
	c.Discovery.File = ""
	if FromConfig(c, nil) != nil {
		t.Error("no discovery.file: want nil")
	}
}

// TestFileSource_WarnsEngineUnset: endpoints in the file that leave engine unset (taken for a
// generic OpenAI API, so never scraped) draw the config's warning, naming them and the fix,
// once per change that has them: at start, not at the polls that find the file unchanged,
// not for a file that sets every engine, and again for a change that leaves one unset.
func TestFileSource_WarnsEngineUnset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "endpoints.yaml")
	const unset = "- url: http://10.0.0.1:8000\n  engine: vllm\n- url: http://10.0.0.2:8000/\n"
	write(t, path, unset)
	sets := make(chan []endpoint.Spec, 10)
	warned := make(chan warnRecord, 10)
	f := &FileSource{Path: path, Debounce: 5 * time.Millisecond, Poll: 20 * time.Millisecond,
		Log: slog.New(warnHandler{warned}), OnError: func(err error) { t.Errorf("file rejected: %v", err) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- f.Run(ctx, func(s []endpoint.Spec) error {
			sets <- s
			return nil
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	next := func() []endpoint.Spec {
		t.Helper()
		select {
		case s := <-sets:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no endpoint set within 10s")
			return nil
		}
	}
	nextWarning := func() warnRecord {
		t.Helper()
		select {
		case w := <-warned:
			return w
		case <-time.After(10 * time.Second):
			t.Fatal("no warning within 10s")
			return warnRecord{}
		}
	}
	// The config's own warning for the same endpoints: the file's says the same.
	c, err := config.Parse([]byte("auth: {mode: none}\nendpoints:\n" + indent(unset)))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 1 {
		t.Fatalf("the config's warnings: %q, want one", c.Warnings)
	}
	want := warnRecord{msg: "discovery file", file: path, warning: c.Warnings[0]}
	if !strings.HasPrefix(want.warning, "endpoints[1] (http://10.0.0.2:8000): no engine, so openai") ||
		!strings.Contains(want.warning, "set engine: ") {
		t.Fatalf("the config's warning %q does not name the endpoint and the fix", want.warning)
	}

	if diff := cmp.Diff([]string{"http://10.0.0.1:8000", "http://10.0.0.2:8000"}, names(next())); diff != "" {
		t.Errorf("first set (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, nextWarning(), cmp.AllowUnexported(warnRecord{})); diff != "" {
		t.Errorf("warning at start (-want +got):\n%s", diff)
	}

	write(t, path, "- url: http://10.0.0.1:8000\n  engine: vllm\n- url: http://10.0.0.2:8000\n  engine: sglang\n")
	next()
	write(t, path, "- url: http://10.0.0.3:8000\n")
	next()
	// Run handles one content at a time: a warning for the polls of the first file, or for
	// the second, would have come before this one.
	want.warning = strings.Replace(want.warning, "endpoints[1] (http://10.0.0.2:8000)", "endpoints[0] (http://10.0.0.3:8000)", 1)
	if diff := cmp.Diff(want, nextWarning(), cmp.AllowUnexported(warnRecord{})); diff != "" {
		t.Errorf("warning after the change that leaves an engine unset (-want +got):\n%s", diff)
	}
	if len(warned) != 0 {
		t.Errorf("more warnings: %+v", <-warned)
	}
}

// indent puts a YAML list under a mapping's key.
func indent(list string) string {
	return "  " + strings.ReplaceAll(strings.TrimSuffix(list, "\n"), "\n", "\n  ") + "\n"
}

// warnRecord is a warning logged: its message and its file and warning attributes.
type warnRecord struct{ msg, file, warning string }

// warnHandler sends the warnings logged (and nothing else) to c.
type warnHandler struct{ c chan<- warnRecord }

func (h warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h warnHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h warnHandler) WithGroup(string) slog.Handler                { return h }

func (h warnHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level != slog.LevelWarn {
		return nil
	}
	w := warnRecord{msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "file":
			w.file = a.Value.String()
		case "warning":
			w.warning = a.Value.String()
		}
		return true
	})
	select {
	case h.c <- w:
	default: // more than the test waits for: it fails on the count, never hangs here
	}
	return nil
}
