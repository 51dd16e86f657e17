package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
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

// A bad flag value is a usage error (exit 2) named on one line, found before anything
// listens; a port that cannot be had is a failure to run (exit 1).
func TestRunSimBadFlags(t *testing.T) {
	// Ended: a fleet that the flags let start stops at once rather than serve.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--time-scale", "-1"}, "time scale -1"},
		{[]string{"--time-scale", "0"}, "--time-scale 0: want a positive factor"},
		{[]string{"--drain", "-1s"}, "--drain -1s: want a duration >= 0"},
		{[]string{"--model", ""}, `--model "": empty`},
		{[]string{"--max-model-len", "0"}, "--max-model-len 0: want a positive token count"},
		{[]string{"--default-max-tokens", "0"}, "--default-max-tokens 0: want a positive token count"},
		{[]string{"--fail-rate", "2"}, "fail_rate 2"},
		{[]string{"--drop-all"}, "drop_all without drop_on"},
		{[]string{"--profile", "no-such-profile"}, `"no-such-profile"`},
		{[]string{"--instances", "0"}, "fleet of 0 instances"},
		{[]string{"--block-size", "-1"}, "block size -1"},
		{[]string{"--kv-events-replay", "tcp://127.0.0.1:0"}, "without a kv events endpoint"},
		{[]string{"--time-scale", "soon"}, "-time-scale"},
		{[]string{"extra"}, `"extra"`},
	} {
		var stdout, stderr strings.Builder
		code := runSim(ended, append(tc.args, "--port", "0"), &stdout, &stderr)
		if code != 2 || stdout.Len() > 0 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("runSim %v = %d, stdout %q, stderr %q; want 2, nothing and one line with %q", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var stdout, stderr strings.Builder
	if code := runSim(context.Background(), []string{"--port", port, "--profile", "instant"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "address already in use") {
		t.Errorf("runSim on a port in use = %d, stderr %q; want 1 and the port named", code, stderr.String())
	}
}
