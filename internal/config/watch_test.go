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

// TestWatchFile_InitialStale: a file that changed between the caller's read (Initial) and the
// watch is delivered at once, with no later notification; an unchanged one is not delivered,
// and a write racing the start of the watch is never lost.
func TestWatchFile_InitialStale(t *testing.T) {
	for _, tc := range []struct {
		name, initial, file string
		want                string // the first delivery
	}{
		{name: "changed", initial: "old\n", file: "new\n", want: "new\n"},
		{name: "unchanged", initial: "same\n", file: "same\n", want: "later\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "f.yaml")
			if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got := make(chan string, 10)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- WatchFile(ctx, path, WatchOptions{Debounce: 5 * time.Millisecond, Initial: []byte(tc.initial)},
					func(data []byte, _ bool, err error) {
						if err != nil {
							got <- "error: " + err.Error()
							return
						}
						got <- string(data)
					})
			}()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("WatchFile: %v", err)
				}
			}()
			if tc.file == tc.initial {
				// Nothing is delivered until the file changes; the write may come before or
				// after the watch is in place, and is seen either way.
				replace(t, path, tc.want)
			}
			select {
			case s := <-got:
				if s != tc.want {
					t.Errorf("first delivery = %q, want %q", s, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the change made before the watch started was never delivered")
			}
		})
	}
}
