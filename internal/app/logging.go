package app

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/kvroute/kvroute/internal/config"
)

// NewLogger returns the logger for a process that runs a router (kvroute serve): log.format
// (json, the default, or text) to w, at log.level. Given to NewRouter, it shares the router's
// level, which reloads and PUT /debug/loglevel change: every line of the process follows the
// one level, the caller's own (the config watcher's) included. A logger of another kind keeps
// its handler's level as a floor below the router's (a caller that logs only warnings gets no
// more), and the router cannot be made to log below it.
func NewLogger(l config.Log, w io.Writer) *slog.Logger {
	// The handler passes every level: the levelHandler decides.
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	var h slog.Handler = slog.NewJSONHandler(w, opts)
	if l.Format == "text" {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(&levelHandler{h: h, lc: newLogControl(l)})
}

// routerLoggers returns the router's loggers for logger, NewRouter's, and cfg, the config it
// starts with: one at the level in force (log.level, /debug/loglevel), one for the API
// handler (its access line under log.access), their control, and the handler they write to.
// A logger from NewLogger lends its control; another one's handler gets one of its own.
func routerLoggers(logger *slog.Logger, cfg *config.Config) (main, access *slog.Logger, lc *logControl, inner slog.Handler) {
	if h, ok := logger.Handler().(*levelHandler); ok && !h.access {
		lc, inner = h.lc, h.h
		lc.level.Set(parseLevel(cfg.Log.Level))
		lc.access.Store(cfg.Log.AccessLog())
	} else {
		lc, inner = newLogControl(cfg.Log), logger.Handler()
	}
	return slog.New(&levelHandler{h: inner, lc: lc}), slog.New(&levelHandler{h: inner, lc: lc, access: true}), lc, inner
}

// logControl is what of the router's logging changes while it runs: the level (log.level at
// start and at every reload that applies; PUT /debug/loglevel in between) and the access log
// (log.access, at start and at every reload that applies).
type logControl struct {
	level  slog.LevelVar
	access atomic.Bool
	// byAdmin: the level in force was set at /debug/loglevel, not by log.level.
	byAdmin atomic.Bool
}

func newLogControl(l config.Log) *logControl {
	lc := &logControl{}
	lc.level.Set(parseLevel(l.Level))
	lc.access.Store(l.AccessLog())
	return lc
}

// parseLevel is log.level as a slog.Level; info for what config's validation refuses.
func parseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}

// levelName is how log.level and /debug/loglevel write l.
func levelName(l slog.Level) string { return strings.ToLower(l.String()) }

// setLevel puts l in force and logs it with the attributes given, as a warning so that it shows
// at any level but error: before the change when it makes the log quieter, after it when it
// makes it louder, so that the line shows under the old level or the new one.
func (lc *logControl) setLevel(logger *slog.Logger, l slog.Level, msg string, attrs ...any) {
	was := lc.level.Level()
	if l == was {
		return
	}
	// Not "level": the record's own key.
	attrs = append(attrs, "log_level", levelName(l), "was", levelName(was))
	if l > was {
		logger.Warn(msg, attrs...)
		lc.level.Set(l)
		return
	}
	lc.level.Set(l)
	logger.Warn(msg, attrs...)
}

// reloaded puts the log settings of cfg, a config a reload applied, in force: log.level (which
// ends a level set at /debug/loglevel) and log.access, saying what changed.
func (lc *logControl) reloaded(logger *slog.Logger, cfg *config.Config) {
	if lc.byAdmin.Swap(false) {
		lc.setLevel(logger, parseLevel(cfg.Log.Level), "the config's log.level is in force again: a reload ends the level set at /debug/loglevel")
	} else {
		lc.setLevel(logger, parseLevel(cfg.Log.Level), "log level changed (log.level)")
	}
	on := cfg.Log.AccessLog()
	if lc.access.Swap(on) != on {
		if on {
			logger.Info("access log on (log.access): one line per request")
		} else {
			logger.Info("access log off (log.access: false): no line per request")
		}
	}
}

// maxLevelBody bounds what PUT /debug/loglevel reads of its body.
const maxLevelBody = 64

// serveLogLevel answers GET /debug/loglevel with the level in force, and PUT with a body of
// debug, info, warn or error by putting it in force until the next config reload that applies
// (or a restart), which puts log.level back; 409 for a level below what the handler the router
// writes to passes (a logger not from NewLogger), which would show nothing more.
func (r *Router) serveLogLevel(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if req.Method == http.MethodPut {
		b, err := io.ReadAll(io.LimitReader(req.Body, maxLevelBody+1))
		name := strings.ToLower(strings.TrimSpace(string(b)))
		switch {
		case err != nil:
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		case name != "debug" && name != "info" && name != "warn" && name != "error":
			http.Error(w, "give the level as the body: debug, info, warn or error", http.StatusBadRequest)
			return
		case !r.logInner.Enabled(req.Context(), parseLevel(name)):
			http.Error(w, "the log handler this router writes to passes nothing at "+name+": it was built with a higher level (app.NewLogger builds one that passes every level)", http.StatusConflict)
			return
		}
		lc := r.logs
		lc.byAdmin.Store(true)
		lc.setLevel(r.logger, parseLevel(name), "log level set at /debug/loglevel: it lasts until the next config reload that applies, or a restart, which put log.level back",
			"config_log_level", r.Config().Log.Level)
	}
	_, _ = io.WriteString(w, levelName(r.logs.level.Level())+"\n")
}

// levelHandler passes on to h the records at or above the level in force that h passes too,
// so that the level can change while the router runs (NewLogger's h passes every level). With
// access set it carries the API handler's records (proxy.Handler.Logger), whose only one at
// info is the access line: with log.access off, Enabled says no to info, and the line is
// neither built into a record nor formatted.
type levelHandler struct {
	h      slog.Handler
	lc     *logControl
	access bool
}

func (l *levelHandler) Enabled(ctx context.Context, level slog.Level) bool {
	if level < l.lc.level.Level() || l.access && level == slog.LevelInfo && !l.lc.access.Load() {
		return false
	}
	return l.h.Enabled(ctx, level)
}

func (l *levelHandler) Handle(ctx context.Context, rec slog.Record) error {
	return l.h.Handle(ctx, rec)
}

func (l *levelHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &levelHandler{h: l.h.WithAttrs(attrs), lc: l.lc, access: l.access}
}

func (l *levelHandler) WithGroup(name string) slog.Handler {
	return &levelHandler{h: l.h.WithGroup(name), lc: l.lc, access: l.access}
}
