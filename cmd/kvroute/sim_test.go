package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

func TestRunSimServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	var stderr strings.Builder
	code := make(chan int, 1)
	go func() {
		code <- runSim(ctx, []string{"--instances", "2", "--port", "0", "--profile", "instant", "--admin", "--drain", "1s", "--drop-on", "POISON", "--drop-all"}, pw, &stderr)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var urls []string
	for len(urls) < 2 && sc.Scan() {
		f := strings.Fields(sc.Text()) // "instance 0: http://127.0.0.1:PORT model=..."
		if len(f) < 3 || !strings.HasPrefix(f[2], "http://127.0.0.1:") {
			t.Fatalf("unexpected line %q", sc.Text())
		}
		urls = append(urls, f[2])
	}
	if len(urls) != 2 || urls[0] == urls[1] {
		t.Fatalf("instance URLs = %v (stderr: %s)", urls, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	for _, u := range urls {
		resp, err := http.Get(u + "/admin/faults")
		if err != nil {
			t.Fatal(err)
		}
		var f simserver.Faults
		err = json.NewDecoder(resp.Body).Decode(&f)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil || f.DropOn != "POISON" || !f.DropAll {
			t.Errorf("GET %s/admin/faults = %d %+v (%v), want 200 with the faults the flags set", u, resp.StatusCode, f, err)
		}
	}
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("runSim returned %d (stderr: %s)", c, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runSim did not stop 10s after its context ended")
	}
}

func TestRunSimBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--time-scale", "-1"},
		{"--fail-rate", "2"},
		{"--drop-all"},
		{"--profile", "no-such-profile"},
		{"--instances", "0"},
		{"extra"},
	} {
		var stdout, stderr strings.Builder
		if code := runSim(context.Background(), append(args, "--port", "0"), &stdout, &stderr); code == 0 || stderr.Len() == 0 {
			t.Errorf("runSim %v = %d, stderr %q; want a failure with a message", args, code, stderr.String())
		}
	}
}
