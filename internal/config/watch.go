package config

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is how long a watcher waits after the last change notification before it
// reads the file: editors write a file in several steps.
const DefaultDebounce = 200 * time.Millisecond

// DefaultMaxDelay bounds how long a watcher waits after the first change notification of a
// burst, however many follow: a file written over and over is still read about once a second.
const DefaultMaxDelay = time.Second

// WatchOptions tune WatchFile.
type WatchOptions struct {
	// Debounce: wait this long after the last notification (default DefaultDebounce).
	Debounce time.Duration
	// MaxDelay: read at most this long after the first notification of a burst, even while
	// notifications keep coming (default DefaultMaxDelay; raised to Debounce when below it).
	MaxDelay time.Duration
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
// ConfigMaps) is seen. Only notifications about the file's own name, the names in the same
// directory that its symlinks lead through, and Kubernetes' ..data count: a log written
// beside the file every few milliseconds neither delays a read nor causes one. A read error is
// passed as err with nil data, once until the next successful read, and that read is passed
// on even when the content is the one read before the error: whoever was told of the error
// learns that the file is back (a secret restored as it was, after a chmod 000 or a delete).
// It returns an error only when the directory cannot be watched.
func WatchFile(ctx context.Context, path string, opt WatchOptions, changed func(data []byte, forced bool, err error)) error {
	if opt.Debounce <= 0 {
		opt.Debounce = DefaultDebounce
	}
	if opt.MaxDelay <= 0 {
		opt.MaxDelay = DefaultMaxDelay
	}
	opt.MaxDelay = max(opt.MaxDelay, opt.Debounce)
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
	// The names that matter, found again at every read: a symlink swapped since may lead
	// through other names.
	var names map[string]bool
	read := func(forced bool) {
		names = watchNames(path)
		data, err := os.ReadFile(path)
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				changed(nil, forced, err)
			}
			return
		}
		if lastErr != "" {
			// Back after an error that was passed on: passed on, whatever its content.
			lastErr, last = "", nil
		}
		if !forced && last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		changed(data, forced, nil)
	}
	// Read once the watch is in place: a change made between the caller's read of Initial and
	// w.Add would otherwise be seen only at the next notification (or never).
	read(false)

	// A read comes Debounce after the last notification, or MaxDelay after the first one of
	// the burst, whichever is sooner: a file written without a pause for longer than that is
	// read meanwhile (and again once the writes stop).
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var first time.Time // of the burst waiting to be read; zero: none waits
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
			if !names[filepath.Base(ev.Name)] {
				continue
			}
			now := time.Now()
			if first.IsZero() {
				first = now
			}
			debounce.Reset(min(opt.Debounce, opt.MaxDelay-now.Sub(first)))
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			changed(nil, false, fmt.Errorf("watch %s: %w", dir, err))
		case <-debounce.C:
			first = time.Time{}
			read(false)
		case <-poll:
			read(false)
		case <-opt.Trigger:
			read(true)
		}
	}
}

// Watcher keeps a running application in step with its config file and the files the config
// refers to (its secrets, see Config.Refs): it loads the config again whenever the content of
// any of them changes or a hangup signal (SIGHUP) asks for it, with the same Adjust and Checks
// as the first load, and hands each config that loads to Apply. A file that does not load, or
// a referenced file that cannot be read, is logged and passed to Rejected, and the config in
// force stays. Set the fields, then call Run.
type Watcher struct {
	// Path of the config file. Empty when the application was configured without one (from
	// flags): a hangup is then logged, and nothing is reloaded.
	Path string
	// Initial is the file's content that the config in force was loaded from, so that only a
	// later change reloads (nil: the content when Run starts).
	Initial []byte
	// Config is the config in force, loaded from Initial, whose referenced files are watched
	// from the start (nil: loaded from Initial when Run starts).
	Config *Config
	// InitialRefs is the content of Config's referenced files as read before it was put in
	// force (ReadRefs(Config.Refs())), so that a change made since is seen at once (nil: their
	// content when Run starts).
	InitialRefs map[string][]byte
	// Adjust (command-line overrides, nil for none) and Checks apply to every load, as in LoadWith.
	Adjust func(*Config)
	Checks Checks
	// Hangup forces a reload, even of unchanged content, on every value received: give it the
	// channel of signal.Notify(ch, syscall.SIGHUP). Nil: only changes reload.
	Hangup <-chan os.Signal
	// Apply puts a new config in force; it reports its own rejection (the router's Reload
	// logs and counts it).
	Apply func(*Config)
	// Rejected, when set, is told of every config file that did not load, and of every
	// referenced file that could not be read (for a metric).
	Rejected func(error)
	// Logger receives what happens (discarded when nil).
	Logger *slog.Logger
	// Debounce and Poll tune the watching of every file (see WatchOptions).
	Debounce time.Duration
	Poll     time.Duration

	mu       sync.Mutex // serialises Apply, Rejected and the swaps of the referenced files' watches
	watching []string   // the referenced files watched, for tests
}

// Run watches until ctx ends. It returns an error only when the config file cannot be watched
// (or, with Initial nil, read at start); the error is also logged. A referenced file whose
// directory cannot be watched is logged, and a hangup still reloads it.
func (w *Watcher) Run(ctx context.Context) error {
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if w.Path == "" {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-w.Hangup:
				log.Info("SIGHUP: no config file to reload (started with --endpoint)")
			}
		}
	}
	initial := w.Initial
	if initial == nil {
		var err error
		if initial, err = os.ReadFile(w.Path); err != nil {
			err = fmt.Errorf("config watch: %w", err)
			log.Error("config watcher stopped", "err", err)
			return err
		}
	}
	// A hangup or a change of a referenced file becomes a forced read of the config file;
	// several before the watcher gets to them count as one.
	trigger := make(chan struct{}, 1)
	reload := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Stopped before the wait: Run also returns, with an error, while ctx goes on.
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.Hangup:
				log.Info("SIGHUP: reloading the config")
				reload()
			}
		}
	})

	// The referenced files of the last config that loaded are watched (whether Apply took it
	// or not: a reload reads the config file as it is now, and its files), each by WatchFile,
	// from the content read just before that config was applied. Every load replaces the
	// watches, so that what a watch compares with is always what the config in force read.
	stopRefs := func() {}
	watchRefs := func(refs []Ref, read map[string][]byte) { // w.mu held
		stopRefs()
		rctx, cancel := context.WithCancel(ctx)
		stopRefs = cancel
		w.watching = w.watching[:0]
		for _, ref := range refs {
			w.watching = append(w.watching, ref.Path)
			wg.Go(func() { w.watchRef(rctx, ref, read[ref.Path], reload, log) })
		}
	}
	cur := w.Config
	if cur == nil {
		var err error
		if cur, err = parseFile(initial, w.Path, w.Adjust, w.Checks); err != nil {
			log.Error("the config in force does not load again: the files it refers to are watched from the next config that loads", "err", err)
		}
	}
	if cur != nil {
		refs := cur.Refs()
		read := w.InitialRefs
		if read == nil {
			read = ReadRefs(refs)
		}
		w.mu.Lock()
		watchRefs(refs, read)
		w.mu.Unlock()
	}

	opt := WatchOptions{Debounce: w.Debounce, Poll: w.Poll, Trigger: trigger, Initial: initial}
	err := WatchFile(ctx, w.Path, opt, func(data []byte, _ bool, err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		var c *Config
		if err == nil {
			c, err = parseFile(data, w.Path, w.Adjust, w.Checks)
		}
		if err != nil {
			if w.Rejected != nil {
				w.Rejected(err)
			}
			log.Error("config rejected, keeping the old one", "err", err)
			return
		}
		// Read before Apply reads them, and watched before it returns: a change made in
		// between is seen as one.
		refs := c.Refs()
		watchRefs(refs, ReadRefs(refs))
		w.Apply(c)
	})
	if err != nil {
		log.Error("config watcher stopped", "err", err)
	}
	return err
}

// watchRef watches the referenced file ref until ctx ends, from the content read (nil: it
// could not be read) and calls reload when it changes. A file that cannot be read is logged
// and passed to Rejected, and nothing is reloaded: the config in force keeps what it read (a
// Kubernetes Secret's swap never leaves the file missing, but a file written in place may be,
// for a moment). Once it can be read again it reloads, even with the content in force, so
// that the reload's result replaces the rejection (kvroute_config_last_reload_successful).
func (w *Watcher) watchRef(ctx context.Context, ref Ref, read []byte, reload func(), log *slog.Logger) {
	// Unreadable at the load: Apply met that error already, so the same one at the start of
	// the watch is not told again.
	quiet := read == nil
	unreadable := false
	err := WatchFile(ctx, ref.Path, WatchOptions{Debounce: w.Debounce, Poll: w.Poll, Initial: read}, func(_ []byte, _ bool, err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if ctx.Err() != nil {
			return // replaced by a later load's watch
		}
		if err != nil {
			unreadable = true
			if quiet {
				quiet = false
				return
			}
			err = fmt.Errorf("%s: %w", ref.Key, err)
			if w.Rejected != nil {
				w.Rejected(err)
			}
			log.Error("a file the config refers to cannot be read: the config in force stays, and the file is read again when it changes",
				"key", ref.Key, "file", ref.Path, "err", err)
			return
		}
		quiet = false
		// What the change does (ref.Effect) is said by whoever applies it, once it is in force:
		// said here, it came for a file the reload then rejected.
		if unreadable {
			unreadable = false
			log.Info("a file the config refers to can be read again: reloading the config", "key", ref.Key, "file", ref.Path)
		} else {
			log.Info("a file the config refers to changed: reloading the config", "key", ref.Key, "file", ref.Path)
		}
		reload()
	})
	if err != nil && ctx.Err() == nil {
		log.Error("a file the config refers to is not watched: after changing it, send SIGHUP", "key", ref.Key, "err", err)
	}
}

// watched returns the referenced files watched now.
func (w *Watcher) watched() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.watching)
}

// maxLinks bounds the symlinks watchNames follows (a loop ends there).
const maxLinks = 8

// watchNames returns the names in path's directory whose notifications may mean that path's
// content changed: its own name, the first name of every symlink target on the way to the file
// that lies in the same directory (a link swapped with ln -sfn, a ConfigMap's ..data), and
// ..data itself, which Kubernetes swaps to update every file of a mounted ConfigMap or Secret.
func watchNames(path string) map[string]bool {
	dir := filepath.Dir(path)
	names := map[string]bool{filepath.Base(path): true, "..data": true}
	p := path
	for range maxLinks {
		target, err := os.Readlink(p)
		if err != nil {
			break // not a symlink (or gone): the file itself
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		if rel, err := filepath.Rel(dir, target); err == nil && rel != "." && rel != ".." &&
			!strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			first, _, _ := strings.Cut(rel, string(filepath.Separator))
			names[first] = true
		}
		p = target
	}
	return names
}
