package config

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a watcher waits after the last change notification before it
// reads the file: editors write a file in several steps.
const DefaultDebounce = 200 * time.Millisecond

// WatchOptions tune WatchFile.
type WatchOptions struct {
	// Debounce: wait this long after the last notification (default DefaultDebounce).
	Debounce time.Duration
	// Poll re-reads the file this often as well (0: only on notifications), for file systems
	// that do not notify.
	Poll time.Duration
	// Trigger forces a read (for SIGHUP): changed is called even when the content is the same.
	Trigger <-chan struct{}
	// Initial is the content the caller already has: changed is not called until the file
	// differs from it (the file is still read once the watch is in place, so a change made
	// after the caller's read is delivered at once). Nil: changed is called with the content
	// at start.
	Initial []byte
}

// WatchFile calls changed with the file's content at start (unless opt.Initial matches it) and
// whenever the content changes, until ctx ends. It watches the file's directory, not the file,
// so that a file replaced by rename (what editors do) or a swapped symlink (Kubernetes
// ConfigMaps) is seen. A read error is passed as err with nil data, once until the next
// successful read. It returns an error only when the directory cannot be watched.
func WatchFile(ctx context.Context, path string, opt WatchOptions, changed func(data []byte, forced bool, err error)) error {
	if opt.Debounce <= 0 {
		opt.Debounce = DefaultDebounce
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", path, err)
	}
	defer w.Close()
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}

	last := opt.Initial
	var lastErr string
	read := func(forced bool) {
		data, err := os.ReadFile(path)
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				changed(nil, forced, err)
			}
			return
		}
		lastErr = ""
		if !forced && last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		changed(data, forced, nil)
	}
	// Read once the watch is in place: a change made between the caller's read of Initial and
	// w.Add would otherwise be seen only at the next notification (or never).
	read(false)

	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var poll <-chan time.Time
	if opt.Poll > 0 {
		t := time.NewTicker(opt.Poll)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			_ = ev // any change in the directory may be ours (symlink swaps rename other names)
			debounce.Reset(opt.Debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			changed(nil, false, fmt.Errorf("watch %s: %w", dir, err))
		case <-debounce.C:
			read(false)
		case <-poll:
			read(false)
		case <-opt.Trigger:
			read(true)
		}
	}
}

// Watcher reloads the config file when it changes or when asked (SIGHUP). A new config that
// fails to load is passed to OnError and the old one stays in force.
type Watcher struct {
	path     string
	onChange func(*Config)
	onError  func(error)
	trigger  chan struct{}
	// Debounce and Poll tune the watching (see WatchOptions); set them before Run.
	Debounce time.Duration
	Poll     time.Duration
}

// NewWatcher returns a watcher of the config file at path. onChange receives each new valid
// config; onError receives the reason a reload was rejected. Call Run to start it.
func NewWatcher(path string, onChange func(*Config), onError func(error)) *Watcher {
	return &Watcher{path: path, onChange: onChange, onError: onError, trigger: make(chan struct{}, 1)}
}

// Reload asks for a reload now (for SIGHUP); it does not block, and several requests before the
// watcher gets to them count as one.
func (w *Watcher) Reload() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Run watches until ctx ends. The config in force is taken to be the file's content when Run
// starts, so call it right after Load.
func (w *Watcher) Run(ctx context.Context) error {
	initial, err := os.ReadFile(w.path)
	if err != nil {
		return fmt.Errorf("config watch: %w", err)
	}
	return WatchFile(ctx, w.path, WatchOptions{Debounce: w.Debounce, Poll: w.Poll, Trigger: w.trigger, Initial: initial},
		func(data []byte, _ bool, err error) {
			if err != nil {
				w.onError(fmt.Errorf("config %s: reload rejected, keeping the old config: %w", w.path, err))
				return
			}
			c, err := parse(data, filepath.Dir(w.path), nil)
			if err != nil {
				w.onError(fmt.Errorf("config %s: reload rejected, keeping the old config: %w", w.path, err))
				return
			}
			w.onChange(c)
		})
}
