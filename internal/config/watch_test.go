package config

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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

// startWatchFile runs WatchFile on path until the test ends and delivers what it reads (an
// error as "error: ...").
func startWatchFile(t *testing.T, path string, opt WatchOptions) <-chan string {
	t.Helper()
	got := make(chan string, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchFile(ctx, path, opt, func(data []byte, _ bool, err error) {
			if err != nil {
				got <- "error: " + err.Error()
				return
			}
			got <- string(data)
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchFile: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("WatchFile did not return")
		}
	})
	return got
}

// recvString waits up to d for a delivery.
func recvString(t *testing.T, ch <-chan string, d time.Duration, what string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(d):
		t.Fatalf("%s: nothing delivered within %v", what, d)
		return ""
	}
}

// writeUntil calls write every few milliseconds until the test ends or limit passes, in a
// goroutine it stops before the test ends; stopped is closed when it has stopped.
func writeUntil(t *testing.T, limit time.Duration, write func(i int) error) (stopped <-chan struct{}) {
	t.Helper()
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		end := time.After(limit)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			case <-end:
				return
			case <-tick.C:
				if err := write(i); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		}
	}()
	t.Cleanup(func() { close(quit); <-done })
	return done
}

// TestWatchFile_BusyDirectory: a log appended to beside the watched file every 5 ms does not
// hold off the file's change. Before, every notification in the directory restarted the
// debounce, and the change waited for the writer to stop (QA: 15 s behind a 50 ms writer).
func TestWatchFile_BusyDirectory(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kvroute.yaml")
	if err := os.WriteFile(path, []byte("old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := os.OpenFile(filepath.Join(dir, "router.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the writer stops (cleanups run last first)
	got := startWatchFile(t, path, WatchOptions{Debounce: 100 * time.Millisecond, MaxDelay: 5 * time.Second, Initial: []byte("old\n")})
	// A first change, delivered, says the watch is in place: the one under test cannot be
	// read by the watch's first read instead of by a notification.
	replace(t, path, "watching\n")
	if s := recvString(t, got, 10*time.Second, "the first change"); s != "watching\n" {
		t.Fatalf("delivered %q, want watching", s)
	}
	var lines atomic.Int64
	writerDone := writeUntil(t, 8*time.Second, func(int) error {
		lines.Add(1)
		_, err := busy.WriteString("{\"msg\":\"request\"}\n")
		return err
	})
	for deadline := time.Now().Add(5 * time.Second); lines.Load() < 10; {
		if time.Now().After(deadline) {
			t.Fatal("the log writer did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	replace(t, path, "new\n")
	if s := recvString(t, got, 4*time.Second, "the change beside a busy log"); s != "new\n" {
		t.Errorf("delivered %q, want the new content", s)
	}
	select {
	case <-writerDone:
		t.Fatal("the writer stopped before the change was delivered: the test proves nothing")
	default:
	}
}

// TestWatchFile_WrittenWithoutPause: a file written over and over without a pause as long as
// the debounce is still read, MaxDelay after the first write, and again after the last.
func TestWatchFile_WrittenWithoutPause(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(path, []byte("0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := startWatchFile(t, path, WatchOptions{Debounce: 200 * time.Millisecond, MaxDelay: 300 * time.Millisecond, Initial: []byte("0\n")})
	replace(t, path, "watching\n") // delivered: the watch is in place (see above)
	if s := recvString(t, got, 10*time.Second, "the first change"); s != "watching\n" {
		t.Fatalf("delivered %q, want watching", s)
	}
	var last atomic.Int64
	writerDone := writeUntil(t, 8*time.Second, func(i int) error {
		last.Store(int64(i + 1))
		return os.WriteFile(path, []byte(strconv.Itoa(i+1)+"\n"), 0o600)
	})
	// A read may come between the truncation and the write (content ""): such a file is
	// read again at the next notification.
	deadline := time.After(4 * time.Second)
	for {
		var s string
		select {
		case s = <-got:
		case <-deadline:
			t.Fatal("nothing but empty reads delivered within 4s while the file was written every 5 ms")
		}
		select {
		case <-writerDone:
			t.Fatal("the writer stopped before the file was read: the test proves nothing")
		default:
		}
		if s == "" {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(s)); err != nil || n < 1 || int64(n) > last.Load() {
			t.Errorf("delivered %q, want one of the contents written (1 to %d)", s, last.Load())
		}
		return
	}
}

// TestWatchFile_Links: the names that count follow the file's symlinks: a target in the same
// directory written in place, a link swapped to another target (ln -sfn), and Kubernetes'
// ..data swap (a ConfigMap's update) are all seen.
func TestWatchFile_Links(t *testing.T) {
	opt := func(initial string) WatchOptions {
		return WatchOptions{Debounce: 10 * time.Millisecond, Initial: []byte(initial)}
	}
	t.Run("target written in place", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "kvroute.yaml")
		mustWrite(t, filepath.Join(dir, "real.yaml"), "a\n")
		mustSymlink(t, "real.yaml", path)
		got := startWatchFile(t, path, opt("a\n"))
		mustWrite(t, filepath.Join(dir, "real.yaml"), "b\n")
		if s := recvString(t, got, 10*time.Second, "the target's write"); s != "b\n" {
			t.Errorf("delivered %q, want b", s)
		}
	})
	t.Run("link swapped, then the new target written", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "kvroute.yaml")
		mustWrite(t, filepath.Join(dir, "one.yaml"), "one\n")
		mustWrite(t, filepath.Join(dir, "two.yaml"), "two\n")
		mustSymlink(t, "one.yaml", path)
		got := startWatchFile(t, path, opt("one\n"))
		mustSymlink(t, "two.yaml", path+".new")
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
		if s := recvString(t, got, 10*time.Second, "the swap"); s != "two\n" {
			t.Errorf("delivered %q, want two", s)
		}
		mustWrite(t, filepath.Join(dir, "two.yaml"), "two again\n")
		if s := recvString(t, got, 10*time.Second, "the new target's write"); s != "two again\n" {
			t.Errorf("delivered %q, want two again", s)
		}
	})
	t.Run("kubernetes ..data swap", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "kvroute.yaml")
		if err := os.Mkdir(filepath.Join(dir, "..v1"), 0o700); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(dir, "..v1", "kvroute.yaml"), "v1\n")
		mustSymlink(t, "..v1", filepath.Join(dir, "..data"))
		mustSymlink(t, filepath.Join("..data", "kvroute.yaml"), path)
		got := startWatchFile(t, path, opt("v1\n"))
		// What the kubelet does: a new timestamped directory, a ..data_tmp link to it renamed
		// over ..data, the old directory removed.
		if err := os.Mkdir(filepath.Join(dir, "..v2"), 0o700); err != nil {
			t.Fatal(err)
		}
		mustWrite(t, filepath.Join(dir, "..v2", "kvroute.yaml"), "v2\n")
		mustSymlink(t, "..v2", filepath.Join(dir, "..data_tmp"))
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "..v1")); err != nil {
			t.Fatal(err)
		}
		if s := recvString(t, got, 10*time.Second, "the ..data swap"); s != "v2\n" {
			t.Errorf("delivered %q, want v2", s)
		}
	})
}

// TestWatchNames: the names whose notifications count, for a plain file and for links.
func TestWatchNames(t *testing.T) {
	dir := t.TempDir()
	other := t.TempDir()
	mustWrite(t, filepath.Join(dir, "plain.yaml"), "x\n")
	mustWrite(t, filepath.Join(dir, "real.yaml"), "x\n")
	mustSymlink(t, "real.yaml", filepath.Join(dir, "rel.yaml"))
	mustSymlink(t, filepath.Join(dir, "rel.yaml"), filepath.Join(dir, "chain.yaml"))
	mustWrite(t, filepath.Join(other, "far.yaml"), "x\n")
	mustSymlink(t, filepath.Join(other, "far.yaml"), filepath.Join(dir, "far.yaml"))
	mustSymlink(t, filepath.Join("..data", "k.yaml"), filepath.Join(dir, "k.yaml"))
	mustSymlink(t, "loop2.yaml", filepath.Join(dir, "loop1.yaml"))
	mustSymlink(t, "loop1.yaml", filepath.Join(dir, "loop2.yaml"))
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"plain.yaml", []string{"..data", "plain.yaml"}},
		{"missing.yaml", []string{"..data", "missing.yaml"}},
		{"rel.yaml", []string{"..data", "real.yaml", "rel.yaml"}},
		{"chain.yaml", []string{"..data", "chain.yaml", "real.yaml", "rel.yaml"}},
		{"far.yaml", []string{"..data", "far.yaml"}}, // the target's directory is not watched
		{"k.yaml", []string{"..data", "k.yaml"}},
		{"loop1.yaml", []string{"..data", "loop1.yaml", "loop2.yaml"}},
	} {
		got := slices.Sorted(maps.Keys(watchNames(filepath.Join(dir, tc.file))))
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("watchNames(%s) (-want +got):\n%s", tc.file, diff)
		}
	}
}

func mustWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestWatchFile_BackAfterError: a file that could not be read is delivered when it can be read
// again, even with the content it had before: whoever was told of the error learns that the
// file is back. An unchanged file that never failed is still not delivered.
func TestWatchFile_BackAfterError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(path, []byte("same\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := startWatchFile(t, path, WatchOptions{Debounce: 5 * time.Millisecond, Initial: []byte("same\n")})
	replace(t, path, "new\n") // delivered: the watch is in place
	if s := recvString(t, got, 10*time.Second, "the change"); s != "new\n" {
		t.Fatalf("delivered %q, want the change", s)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if s := recvString(t, got, 10*time.Second, "the delete"); !strings.HasPrefix(s, "error: ") {
		t.Fatalf("delivered %q after the delete, want an error", s)
	}
	replace(t, path, "new\n")
	if s := recvString(t, got, 10*time.Second, "the file back as it was"); s != "new\n" {
		t.Fatalf("delivered %q once back, want its content", s)
	}
}
