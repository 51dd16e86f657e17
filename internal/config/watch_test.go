package config

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// startWatcher runs w until the test ends, delivering applied configs and rejections on the
// channels it returns.
func startWatcher(t *testing.T, w *Watcher) (configs <-chan *Config, rejected <-chan error) {
	t.Helper()
	cs := make(chan *Config, 10)
	errs := make(chan error, 10)
	w.Apply = func(c *Config) { cs <- c }
	w.Rejected = func(err error) { errs <- err }
	w.Debounce = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return cs, errs
}

// TestWatcher_ReloadKeepsOldOnBadFile: a change is applied, a bad file is rejected with its
// reason and nothing applied, and a hangup reloads even unchanged content.
func TestWatcher_ReloadKeepsOldOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	hup := make(chan os.Signal, 1)
	configs, errs := startWatcher(t, &Watcher{Path: path, Initial: []byte(minimal), Hangup: hup})

	// Step 1: a valid change by rename is applied: Run reads the file once its watch is in
	// place, so the change is seen even when it comes first.
	replace(t, path, minimal+"listen: 127.0.0.1:7000\n")
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7000" {
		t.Fatalf("listen = %q, want the new value", c.Listen)
	}

	// Step 2: a bad file is rejected with its reason, and no config is applied.
	replace(t, path, minimal+"listen: 127.0.0.1:7000\nbogus: 1\n")
	err := recvErr(t, errs)
	if !strings.Contains(err.Error(), `unknown key "bogus"`) || !strings.Contains(err.Error(), path) {
		t.Errorf("error = %v, want the file and the bad key", err)
	}
	// The watcher is one goroutine: a config applied before this error is already queued.
	if len(configs) > 0 {
		t.Fatalf("a bad file was applied: %+v", <-configs)
	}

	// Step 3: fixed again, and a hangup (SIGHUP) applies even unchanged content.
	replace(t, path, minimal+"listen: 127.0.0.1:7001\n")
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7001" {
		t.Errorf("listen = %q after the fix", c.Listen)
	}
	hup <- syscall.SIGHUP
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7001" {
		t.Errorf("listen = %q after SIGHUP", c.Listen)
	}
}

// TestWatcher_AdjustAndChecks: a reload sees the same overrides and checks as the first load.
func TestWatcher_AdjustAndChecks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &Watcher{Path: path, Initial: []byte(minimal), Checks: testChecks,
		Adjust: func(c *Config) { c.Listen = "127.0.0.1:7777" }}
	configs, errs := startWatcher(t, w)
	replace(t, path, minimal+"listen: 127.0.0.1:7000\npolicy: {name: round-robin, params: {alpha: 1}}\n")
	if err := recvErr(t, errs); !strings.Contains(err.Error(), `policy.params: policy round-robin: unknown parameter "alpha"`) {
		t.Errorf("error = %v, want the policy parameter rejected by the checks", err)
	}
	replace(t, path, minimal+"listen: 127.0.0.1:7000\npolicy: {name: round-robin}\n")
	if c := recvConfig(t, configs); c.Listen != "127.0.0.1:7777" || c.Policy.Name != "round-robin" {
		t.Errorf("listen %q policy %q, want the override 127.0.0.1:7777 and round-robin", c.Listen, c.Policy.Name)
	}
}

// TestWatcher_NoFile: without a config file a hangup is only logged, and Run ends with ctx.
func TestWatcher_NoFile(t *testing.T) {
	logged := make(chan string, 1)
	hup := make(chan os.Signal)
	w := &Watcher{Hangup: hup, Logger: slog.New(slog.NewTextHandler(chanWriter(logged), nil)),
		Apply: func(c *Config) { t.Errorf("applied %+v without a file", c) }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	hup <- syscall.SIGHUP // unbuffered: Run has taken it
	select {
	case l := <-logged:
		if !strings.Contains(l, "no config file to reload") {
			t.Errorf("log %q, want that there is no file", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hangup was not logged")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// chanWriter sends each write as a string.
type chanWriter chan<- string

func (c chanWriter) Write(p []byte) (int, error) { c <- string(p); return len(p), nil }

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
