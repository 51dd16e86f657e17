package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/version"
)

func TestVersion(t *testing.T) {
	want := version.Get()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), args, &out, &errOut); code != 0 {
			t.Fatalf("%v: exit %d, stderr %q", args, code, errOut.String())
		}
		if got := strings.TrimSpace(out.String()); got != want.String() || !strings.HasPrefix(got, "kvroute ") {
			t.Errorf("%v printed %q, want %q", args, got, want.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"version", "--json"}, &out, &errOut); code != 0 {
		t.Fatalf("--json: exit %d, stderr %q", code, errOut.String())
	}
	var got version.Info
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got != want {
		t.Errorf("--json printed %q (%v), want %+v", out.String(), err, want)
	}
	if code := run(context.Background(), []string{"version", "extra"}, &out, &errOut); code != 2 {
		t.Errorf("an extra argument: exit %d, want 2", code)
	}
}
