package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/endpoint"
)

// Spec converts an endpoint of the config to the pool's form.
func Spec(e *config.Endpoint) endpoint.Spec {
	s := endpoint.Spec{
		Name:              e.URL,
		Models:            slices.Clone(e.Models),
		Engine:            e.Engine,
		KVCapacityTokens:  e.KVTokens,
		StepTokens:        e.StepTokens,
		CacheSalt:         e.CacheSalt != nil && *e.CacheSalt,
		CacheSaltAuto:     e.CacheSalt == nil && e.Engine == "auto",
		HealthPath:        e.HealthPath,
		MetricsPath:       e.MetricsPath,
		FirstTokenTimeout: e.FirstTokenTimeout.D(),
		ResponseTimeout:   e.ResponseTimeout.D(),
		Labels:            maps.Clone(e.Labels),
	}
	if len(s.Labels) == 0 {
		s.Labels = nil
	}
	if s.MetricsPath == "-" { // the config's "no scraping"
		s.MetricsPath = ""
	}
	return s
}

// Specs converts endpoints of the config (its static endpoints, or a discovery file's) to the
// pool's form.
func Specs(eps []config.Endpoint) []endpoint.Spec {
	out := make([]endpoint.Spec, len(eps))
	for i := range eps {
		out[i] = Spec(&eps[i])
	}
	return out
}

// Merge concatenates sets, dropping an endpoint whose name an earlier one already has, so the
// static endpoints of the config, passed first, win over a discovered endpoint of the same name.
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
	// Log receives the reason a new file is rejected, and the warnings about one taken in
	// (endpoints without an engine: see config.ParseEndpointsWarn), once per change (discarded
	// when nil).
	Log *slog.Logger
	// OnError, when set, also receives that reason (for a metric or a test).
	OnError func(error)
}

// Load reads and parses the file once (at start, where a missing or bad file is fatal). It
// logs no warning: Run, which follows, reads the file again at its start and logs them then.
func (f *FileSource) Load() ([]endpoint.Spec, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return nil, fmt.Errorf("discovery.file: %w", err)
	}
	specs, _, err := f.parse(data)
	return specs, err
}

func (f *FileSource) parse(data []byte) ([]endpoint.Spec, []string, error) {
	eps, warnings, err := config.ParseEndpointsWarn(data)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery.file %s: %w", f.Path, err)
	}
	return Specs(eps), warnings, nil
}

// Run calls emit with the file's endpoints at start and after every change that parses; a file
// that does not parse (or cannot be read) is logged and the last good set stays in force, so
// nothing is emitted. It blocks until ctx ends and fails only when the file's directory cannot be
// watched. emit returning an error (the pool rejected the set) is logged the same way. The
// warnings about a set taken in (endpoints without an engine) are logged with it: at start and
// at each change that still has them.
func (f *FileSource) Run(ctx context.Context, emit func([]endpoint.Spec) error) error {
	log := f.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) {
		log.Error("discovery file rejected, keeping the endpoints in force", "file", f.Path, "err", err)
		if f.OnError != nil {
			f.OnError(err)
		}
	}
	return config.WatchFile(ctx, f.Path, config.WatchOptions{Debounce: f.Debounce, Poll: f.Poll},
		func(data []byte, _ bool, err error) {
			if err != nil {
				fail(fmt.Errorf("discovery.file %s: %w", f.Path, err))
				return
			}
			specs, warnings, err := f.parse(data)
			if err == nil {
				err = emit(specs)
			}
			if err != nil {
				fail(err)
				return
			}
			for _, w := range warnings {
				log.Warn("discovery file", "file", f.Path, "warning", w)
			}
			log.Debug("discovery file loaded", "file", f.Path, "endpoints", len(specs))
		})
}

// FromConfig returns the config's file source, or nil when discovery.file is not set.
func FromConfig(c *config.Config, log *slog.Logger) *FileSource {
	if c.Discovery.File == "" {
		return nil
	}
	return &FileSource{Path: c.Path(c.Discovery.File), Poll: c.Discovery.PollInterval.D(), Log: log}
}
