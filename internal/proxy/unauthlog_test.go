package proxy

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/tenant"
)

// TestUnauthorizedLinesBounded: a client's 401s write at most unauthPerKey access lines a
// window for each error code; the others are counted and their count written in one line at
// the flush. Before, every 401 wrote its line (2,000 wrong keys a second: ~49 GB a day). Other
// requests' lines are not bounded, and a new window writes again.
func TestUnauthorizedLinesBounded(t *testing.T) {
	e := newFakeEngine(t)
	f := newFixture(t, spec(e.srv.URL, "m"))
	logs := jsonLogger(f)
	f.h.Gate = tenantGate(t, f.h.Metrics.Tenant, `tenants: [{name: t1, api_keys: ["`+tenant.HashKey("sk-1")+`"]}]`)
	f.h.once.Do(f.h.init)
	clk := &manualClock{now: time.Unix(1_700_000_000, 0)}
	var flush func()
	f.h.unauth.now = clk.Now
	f.h.unauth.after = func(d time.Duration, fn func()) {
		if d != unauthWindow || flush != nil {
			t.Errorf("flush armed after %v (already armed: %v); want once, after %v", d, flush != nil, unauthWindow)
		}
		flush = fn
	}
	for range 20 {
		if resp, _ := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer wrong"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	}
	for range 3 {
		f.post(t, "/v1/chat/completions", chatBody) // no key: another error code
	}
	for range 10 {
		if resp, _ := f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer sk-1"); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
	}
	errCode := func(l map[string]any) string { s, _ := l["error_code"].(string); return s }
	lines := map[string]int{}
	for _, l := range accessLines(t, logs) {
		lines[errCode(l)]++
	}
	if lines["invalid_api_key"] != unauthPerKey || lines["missing_api_key"] != 3 || lines[""] != 10 {
		t.Errorf("access lines by error code %v; want %d invalid_api_key, 3 missing_api_key, 10 served", lines, unauthPerKey)
	}
	if flush == nil {
		t.Fatal("no flush armed for the lines not written")
	}
	flush()
	var summaries []map[string]any
	for _, l := range logs.JSONLines(t) {
		if _, ok := l["suppressed"]; ok {
			summaries = append(summaries, l)
		}
	}
	if len(summaries) != 1 || summaries[0]["suppressed"] != float64(20-unauthPerKey) || summaries[0]["error_code"] != "invalid_api_key" ||
		summaries[0]["remote_addr"] != "127.0.0.1" || summaries[0]["status"] != float64(401) {
		t.Errorf("count lines %v; want one: 401, invalid_api_key, remote_addr 127.0.0.1, suppressed %d", summaries, 20-unauthPerKey)
	}
	clk.advance(unauthWindow)
	f.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer wrong")
	if n := len(accessLines(t, logs)); n != unauthPerKey+3+10+1 {
		t.Errorf("%d access lines after a new window's 401; want it written (%d)", n, unauthPerKey+3+10+1)
	}
}

// TestUnauthLogBounds: the lines of one window are at most unauthPerWindow whatever the
// addresses, and the keys counted apart at most unauthMaxKeys (the rest under unauthOther,
// each error code apart: they were counted under one key without their code).
func TestUnauthLogBounds(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := &unauthLog{now: func() time.Time { return now }, after: func(time.Duration, func()) {}}
	written := 0
	for i := range 1000 {
		if l.allow("10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256)+":1234", "invalid_api_key") {
			written++
		}
	}
	for i := range 50 {
		if l.allow("10.1.0."+strconv.Itoa(i)+":1234", "missing_api_key") {
			written++
		}
	}
	other := func(code string) int { return l.dropped[logKey{addr: unauthOther, code: code}] }
	if written != unauthPerWindow || len(l.dropped) != unauthMaxKeys+2 || other("invalid_api_key") != 1000-unauthPerWindow-unauthMaxKeys || other("missing_api_key") != 50 {
		t.Errorf("%d written, %d keys counted, %d and %d under %q; want %d, %d, %d and 50", written, len(l.dropped),
			other("invalid_api_key"), other("missing_api_key"), unauthOther, unauthPerWindow, unauthMaxKeys+2, 1000-unauthPerWindow-unauthMaxKeys)
	}
}
