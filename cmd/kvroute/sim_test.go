package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
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

// A bad flag value is a usage error (exit 2) named on one line by its flag (not by simserver's
// words for the field, nor with the package's name), found before anything listens; a port
// that cannot be had is a failure to run (exit 1), said with the fix.
func TestRunSimBadFlags(t *testing.T) {
	// Ended: a fleet that the flags let start stops at once rather than serve.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--time-scale", "-1"}, "kvroute sim: --time-scale -1: want a positive factor (0.1 runs ten times faster)\n"},
		{[]string{"--time-scale", "0"}, "--time-scale 0: want a positive factor"},
		{[]string{"--drain", "-1s"}, "--drain -1s: want a duration >= 0"},
		{[]string{"--model", ""}, `--model "": empty`},
		{[]string{"--max-model-len", "0"}, "--max-model-len 0: want a positive token count"},
		{[]string{"--default-max-tokens", "0"}, "--default-max-tokens 0: want a positive token count"},
		{[]string{"--fail-rate", "2"}, "kvroute sim: --fail-rate 2: want a fraction in [0, 1]\n"},
		{[]string{"--fail-rate", "2", "--slow", "0.5"}, "kvroute sim: --fail-rate 2: want a fraction in [0, 1]; --slow 0.5: want a factor >= 1 (0 for none)\n"},
		{[]string{"--cut-after", "-1"}, "kvroute sim: --cut-after -1: want a token count >= 0 (0 for none)\n"},
		// The help lists 500 and 503; a 404 was taken, and answered as a server_error.
		{[]string{"--fail-status", "404"}, "kvroute sim: --fail-status 404: want 500 or 503\n"},
		{[]string{"--drop-all"}, "kvroute sim: --drop-all without --drop-on: give --drop-on TEXT, the text that makes the instance crash\n"},
		{[]string{"--drop-on", strings.Repeat("x", 1025)}, "kvroute sim: --drop-on (1025 bytes): want at most 1024 bytes\n"},
		{[]string{"--profile", "h100"}, "kvroute sim: --profile h100: unknown profile: use one of "},
		{[]string{"--profile", "llama3-8b-h100"}, "kvroute sim: --profile llama3-8b-h100: unknown profile (did you mean llama3-8b-h100-tp1?): use one of "},
		{[]string{"--instances", "0"}, "kvroute sim: --instances 0: want at least 1\n"},
		{[]string{"--instances", "2", "--port", "65535"}, "kvroute sim: --port 65535: want a port from 1 to 65534 for 2 instance(s) (0: free ports)\n"},
		{[]string{"--block-size", "-1"}, "kvroute sim: --block-size -1: want a positive token count (0: the profile's)\n"},
		{[]string{"--kv-blocks", "-1"}, "kvroute sim: --kv-blocks -1: want a positive block count (0: the profile's)\n"},
		{[]string{"--kv-events-replay", "tcp://127.0.0.1:0"}, "kvroute sim: --kv-events-replay without --kv-events: give both\n"},
		// Said by each instance as it started, after the package's name twice.
		{[]string{"--kv-events", "bogus"}, "kvroute sim: --kv-events \"bogus\": want tcp://HOST:PORT (or ipc://, inproc://)\n"},
		{[]string{"--instances", "2", "--kv-events", "inproc://kv"}, "kvroute sim: --kv-events \"inproc://kv\": want tcp://HOST:PORT for a fleet of more than one instance\n"},
		{[]string{"--time-scale", "soon"}, "-time-scale"},
		{[]string{"extra"}, `"extra"`},
	} {
		var stdout, stderr strings.Builder
		args := tc.args
		if !slices.Contains(args, "--port") {
			args = append(args, "--port", "0")
		}
		code := runSim(ended, args, &stdout, &stderr)
		if code != 2 || stdout.Len() > 0 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), tc.want) ||
			strings.Contains(stderr.String(), "simserver") {
			t.Errorf("runSim %v = %d, stdout %q, stderr %q; want 2, nothing and one line with %q, without the package's name", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	var stdout, stderr strings.Builder
	want := "kvroute sim: instance 0: listen tcp 127.0.0.1:" + port + ": bind: address already in use (another process listens there: stop it or give --port another port; 0 takes free ones)\n"
	if code := runSim(context.Background(), []string{"--port", port, "--profile", "instant"}, &stdout, &stderr); code != 1 || stderr.String() != want {
		t.Errorf("runSim on a port in use = %d, stderr %q; want 1 and %q", code, stderr.String(), want)
	}
}
