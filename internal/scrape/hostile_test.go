package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// manySeries is a vLLM page whose waiting gauge has n series, one per made-up model: 160,000
// of them are the 7 MB page the QA pass served.
func manySeries(t testing.TB, n int) []byte {
	t.Helper()
	in, err := os.ReadFile(filepath.Join("testdata", "vllm.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for line := range strings.Lines(string(in)) {
		if !strings.HasPrefix(line, "vllm:num_requests_waiting{") {
			b.WriteString(line)
			continue
		}
		for i := range n {
			fmt.Fprintf(&b, "vllm:num_requests_waiting{model_name=\"m%d\"} 0\n", i)
		}
		n = 0
	}
	return b.Bytes()
}

// junkServer serves a page of size bytes of a family no engine reads, made as it is sent.
func junkServer(t testing.TB, size int) *httptest.Server {
	t.Helper()
	chunk := bytes.Repeat([]byte("other_metric{a=\"b\"} 1\n"), 4096)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for sent := 0; sent < size; {
			n, err := w.Write(chunk[:min(len(chunk), size-sent)])
			if err != nil {
				return
			}
			sent += n
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func pageServer(t testing.TB, page []byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(page) }))
	t.Cleanup(srv.Close)
	return srv
}

// BenchmarkScrape_Hostile scrapes, as the prober does (default limits), the pages that made
// the router's memory grow with the page size: 160,000 series of a wanted family (7 MB) and
// 100 MB of a family nobody reads. B/op is what one scrape allocates.
func BenchmarkScrape_Hostile(b *testing.B) {
	for _, c := range []struct {
		name string
		srv  *httptest.Server
	}{
		{"wanted-series-7MB", pageServer(b, manySeries(b, 160_000))},
		{"junk-100MB", junkServer(b, 100<<20)},
	} {
		b.Run(c.name, func(b *testing.B) {
			pool, ep := onePool(b, endpoint.Spec{Name: c.srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
			pr := New(pool, c.srv.Client(), Options{ScrapeTimeout: time.Minute}, nil)
			b.ReportAllocs()
			for b.Loop() {
				_ = pr.Scrape(context.Background(), ep)
			}
			if st := pr.Status(ep); st.LastScrapeError != "" {
				b.Logf("%s", strings.TrimSpace(st.LastScrapeError))
			}
		})
	}
}

// allocated runs f and returns the bytes allocated while it ran (by f, and by the test's own
// servers): an upper bound of the memory f held at its peak.
func allocated(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestParse_SeriesCap: a wanted family may have maxSeries series; one more refuses the page,
// saying which family.
func TestParse_SeriesCap(t *testing.T) {
	s, err := Parse("vllm", bytes.NewReader(manySeries(t, maxSeries)), at)
	if err != nil || s.Waiting != 0 || s.Running != 21 {
		t.Fatalf("%d series: %+v, %v; want the page read", maxSeries, s, err)
	}
	_, err = Parse("vllm", bytes.NewReader(manySeries(t, maxSeries+1)), at)
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "over 1024 series of vllm:num_requests_waiting") {
		t.Errorf("%d series: err = %v, want refused for its series", maxSeries+1, err)
	}
}

// TestParse_LineAndKeptBounds: a kept line over maxLine bytes, or over maxKept bytes kept in
// all (of lines the cut cannot read the names of), refuse the page; a long line of a family
// nobody reads is skipped.
func TestParse_LineAndKeptBounds(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "vllm.txt"))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", maxLine)
	skipped := string(in) + "other{a=\"" + long + "\"} 1\n"
	if s, err := Parse("vllm", strings.NewReader(skipped), at); err != nil || s.Running != 21 {
		t.Errorf("long line of another family: %+v, %v; want it skipped", s, err)
	}
	kept := string(in) + "vllm:num_requests_running{model_name=\"" + long + "\"} 1\n"
	if _, err := Parse("vllm", strings.NewReader(kept), at); !errors.Is(err, errRefused) ||
		!strings.Contains(err.Error(), "a line of vllm:num_requests_running is over 65536 bytes") {
		t.Errorf("long line of a wanted family: err = %v, want refused", err)
	}
	var quoted strings.Builder
	quoted.Write(in)
	for i := 0; quoted.Len() <= maxKept+len(in); i++ {
		fmt.Fprintf(&quoted, "{\"other.metric\",n=\"%d\"} 1\n", i)
	}
	if _, err := Parse("vllm", strings.NewReader(quoted.String()), at); !errors.Is(err, errRefused) ||
		!strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Errorf("%d bytes of quoted names: err = %v, want refused", quoted.Len(), err)
	}
}

// TestProber_ScrapeHostilePages: a scrape of a page of 160,000 series of a wanted family (7
// MB), or of 100 MB of another family, costs memory bounded apart from the page's size, and
// the refused page's error shows while the last snapshot stays. Reading the whole page first
// allocated 93 MB and 34 MB.
func TestProber_ScrapeHostilePages(t *testing.T) {
	good := pageServer(t, manySeries(t, 2))
	for _, c := range []struct {
		name, err string
		srv       *httptest.Server
	}{
		{"wanted-series-7MB", "over 1024 series of vllm:num_requests_waiting", pageServer(t, manySeries(t, 160_000))},
		{"junk-100MB", "too large", junkServer(t, 100<<20)},
	} {
		t.Run(c.name, func(t *testing.T) {
			pool, ep := onePool(t, endpoint.Spec{Name: good.URL, Engine: "vllm", MetricsPath: "/metrics"})
			pr := New(pool, good.Client(), Options{ScrapeTimeout: time.Minute}, nil)
			if err := pr.Scrape(context.Background(), ep); err != nil {
				t.Fatal(err)
			}
			before := ep.Snapshot()
			// The same endpoint, now serving the hostile page.
			pool2, ep2 := onePool(t, endpoint.Spec{Name: c.srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
			pr2 := New(pool2, c.srv.Client(), Options{ScrapeTimeout: time.Minute}, nil)
			ep2.SetSnapshot(before)
			var err error
			n := allocated(func() { err = pr2.Scrape(context.Background(), ep2) })
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("err = %v, want %q", err, c.err)
			}
			if st := pr2.Status(ep2); !strings.Contains(st.LastScrapeError, c.err) {
				t.Errorf("last_scrape_error = %q, want %q", st.LastScrapeError, c.err)
			}
			if ep2.Snapshot() != before {
				t.Error("a refused page replaced the snapshot")
			}
			if n > 4<<20 {
				t.Errorf("one scrape allocated %d bytes; want under 4 MiB", n)
			}
			t.Logf("one scrape allocated %d bytes", n)
		})
	}
}

// TestParse_Duplicates: two samples of one label set of a family the router sums refuse the
// page (their sum was read as the value: 50 copies of waiting 3 were 150 waiting).
func TestParse_Duplicates(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "vllm.txt"))
	if err != nil {
		t.Fatal(err)
	}
	withLines := func(lines ...string) string {
		var b strings.Builder
		for line := range strings.Lines(string(in)) {
			if strings.HasPrefix(line, "vllm:num_requests_waiting{") {
				continue
			}
			b.WriteString(line)
			if strings.HasPrefix(line, "# TYPE vllm:num_requests_waiting ") {
				for _, l := range lines {
					b.WriteString(l + "\n")
				}
			}
		}
		return b.String()
	}
	same := make([]string, 50)
	for i := range same {
		same[i] = `vllm:num_requests_waiting{model_name="m"} 3`
	}
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf(`vllm:num_requests_waiting{engine="%d",model_name="m"} 1`, i))
	}
	for _, c := range []struct {
		name    string
		lines   []string
		wantErr string // empty: read, with waiting wantWaiting
		waiting int
	}{
		{"50 copies", same, `duplicate sample of vllm:num_requests_waiting{model_name="m"}`, 0},
		{"labels reordered", []string{`vllm:num_requests_waiting{a="1",b="2"} 3`, `vllm:num_requests_waiting{b="2",a="1"} 4`}, "duplicate sample", 0},
		{"one label more", []string{`vllm:num_requests_waiting{a="1"} 3`, `vllm:num_requests_waiting{a="1",b="2"} 4`}, "", 7},
		{"40 ranks", many, "", 40},
		{"40 ranks, one twice", append(many, `vllm:num_requests_waiting{model_name="m",engine="7"} 1`), `duplicate sample of vllm:num_requests_waiting{model_name="m",engine="7"}`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse("vllm", strings.NewReader(withLines(c.lines...)), at)
			if c.wantErr == "" {
				if err != nil || s.Waiting != c.waiting {
					t.Errorf("got %+v, %v; want waiting %d", s, err, c.waiting)
				}
				return
			}
			if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("err = %v, want %q", err, c.wantErr)
			}
		})
	}
}

// TestParse_NoFamilies: a page with none of the engine's families (empty, or another
// engine's) is an error, not an idle engine; an idle engine's page, with its gauges at 0 or
// (before its first request) its families declared without samples, is read.
func TestParse_NoFamilies(t *testing.T) {
	read := func(name string) string {
		in, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(in)
	}
	for _, c := range []struct{ engine, page string }{
		{"vllm", ""},
		{"vllm", "\n# a comment\n"},
		{"vllm", read("sglang.txt")},
		{"sglang", read("vllm-full.txt")},
		{"tgi", read("llamacpp.txt")},
		{"llamacpp", read("tgi.txt")},
	} {
		if _, err := Parse(c.engine, strings.NewReader(c.page), at); !errors.Is(err, errRefused) ||
			!strings.Contains(err.Error(), "none of the families the router reads for "+c.engine) {
			t.Errorf("%s, page of %d bytes: err = %v, want none of its families", c.engine, len(c.page), err)
		}
	}
	// Each fixture with every sample at 0: an idle engine.
	for _, engine := range []string{"vllm", "sglang", "tgi", "llamacpp"} {
		var idle strings.Builder
		for line := range strings.Lines(read(engine + ".txt")) {
			if name, _, ok := strings.Cut(line, " "); ok && !strings.HasPrefix(line, "#") {
				line = name + " 0\n"
			}
			idle.WriteString(line)
		}
		s, err := Parse(engine, strings.NewReader(idle.String()), at)
		if err != nil || s.Running != 0 || s.Waiting != 0 {
			t.Errorf("idle %s: %+v, %v; want it read, idle", engine, s, err)
		}
	}
	declared := "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\n"
	if s, err := Parse("sglang", strings.NewReader(declared), at); err != nil || *s != (endpoint.Snapshot{At: at}) {
		t.Errorf("families declared without samples: %+v, %v; want an idle snapshot", s, err)
	}
	// A family named in quotes counts too.
	if s, err := Parse("vllm", strings.NewReader(`{"vllm:num_requests_waiting"} 2`+"\n"), at); err != nil || s.Waiting != 2 {
		t.Errorf("quoted name: %+v, %v; want waiting 2", s, err)
	}
}

// TestProber_ScrapeEmptyPage: an empty page's error shows, and the last snapshot stays.
func TestProber_ScrapeEmptyPage(t *testing.T) {
	full := manySeries(t, 2)
	var empty atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !empty.Load() {
			_, _ = w.Write(full)
		}
	}))
	defer srv.Close()
	pool, ep := onePool(t, endpoint.Spec{Name: srv.URL, Engine: "vllm", MetricsPath: "/metrics"})
	pr := New(pool, srv.Client(), Options{}, nil)
	if err := pr.Scrape(context.Background(), ep); err != nil {
		t.Fatal(err)
	}
	s := ep.Snapshot()
	empty.Store(true)
	if err := pr.Scrape(context.Background(), ep); err == nil {
		t.Error("an empty page was read")
	}
	if ep.Snapshot() != s {
		t.Errorf("snapshot = %+v, want the last one kept", ep.Snapshot())
	}
	if st := pr.Status(ep); !strings.Contains(st.LastScrapeError, "none of the families the router reads for vllm") {
		t.Errorf("last_scrape_error = %q, want none of the families", st.LastScrapeError)
	}
}
