package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/testlog"
)

// TestPeersSecretRotatedByFiles: two replicas, each with a config.Watcher on its config file
// as kvroute serve runs it, go through a rotation's three steps by rewriting their secrets'
// files only (the config files never change, no SIGHUP): each step is put in force on both,
// and at the end they hear each other under the new secret alone.
func TestPeersSecretRotatedByFiles(t *testing.T) {
	eng := newFakeEngine(t)
	oldS, newS := peerSecret, strings.ToUpper(peerSecret)
	type replica struct {
		r              *Router
		secret, accept string
		logs           *testlog.Buffer
	}
	write := func(f, s string) {
		t.Helper()
		tmp := f + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f); err != nil {
			t.Fatal(err)
		}
	}
	start := func(name, seed string) *replica {
		dir := t.TempDir()
		rp := &replica{secret: filepath.Join(dir, "secret"), accept: filepath.Join(dir, "accept"), logs: &testlog.Buffer{}}
		write(rp.secret, oldS)
		write(rp.accept, oldS)
		static := ""
		if seed != "" {
			static = fmt.Sprintf(", static: [%q]", seed)
		}
		path := filepath.Join(dir, "kvroute.yaml")
		write(path, fmt.Sprintf("scrape: {disabled: true}\nhealth: {interval: 1h}\nauth: {mode: none}\n"+
			"endpoints: [{url: %q, models: [m], engine: vllm}]\n"+
			"peers: {name: %s, listen: '127.0.0.1:0', gossip_listen: '127.0.0.1:0', secret_file: secret, accept_secret_file: accept, batch_interval: 1ms%s}\n",
			eng.srv.URL, name, static))
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		refs := config.ReadRefs(cfg.Refs())
		rp.r, err = NewRouter(cfg, slog.New(slog.NewTextHandler(rp.logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rp.r.Close)
		runRouter(t, rp.r)
		w := &config.Watcher{Path: path, Config: cfg, InitialRefs: refs, Debounce: 10 * time.Millisecond,
			Apply: func(c *config.Config) { _ = rp.r.Reload(c) }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("watcher of %s: %v", name, err)
			}
		})
		return rp
	}
	a := start("a", "")
	waitUntil(t, "a's gossip address", func() bool { return a.r.peers.node.GossipAddr() != "" })
	b := start("b", a.r.peers.node.GossipAddr())
	followsWarm(t, b.r, "a")

	for _, step := range []struct {
		name, secret, accept string
		accepting            int
	}{
		{"accept the new", oldS, newS, 2},
		{"sign with the new", newS, oldS, 2},
		{"drop the old", newS, newS, 1}, // the same secret twice: one accepted
	} {
		for _, rp := range []*replica{a, b} {
			changed := rp.logs.Count("peers secrets changed")
			write(rp.secret, step.secret)
			write(rp.accept, step.accept)
			waitUntil(t, step.name+": the secrets changed", func() bool { return rp.logs.Count("peers secrets changed") > changed })
			// Both files may be read at one reload or at two: the last says what is in force.
			waitUntil(t, step.name+": in force", func() bool {
				logs := rp.logs.String()
				last := logs[strings.LastIndex(logs, "peers secrets changed"):]
				return strings.HasPrefix(strings.SplitN(last, "\n", 2)[0], fmt.Sprintf("peers secrets changed\" replica=%s accepting=%d", rp.r.peers.node.Name(), step.accepting))
			})
		}
	}

	// Under the new secret alone, a's request reaches b: the streams cut when the old secret
	// left come back, and a request routed while one reconnects is not heard, so up to five
	// are tried.
	waitUntil(t, "streams both ways", func() bool {
		return slices.Contains(a.r.peers.node.Status().Streaming, "b") && slices.Contains(b.r.peers.node.Status().Streaming, "a")
	})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a shared prefix ", 60) + `"}]}`
	heard := false
	for try := 0; try < 5 && !heard; try++ {
		before := b.r.peers.share.Stats().Applied
		rec := httptest.NewRecorder()
		a.r.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		if rec.Code != 200 {
			t.Fatalf("chat through a: %d %s", rec.Code, rec.Body)
		}
		for deadline := time.Now().Add(time.Second); !heard && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			heard = b.r.peers.share.Stats().Applied >= before+2 // routed, done
		}
	}
	if !heard {
		t.Error("b never heard a's request under the new secret")
	}
	if n := a.logs.Count("peers secrets cannot be read") + b.logs.Count("peers secrets cannot be read"); n > 0 {
		t.Errorf("a secret could not be read %d times", n)
	}
}
