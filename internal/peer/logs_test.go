package peer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// jsonKeys returns the top-level keys of one JSON object, in order, duplicates kept
// (encoding/json's Unmarshal keeps the last of a duplicated key and says nothing).
func jsonKeys(t *testing.T, line string) []string {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(line))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s (%v)", line, err)
	}
	var keys []string
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
	return keys
}

// TestLogWriterOneMsgKey: each of memberlist's lines forwarded to the JSON log has one "msg",
// the router's, and memberlist's text under "line". Before, memberlist's text went as a second
// "msg", and jq or Python's json kept it in place of the router's explanation.
func TestLogWriterOneMsgKey(t *testing.T) {
	b, err := msgpack.Marshal(meta{Major: Major, Feed: 7001, Inc: 1})
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{
		"2026/12/07 23:36:10 [ERR] memberlist: failed to receive: no installed keys could decrypt the message from=127.0.0.1:50994",
		"2026/12/07 23:36:13 [DEBUG] memberlist: failed to join 127.0.0.1:35542: no installed keys could decrypt the message",
		"[WARN] memberlist: Refuting a dead message (from: r1)",
		"[WARN] memberlist: Refuting a suspect message (from: r2)",
		"[WARN] memberlist: Refuting a suspect message (from: r1)",
		fmt.Sprintf("[WARN] memberlist: Refuting an alive message for 'r2' (10.0.0.12:7946) meta:(%v VS %v), vsn:([1 5 2 0 0 0] VS [1 5 2 0 0 0])", b, b),
		"[ERR] memberlist: Failed to send gossip to 127.0.0.1:7946: write udp: connection refused",
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:7946",
	}
	for _, stopping := range []bool{false, true} {
		st := make(chan struct{})
		if stopping {
			close(st)
		}
		for _, line := range lines {
			var buf bytes.Buffer
			w := &logWriter{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), self: "r2", stopping: st}
			if _, err := w.Write([]byte(line + "\n")); err != nil {
				t.Fatal(err)
			}
			out := strings.TrimSpace(buf.String())
			if strings.Count(out, "\n") != 0 || out == "" {
				t.Fatalf("%s: logged %d lines, want 1:\n%s", line, strings.Count(out, "\n")+1, out)
			}
			keys := jsonKeys(t, out)
			seen := map[string]int{}
			for _, k := range keys {
				seen[k]++
			}
			if seen["msg"] != 1 || seen["line"] > 1 {
				t.Errorf("stopping %v, %s: keys %v, want one msg", stopping, line, keys)
			}
			var rec struct{ Msg, Line string }
			if err := json.Unmarshal([]byte(out), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Msg == line || strings.Contains(rec.Msg, "[") {
				t.Errorf("stopping %v: msg %q is memberlist's text, not the router's", stopping, rec.Msg)
			}
			if !strings.Contains(line, "alive message") && rec.Line != line {
				t.Errorf("stopping %v: line %q, want memberlist's %q", stopping, rec.Line, line)
			}
		}
	}
}

// TestLogWriterSecretBounded: a replica given another secret, 40 s of it as a soak saw it
// (memberlist's failed receives and undecryptable packets from the peer's host, its failed
// joins, each about once a second). The undecryptable gossip is counted every time and warned
// of once a minute per remote host, the next warning saying how many went unlogged; the
// failed joins stay at debug level (the rejoin loop warns of them once a minute). Before, each
// of the 120 lines was a WARN.
func TestLogWriterSecretBounded(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	counted := 0
	w := &logWriter{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
		stopping: make(chan struct{}), undecryptable: func() { counted++ }, secretLimit: hostLimiter{now: func() time.Time { return now }}}
	write := func(format string, args ...any) {
		t.Helper()
		if _, err := fmt.Fprintf(w, format+"\n", args...); err != nil {
			t.Fatal(err)
		}
	}
	start := now
	for i := range 40 {
		now = start.Add(time.Duration(i) * time.Second)
		write("2026/12/07 23:36:10 [ERR] memberlist: failed to receive: no installed keys could decrypt the message from=127.0.0.1:%d", 50000+i)
		write("2026/12/07 23:36:10 [ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=127.0.0.1:35542")
		write("2026/12/07 23:36:10 [DEBUG] memberlist: failed to join 127.0.0.1:35542: no installed keys could decrypt the message")
	}
	// Another host's is its own.
	write("[ERR] memberlist: Decrypt packet failed: no installed keys could decrypt the message from=[fd00::2]:7946")
	warns := func() []string {
		var out []string
		for l := range strings.Lines(buf.String()) {
			if strings.Contains(l, "level=WARN") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := warns(); len(got) != 2 || !strings.Contains(got[0], "remote=127.0.0.1:50000 undecryptable_unlogged=0") ||
		!strings.Contains(got[1], "remote=[fd00::2]:7946 undecryptable_unlogged=0") || !strings.Contains(got[0], "peers.secret_file") {
		t.Errorf("40 s of another secret: %d warnings, want one per host naming the secret:\n%s", len(got), strings.Join(got, ""))
	}
	if k := strings.Count(buf.String(), "level=DEBUG"); k != 40+79 {
		t.Errorf("%d lines at debug level, want the 40 failed joins and the 79 unlogged warnings", k)
	}
	if counted != 121 {
		t.Errorf("counted %d undecryptable messages, want 121", counted)
	}
	// A minute after the first warning, the next says how many went unlogged.
	buf.Reset()
	now = start.Add(time.Minute)
	write("[ERR] memberlist: failed to receive: no installed keys could decrypt the message from=127.0.0.1:51000")
	if got := warns(); len(got) != 1 || !strings.Contains(got[0], "undecryptable_unlogged=79") {
		t.Errorf("a minute on: %q, want one warning with undecryptable_unlogged=79", got)
	}
}
