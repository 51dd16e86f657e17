package config

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// replace writes data to path the way editors do: a new file renamed over the old one.
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func recvConfig(t *testing.T, ch <-chan *Config) *Config {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no config reloaded within 10s")
		return nil
	}
}

func recvErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no reload error within 10s")
		return nil
	}
}

func TestWatcher_ReloadKeepsOldOnBadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	configs := make(chan *Config, 10)
	errs := make(chan error, 10)
	w := NewWatcher(path, func(c *Config) { configs <- c }, func(err error) { errs <- err })
	w.Debounce = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	// Step 1: a valid change by rename is picked up. fsnotify may start after the first
	// write, so a forced reload makes sure the new content is read.
	replace(t, path, minimal+"listen: 127.0.0.1:7000\n")
	var c *Config
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		w.Reload()
		c = recvConfig(t, configs)
		if c.Listen == "127.0.0.1:7000" {
			break
		}
	}
	if c.Listen != "127.0.0.1:7000" {
		t.Fatalf("listen = %q, want the new value", c.Listen)
	}

	// Step 2: a bad file is rejected with its reason, and no config is delivered.
	replace(t, path, minimal+"listen: 127.0.0.1:7000\nbogus: 1\n")
	err := recvErr(t, errs)
	if !strings.Contains(err.Error(), `unknown key "bogus"`) || !strings.Contains(err.Error(), "keeping the old config") {
		t.Errorf("error = %v, want the bad key and that the old config is kept", err)
	}
	// The watcher is one goroutine: whatever step 1 delivered is queued before this error.
	for len(configs) > 0 {
		if c := <-configs; c.Listen != "127.0.0.1:7000" {
			t.Fatalf("a bad file delivered a config: %+v", c)
		}
	}

	// Step 3: fixed again, and a forced reload (SIGHUP) delivers even unchanged content.
	replace(t, path, minimal+"listen: 127.0.0.1:7001\n")
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7001" {
		t.Errorf("listen = %q after the fix", c.Listen)
	}
	w.Reload()
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7001" {
		t.Errorf("listen = %q after SIGHUP", c.Listen)
	}
}
