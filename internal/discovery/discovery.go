package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// Static returns the config's own endpoints as pool specs.
func Static(c *config.Config) []endpoint.Spec { return c.Specs() }

// Merger combines named sources of endpoints into one set and hands each new set to apply.
// Sources are merged in name order; an endpoint named by two sources is taken from the first
// (so "0-static" before "file" lets the config win). Safe for concurrent use; apply is called
// under a lock, one set at a time, in the order the sets were made.
type Merger struct {
	mu      sync.Mutex
	sources map[string][]endpoint.Spec
	apply   func([]endpoint.Spec)
}

// NewMerger returns a merger that calls apply with every new merged set.
func NewMerger(apply func([]endpoint.Spec)) *Merger {
	return &Merger{sources: map[string][]endpoint.Spec{}, apply: apply}
}

// Set replaces the endpoints of one source and applies the merged set.
func (m *Merger) Set(source string, specs []endpoint.Spec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sources[source] = slices.Clone(specs)
	names := make([]string, 0, len(m.sources))
	for n := range m.sources {
		names = append(names, n)
	}
	slices.Sort(names)
	sets := make([][]endpoint.Spec, 0, len(names))
	for _, n := range names {
		sets = append(sets, m.sources[n])
	}
	m.apply(Merge(sets...))
}

// Merge concatenates sets, dropping an endpoint whose name an earlier one already has.
func Merge(sets ...[]endpoint.Spec) []endpoint.Spec {
	seen := map[string]bool{}
	var out []endpoint.Spec
	for _, set := range sets {
		for _, s := range set {
			if seen[s.Name] {
				continue
			}
			seen[s.Name] = true
			out = append(out, s)
		}
	}
	return out
}

// FileSource reads endpoints from a YAML file (a list of entries with the keys of the config's
// endpoints[], or a mapping with an endpoints key) and re-reads it when it changes.
type FileSource struct {
	// Path of the file.
	Path string
	// Poll re-reads the file this often besides change notifications (0: notifications only).
	Poll time.Duration
	// Debounce waits this long after the last notification (0: config.DefaultDebounce).
	Debounce time.Duration
	// Log receives the reason a new file is rejected (discarded when nil).
	Log *slog.Logger
	// OnError, when set, also receives that reason (for a metric or a test).
	OnError func(error)
}

// Run calls emit with the file's endpoints at start and after every change that parses; a file
// that does not parse (or cannot be read) is logged and the last good set stays in force, so
// nothing is emitted. It blocks until ctx ends and fails only when the file's directory cannot be
// watched.
func (f *FileSource) Run(ctx context.Context, emit func([]endpoint.Spec)) error {
	log := f.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) {
		log.Warn("endpoint discovery file rejected, keeping the previous endpoints", "file", f.Path, "err", err)
		if f.OnError != nil {
			f.OnError(err)
		}
	}
	return config.WatchFile(ctx, f.Path, config.WatchOptions{Debounce: f.Debounce, Poll: f.Poll},
		func(data []byte, _ bool, err error) {
			if err != nil {
				fail(fmt.Errorf("discovery %s: %w", f.Path, err))
				return
			}
			eps, err := config.ParseEndpoints(data)
			if err != nil {
				fail(fmt.Errorf("discovery %s: %w", f.Path, err))
				return
			}
			specs := make([]endpoint.Spec, len(eps))
			for i := range eps {
				specs[i] = eps[i].Spec()
			}
			log.Info("endpoint discovery file loaded", "file", f.Path, "endpoints", len(specs))
			emit(specs)
		})
}

// FromConfig returns the config's file source, or nil when discovery.file is not set.
func FromConfig(c *config.Config, log *slog.Logger) *FileSource {
	if c.Discovery.File == "" {
		return nil
	}
	return &FileSource{Path: c.Path(c.Discovery.File), Poll: c.Discovery.PollInterval.D(), Log: log}
}
