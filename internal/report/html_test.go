package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// htmlFixture is two runs of 40 requests on 3 endpoints: "fast" hits the cache, "<slow>" (a
// name that must be escaped) does not.
func htmlFixture() (*Summary, [][]Record) {
	var recs [][]Record
	for run, ttft := range []time.Duration{20 * time.Millisecond, 300 * time.Millisecond} {
		var rs []Record
		for i := range 40 {
			at := time.Duration(i) * 250 * time.Millisecond
			ft := at + ttft + time.Duration(i)*time.Millisecond
			r := Record{ID: "r", EndpointID: i % 3, Arrival: at, FirstToken: ft, Finish: ft + time.Second, PromptTokens: 1000, OutputTokens: 10}
			if run == 0 {
				r.CachedTokens = 800
			}
			if i == 39 {
				r.Err = "http_503"
			}
			rs = append(rs, r)
		}
		recs = append(recs, rs)
	}
	s := &Summary{
		Scenario: Scenario{Workload: "shared-prefix", Requests: 40, Instances: 3, Profile: "p", Speedup: 1, Seed: 1},
		Bounds:   Bounds{InfiniteCacheHitRate: 0.9, PooledLRUHitRate: 0.85},
		Results:  []Result{Summarize("fast", recs[0], nil), Summarize("<slow>", recs[1], nil)},
	}
	return s, recs
}

func TestWriteHTML_Structure(t *testing.T) {
	s, recs := htmlFixture()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, s, recs, HTMLOptions{Title: "demo", Notes: []string{"times in model time"}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()

	// Self-contained: no script, nothing fetched (the SVG namespace is a name, not a fetch).
	withoutNS := strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, "")
	for _, bad := range []string{"<script", "http://", "https://", "<slow>"} {
		if strings.Contains(withoutNS, bad) {
			t.Errorf("report contains %q", bad)
		}
	}
	if !strings.Contains(page, "&lt;slow&gt;") {
		t.Error("run name not escaped into the page")
	}

	// Four charts, in order, each one well-formed SVG.
	ids := regexp.MustCompile(`<figure id="([a-z-]+)">`).FindAllStringSubmatch(page, -1)
	var got []string
	for _, m := range ids {
		got = append(got, m[1])
	}
	if diff := cmp.Diff([]string{"ttft-cdf", "ttft-time", "endpoint-share", "hit-rate"}, got); diff != "" {
		t.Errorf("charts (-want +got):\n%s", diff)
	}
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(page, -1)
	if len(svgs) != 4 {
		t.Fatalf("got %d svg elements, want 4", len(svgs))
	}
	for i, svg := range svgs {
		if err := wellFormed(svg); err != nil {
			t.Errorf("chart %d is not well-formed XML: %v", i, err)
		}
		if strings.Contains(svg, "no data") {
			t.Errorf("chart %d says no data", i)
		}
	}
	// One line per run in the CDF and the time chart; 3 endpoint bars and 1 hit-rate bar per run.
	for i, want := range []int{2, 2} {
		if n := strings.Count(svgs[i], "<polyline"); n != want {
			t.Errorf("chart %d has %d lines, want %d", i, n, want)
		}
	}
	if n := strings.Count(svgs[2], `class="bar"`); n != 6 {
		t.Errorf("endpoint chart has %d bars, want 6", n)
	}
	if n := strings.Count(svgs[3], `class="bar"`); n != 2 {
		t.Errorf("hit-rate chart has %d bars, want 2", n)
	}
	if !strings.Contains(svgs[3], ">0.800<") || !strings.Contains(svgs[3], "infinite cache bound 0.900") {
		t.Error("hit-rate chart lacks the run's 0.800 label or the bound")
	}
	// The CDF of the slow run starts right of the fast one's.
	first := regexp.MustCompile(`points="([0-9.]+),`).FindAllStringSubmatch(svgs[0], -1)
	if len(first) != 2 {
		t.Fatalf("CDF start points %v: want 2", first)
	}
	fast, _ := strconv.ParseFloat(first[0][1], 64)
	slow, _ := strconv.ParseFloat(first[1][1], 64)
	if fast >= slow {
		t.Errorf("CDF starts at x=%v (fast) and x=%v (slow): want the fast run left", fast, slow)
	}
}

func wellFormed(s string) error {
	d := xml.NewDecoder(strings.NewReader(s))
	for range 1_000_000 {
		if _, err := d.Token(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
	return errors.New("too many tokens")
}

func TestWriteHTML_Empty(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, &Summary{}, nil, HTMLOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "no data"); n != 4 {
		t.Errorf("empty report has %d 'no data' charts, want 4", n)
	}
	if err := WriteHTML(&buf, nil, nil, HTMLOptions{}); err == nil {
		t.Error("nil summary: no error")
	}
}

// TestWriteHTML_Chromium opens the report in headless Chromium, when installed, and checks
// that it logs no console error and renders a screenshot.
func TestWriteHTML_Chromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed")
	}
	if testing.Short() {
		t.Skip("short mode")
	}
	s, recs := htmlFixture()
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	var buf bytes.Buffer
	if err := WriteHTML(&buf, s, recs, HTMLOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(page, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "shot.png")
	ctx := t.Context()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--enable-logging=stderr", "--v=0",
		"--window-size=1400,1400", "--screenshot="+shot, "file://"+page)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "CONSOLE") || strings.Contains(line, "Uncaught") {
			t.Errorf("console message: %s", line)
		}
	}
	st, err := os.Stat(shot)
	if err != nil || st.Size() < 10_000 {
		t.Errorf("screenshot %v, %v: want a rendered PNG", st, err)
	}
}

// An unknown hit rate is written as such: "unknown" in the table and in place of the bar, and
// no pooled LRU bound line when that bound is unknown.
func TestWriteHTML_UnknownHitRate(t *testing.T) {
	s, recs := htmlFixture()
	s.Results[1].HitRate, s.Results[1].HitRateUnknown = 0, true
	s.Bounds.PooledLRUUnknown = true
	var buf bytes.Buffer
	if err := WriteHTML(&buf, s, recs, HTMLOptions{}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if !strings.Contains(page, "<td>0.800</td>") || !strings.Contains(page, "<td>unknown</td>") {
		t.Error("summary table: want 0.800 for the first run, unknown for the second")
	}
	svgs := regexp.MustCompile(`(?s)<svg.*?</svg>`).FindAllString(page, -1)
	if len(svgs) != 4 {
		t.Fatalf("got %d svg elements, want 4", len(svgs))
	}
	hit := svgs[3]
	if err := wellFormed(hit); err != nil {
		t.Errorf("hit-rate chart is not well-formed XML: %v", err)
	}
	if n := strings.Count(hit, `class="bar"`); n != 1 {
		t.Errorf("hit-rate chart has %d bars, want 1 (none for the unknown run)", n)
	}
	if !strings.Contains(hit, `class="unknown" data-run="&lt;slow&gt;"`) || strings.Contains(hit, "pooled LRU") {
		t.Errorf("hit-rate chart: want the unknown run marked and no pooled LRU bound:\n%s", hit)
	}
}

// The page's summary row of a run that completed nothing says what the table says: "-" for
// every latency and the imbalance, not 0.00 (instant) and 1.00 (even).
func TestWriteHTML_NothingCompleted(t *testing.T) {
	s := &Summary{
		Scenario: Scenario{Workload: "w", Requests: 3, Instances: 1, Profile: "http://127.0.0.1:1", Speedup: 1, Seed: 1},
		Results:  []Result{{Policy: "bench", HitRateUnknown: true, LoadImbalance: 1, Failed: 3}},
	}
	var buf bytes.Buffer
	if err := WriteHTML(&buf, s, nil, HTMLOptions{}); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?s)<tbody>\s*<tr>(.*?)</tr>`).FindStringSubmatch(buf.String())
	if row == nil {
		t.Fatalf("no summary row:\n%s", buf.String())
	}
	var cells []string
	for _, m := range regexp.MustCompile(`<td>(?:<span[^>]*></span>)?([^<]*)</td>`).FindAllStringSubmatch(row[1], -1) {
		cells = append(cells, m[1])
	}
	want := []string{"bench", "unknown", "-", "-", "-", "-", "0", "-", "0", "3"}
	if diff := cmp.Diff(want, cells); diff != "" {
		t.Errorf("summary row (-want +got):\n%s", diff)
	}
}
