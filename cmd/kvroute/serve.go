package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/logbuf"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/version"
)

// runServe runs the router until ctx ends (SIGINT, SIGTERM), then drains in-flight requests;
// a second SIGINT or SIGTERM ends the process at once. SIGHUP and changes to the config file,
// or to the secrets' files it names, reload it; a bad new config is logged and the old one
// kept. With --check it only judges the config, as it would at start, and says so.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute serve")
	var (
		cfgPath   = fs.String("config", "", "YAML config `file` (see examples/kvroute.yaml); required unless --endpoint is given")
		endpoints listFlag
		models    namesFlag
		engine    = fs.String("engine", "auto", "with --endpoint: the endpoints' engine ("+strings.Join(config.Engines(), ", ")+"; auto: detected on first contact)")
		pol       = fs.String("policy", "", "with --endpoint: routing policy, name[:key=value,...] ("+strings.Join(policy.Names(), ", ")+")")
		listen    = fs.String("listen", "", "OpenAI API address, overrides the config's listen (default "+config.DefaultListen+")")
		admin     = fs.String("admin-listen", "", "admin address (/metrics, /healthz, /readyz, /debug/endpoints, /debug/explain), overrides admin_listen (default "+config.DefaultAdminListen+")")
		pprof     = fs.Bool("pprof", false, "serve /debug/pprof on the admin address")
		logFormat = fs.String("log-format", "", "json or text, overrides log.format")
		httpSrv   = fs.String("http-server", "", "builtin or net/http: what serves the API listener, overrides server.http_server")
		extListen = fs.String("extproc-listen", "", "Envoy ext_proc endpoint-picker address (gRPC), overrides extproc.listen")
		extHealth = fs.String("extproc-health-listen", "", "gRPC health address of the endpoint picker, overrides extproc.health_listen")
		check     = fs.Bool("check", false, "judge the config (the file, or --endpoint, with the other flags) as serve does at start, print its problems or \"config OK\" and a summary, and exit: 0 OK, 1 problems, 2 bad flags; binds and contacts nothing")
	)
	fs.Var(&endpoints, "endpoint", "engine base `URL` for a quick start without a config file (repeatable)")
	fs.Var(&models, "model", "with --endpoint: a `NAME` the endpoints serve; repeatable and comma-separated for several (none: the ones each lists at GET /v1/models)")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute serve --config FILE [flags]",
			"       kvroute serve --endpoint URL [--endpoint URL ...] [--model NAME[,NAME...]] [--policy SPEC] [flags]",
			"       kvroute serve --check [--config FILE | --endpoint URL ...] [flags]",
			"\nThe router: an OpenAI-compatible, prefix-aware reverse proxy in front of engine instances.",
			"SIGHUP or a change of the config file (or of a secret's file) reloads it; SIGINT/SIGTERM drain requests in flight,",
			"and a second SIGINT/SIGTERM exits at once (status 130 or 143). --check judges the config and exits.",
		},
	}, stdout, stderr); exit {
		return code
	}
	if (*cfgPath == "") == (len(endpoints) == 0) {
		if *cfgPath != "" {
			fmt.Fprintln(stderr, "kvroute serve: give either --config FILE or one or more --endpoint URL, not both (list the endpoints under endpoints: in the config)")
		} else {
			fmt.Fprintln(stderr, "kvroute serve: give either --config FILE or one or more --endpoint URL")
		}
		return 2
	}
	if *cfgPath != "" {
		// These shape the quick start's config only; with a file they would be ignored silently.
		var quick []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "model" || f.Name == "engine" || f.Name == "policy" {
				quick = append(quick, "--"+f.Name)
			}
		})
		if len(quick) > 0 {
			verb := "applies"
			if len(quick) > 1 {
				verb = "apply"
			}
			fmt.Fprintf(stderr, "kvroute serve: %s %s only with --endpoint; with --config set them in the file (endpoints[].models, endpoints[].engine, policy)\n", strings.Join(quick, ", "), verb)
			return 2
		}
	}
	overrides := func(c *config.Config) {
		if *listen != "" {
			c.Listen = *listen
		}
		if *admin != "" {
			c.AdminListen = *admin
		}
		if *pprof {
			c.Pprof = true
		}
		if *logFormat != "" {
			c.Log.Format = *logFormat
		}
		if *httpSrv != "" {
			c.Server.HTTPServer = *httpSrv
		}
		if *extListen != "" {
			c.ExtProc.Listen = *extListen
		}
		if *extHealth != "" {
			c.ExtProc.HealthListen = *extHealth
		}
	}
	// The overrides are applied before validation, so that its checks (listen and
	// admin_listen apart, a known log format) see the values in force.
	var cfg *config.Config
	var initial []byte // the config file's content in force, so the watcher sees later changes
	var err error
	if *cfgPath != "" {
		initial, err = os.ReadFile(*cfgPath)
		if err == nil {
			cfg, err = config.LoadWith(*cfgPath, overrides, configChecks())
		}
	} else {
		cfg, err = quickConfig(endpoints, models, *engine, *pol, overrides)
	}
	if err != nil {
		err = blameFlags(err, flagKeys(endpoints, *engine, *pol, *listen, *admin, *logFormat, *httpSrv, *extListen, *extHealth), *cfgPath)
		if errors.As(err, new(usageError)) {
			return failed(stderr, "kvroute serve", err)
		}
		fmt.Fprintf(stderr, "kvroute serve: %v\n", err)
		return 1
	}
	if *check {
		return checkConfig(cfg, *cfgPath, stdout, stderr)
	}
	// The secrets' files as they are before the router reads them, so that the watcher sees a
	// change made since.
	refs := config.ReadRefs(cfg.Refs())
	// Access lines are batched (package logbuf): a line is written at once, with any waiting
	// before it, when none was written for 100 ms; sooner ones wait for the next such line or
	// 64 KB, and at most a second.
	logOut := logbuf.New(stderr, 0, 0)
	defer logOut.Close()
	logger := app.NewLogger(cfg.Log, logOut) // its level follows the router: reloads, /debug/loglevel
	build := version.Get()
	source := *cfgPath
	if source == "" {
		source = "--endpoint"
	}
	logger.Info("kvroute serve starting", "version", build.Version, "revision", build.Revision, "modified", build.Modified,
		"go", build.GoVersion, "config", source)
	for _, w := range cfg.Warnings {
		logger.Warn("config", "warning", w)
	}
	// fatal says why serve stops, after the log lines still waiting in logOut: the reason is
	// the last line, where a reader of a terminal or of a container's log looks for it.
	fatal := func(err error) int {
		logOut.Close()
		fmt.Fprintf(stderr, "kvroute serve: %v\n", err)
		return 1
	}
	r, err := app.NewRouter(cfg, logger)
	if err != nil {
		return fatal(err)
	}
	apiLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fatal(listenError("listen", "--listen", err))
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		apiLn.Close()
		return fatal(listenError("admin listen", "--admin-listen", err))
	}
	extLn, extHealthLn, err := listenExtProc(cfg.ExtProc)
	if err != nil {
		apiLn.Close()
		adminLn.Close()
		return fatal(err)
	}

	// A second SIGINT or SIGTERM (main's NotifyContext takes the first, which ends ctx) ends
	// the process in the middle of the drain: what an operator who will not wait means. Each
	// signal reaches this channel as well as main's, so the second one here is the second.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	served := make(chan struct{})
	defer close(served)
	go forceExit(sigs, served, logger, logOut)
	// The drain starts on drainCtx, which ends after ctx, once the signal that ended ctx is
	// logged: "signal received" comes before the shutdown's own lines, not after them, as it
	// did when forceExit logged it from its own goroutine while the router was already
	// shutting down.
	drainCtx, startDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer startDrain()
	go func() {
		select {
		case <-ctx.Done():
			logSignal(ctx, logger)
		case <-served:
		}
		startDrain()
	}()

	// SIGHUP forces a reload (and, without a config file, is logged rather than fatal); the
	// watcher also reloads when the content of the file, or of a secret's file, changes.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	watcher := &config.Watcher{
		Path: *cfgPath, Initial: initial, Config: cfg, InitialRefs: refs, Adjust: overrides, Checks: configChecks(), Hangup: hup, Logger: logger,
		Apply:    func(c *config.Config) { _ = r.Reload(c) }, // Reload logs and counts a rejection
		Rejected: func(error) { r.Metrics().Reloads.WithLabelValues("error").Inc() },
	}
	wctx, stopWatch := context.WithCancel(drainCtx)
	watched := make(chan error, 1)
	go func() { watched <- watcher.Run(wctx) }()
	defer func() {
		stopWatch()
		<-watched // Run logs its own failure
	}()
	scheme := "http"
	if cfg.Server.TLS.Enabled() {
		scheme = "https"
	}
	// The endpoint picker runs beside the API (Router.Beside): the two drain side by side, and
	// the endpoints stay followed (discovery, health checks, scrapes, peers) until both have
	// drained, whichever ends last.
	if extLn != nil {
		r.Beside = func(ctx context.Context) error {
			if err := r.ServeExtProc(ctx, extLn, extHealthLn); err != nil {
				return fmt.Errorf("ext_proc: %w", err)
			}
			return nil
		}
		health := "on the ext_proc address"
		if extHealthLn != nil {
			health = "grpc://" + extHealthLn.Addr().String()
		}
		announce(stdout, cfg.Log, fmt.Sprintf("kvroute serve: ext_proc grpc://%s health %s", extLn.Addr(), health),
			"ext_proc", "grpc://"+extLn.Addr().String(), "health", health, "version", build.Version)
	}
	api, adminURL := scheme+"://"+apiLn.Addr().String(), "http://"+adminLn.Addr().String()
	announce(stdout, cfg.Log, fmt.Sprintf("kvroute serve: api %s admin %s policy %s, %d endpoint(s)", api, adminURL, cfg.Policy.Name, r.Pool().Len()),
		"api", api, "admin", adminURL, "policy", cfg.Policy.Name, "endpoints", r.Pool().Len(), "version", build.Version)
	if err := r.Serve(drainCtx, apiLn, adminLn); err != nil {
		return fatal(err)
	}
	return 0
}

// listenError is err, from listening on the address that flag (or the config key it
// overrides) gives, with the fix when another process holds the address.
func listenError(what, flag string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s: %w (another process listens there: stop it or give %s another port)", what, err, flag)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// logSignal says, once ctx has ended, why the router drains, when a signal ended it: main's
// signal.NotifyContext gives ctx a cause that names the signal ("terminated signal received"
// for SIGTERM, whose os.Signal String is "terminated"). A caller that only cancels ctx (a
// test) gives none, and is said nothing.
func logSignal(ctx context.Context, logger *slog.Logger) {
	cause := context.Cause(ctx)
	if cause == nil || cause == ctx.Err() {
		return
	}
	sig := strings.TrimSuffix(cause.Error(), " signal received")
	logger.Info("signal received: draining requests in flight; send it again to exit at once", "signal", sig)
}

// announce prints a line that says where serve listens (tests and scripts wait for it). On a
// terminal it is the line alone; otherwise it is a log record in log.format (JSON unless
// text), whatever log.level, so that stdout and stderr collected into one stream, as a
// container's log is, parse line by line. The message keeps the words scripts look for.
func announce(w io.Writer, l config.Log, msg string, attrs ...any) {
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprintln(w, msg)
		return
	}
	l.Level = "info"
	newLogger(l, w).Info(msg, attrs...)
}

// forceExit waits for signals on sigs until served is closed: the first is the one that
// starts the drain (main ends ctx on it, and logSignal says so), the second ends the process
// at once, with the status a shell gives a process that signal killed (130 for SIGINT, 143
// for SIGTERM).
func forceExit(sigs <-chan os.Signal, served <-chan struct{}, logger *slog.Logger, logs *logbuf.Writer) {
	for n := 1; ; n++ {
		select {
		case <-served:
			return
		case sig := <-sigs:
			if n == 1 {
				continue
			}
			code := 1
			if s, ok := sig.(syscall.Signal); ok {
				code = 128 + int(s)
			}
			logger.Error("second signal: exiting at once, without waiting for the requests in flight", "signal", sig.String(), "status", code)
			logs.Flush()
			os.Exit(code)
		}
	}
}

// checkConfig is serve --check once the config loaded (defaulted and validated, with the
// checks serve makes at start): it reads the discovery file as the router would at start,
// prints the warnings to stderr (the config's, then the file's, as serve logs them at start)
// and the summary to stdout, and returns the exit status: a discovery file that cannot be
// read or parsed is a problem, as it stops serve at start. It binds no address and contacts
// nothing: DNS names, Kubernetes and the engines are not asked.
func checkConfig(cfg *config.Config, path string, stdout, stderr io.Writer) int {
	for _, w := range cfg.Warnings {
		fmt.Fprintf(stderr, "kvroute serve: warning: %s\n", w)
	}
	discovered := -1
	if src := discovery.FromConfig(cfg, nil); src != nil {
		specs, err := src.Load() // its errors are those serve stops with at start
		if err != nil {
			fmt.Fprintf(stderr, "kvroute serve: %v\n", err)
			return 1
		}
		discovered = len(specs)
		// Load leaves the file's warnings to the source's Run, which a check never starts:
		// before, endpoints of the file without engine: passed the check unsaid.
		for _, w := range fileWarnings(src.Path) {
			fmt.Fprintf(stderr, "kvroute serve: warning: discovery.file %s: %s\n", src.Path, w)
		}
	}
	fmt.Fprintln(stdout, "config OK: "+configSummary(cfg, path, discovered))
	return 0
}

// fileWarnings are the warnings of the discovery file at path (config.ParseEndpointsWarn),
// which the router logs when its discovery starts; none where the file cannot be read or
// parsed (checkConfig has just read it whole).
func fileWarnings(path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	_, warnings, _ := config.ParseEndpointsWarn(data)
	return warnings
}

// configSummary says in one line what a config that loaded serves: its source, endpoints,
// discovery sources, policy and tenants. discovered is the discovery file's endpoints (-1:
// no file).
func configSummary(cfg *config.Config, path string, discovered int) string {
	source := path
	if source == "" {
		source = "--endpoint"
	}
	var disc []string
	if discovered >= 0 {
		disc = append(disc, fmt.Sprintf("file %s (%d endpoint(s))", cfg.Discovery.File, discovered))
	}
	if n := len(cfg.Discovery.DNS); n > 0 {
		disc = append(disc, fmt.Sprintf("%d DNS name(s)", n))
	}
	if n := len(cfg.Discovery.Kubernetes); n > 0 {
		disc = append(disc, fmt.Sprintf("%d Kubernetes source(s)", n))
	}
	if cfg.Discovery.InferencePool != nil {
		disc = append(disc, "an InferencePool")
	}
	if len(disc) == 0 {
		disc = []string{"none"}
	}
	auth := "none"
	if cfg.Auth != nil {
		auth = string(cfg.Auth.Mode)
	}
	tenants := fmt.Sprintf("%d tenant(s)", len(cfg.Tenants))
	capped := 0
	for _, t := range cfg.Tenants {
		if t.Limits.MaxOutputTokens > 0 {
			capped++
		}
	}
	if capped > 0 {
		// A cap rewrites the bodies of the tenant's requests: worth seeing before serving.
		tenants += fmt.Sprintf(", %d with max_output_tokens", capped)
	}
	return fmt.Sprintf("%s: %d endpoint(s); discovery: %s; policy %s; %s, auth %s",
		source, len(cfg.Endpoints), strings.Join(disc, ", "), cfg.Policy.Name, tenants, auth)
}

// listenExtProc opens the endpoint picker's listeners when the config serves it (nil, nil
// when not; health nil when it shares the ext_proc address).
func listenExtProc(c config.ExtProc) (ln, health net.Listener, err error) {
	if !c.Enabled() {
		return nil, nil, nil
	}
	if ln, err = net.Listen("tcp", c.Listen); err != nil {
		return nil, nil, listenError("extproc listen", "--extproc-listen", err)
	}
	if c.HealthListen != "" {
		if health, err = net.Listen("tcp", c.HealthListen); err != nil {
			ln.Close()
			return nil, nil, listenError("extproc health listen", "--extproc-health-listen", err)
		}
	}
	return ln, health, nil
}

// quickConfig builds a config from --endpoint flags, every endpoint serving models (none: the
// ones it lists), with adjust (nil for none) applied before defaults and validation.
func quickConfig(urls, models []string, engine, pol string, adjust func(*config.Config)) (*config.Config, error) {
	c := config.Quick(urls, "", engine)
	if len(models) > 0 {
		for i := range c.Endpoints {
			c.Endpoints[i].Models = slices.Clone(models)
		}
	}
	if pol != "" {
		name, params, err := policy.ParseSpec(pol)
		if err != nil {
			return nil, usageErr("--policy %s: %w", pol, err)
		}
		c.Policy.Name = name
		c.Policy.Params = map[string]any{}
		for k, v := range params {
			c.Policy.Params[k] = v
		}
	}
	if adjust != nil {
		adjust(c)
	}
	c.SetDefaults()
	if err := c.Validate(configChecks()); err != nil {
		return nil, err
	}
	return c, nil
}

// flagKeys maps the config keys that serve's flags set (the quick start's endpoints, engine
// and policy; the overrides) to the flag and value that set them, for blameFlags.
func flagKeys(urls []string, engine, pol, listen, admin, logFormat, httpSrv, extListen, extHealth string) map[string]string {
	keys := map[string]string{}
	set := func(key, flag, v string) {
		if v != "" {
			keys[key] = "--" + flag + " " + v
		}
	}
	for i, u := range urls {
		set(fmt.Sprintf("endpoints[%d].url", i), "endpoint", u)
		set(fmt.Sprintf("endpoints[%d].engine", i), "engine", engine)
	}
	set("policy.name", "policy", pol)
	set("policy.params", "policy", pol)
	set("listen", "listen", listen)
	set("admin_listen", "admin-listen", admin)
	set("log.format", "log-format", logFormat)
	set("server.http_server", "http-server", httpSrv)
	set("extproc.listen", "extproc-listen", extListen)
	set("extproc.health_listen", "extproc-health-listen", extHealth)
	return keys
}

// blameFlags rewrites the problems of err, a config's, whose key the command line set
// (setBy, from flagKeys) so that they name the flag and its value, not a key the user never
// wrote. When every problem is the command line's it returns a usage error (exit status 2);
// otherwise the flags' problems come first and the config file's own follow under their keys,
// after "config FILE: " as LoadWith words them. An error with no problem in it (a file that
// does not read or decode) comes back as it is.
func blameFlags(err error, setBy map[string]string, file string) error {
	var flagErrs, rest []error
	seen := map[string]bool{}
	for _, e := range problemsAndOthers(err) {
		p, ok := e.(*config.Problem)
		by, set := "", false
		if ok {
			by, set = setBy[p.Key]
		}
		if !set {
			rest = append(rest, e)
			continue
		}
		// --engine is every endpoint's: one line for all of them.
		if msg := by + ": " + p.Msg; !seen[msg] {
			seen[msg] = true
			flagErrs = append(flagErrs, errors.New(msg))
		}
	}
	switch {
	case len(flagErrs) == 0:
		return err
	case len(rest) == 0:
		return usageError{errors.Join(flagErrs...)}
	case file != "":
		return errors.Join(append(flagErrs, fmt.Errorf("config %s: %w", file, errors.Join(rest...)))...)
	default:
		return errors.Join(append(flagErrs, rest...)...)
	}
}

// problemsAndOthers returns the problems in err, a config's, in order: each *config.Problem,
// and each other error joined in it (an unknown key, a mistyped value), so that blameFlags
// keeps those with the file's. A wrapping with no Problem inside stays whole.
func problemsAndOthers(err error) []error {
	var out []error
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *config.Problem:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if inner := e.Unwrap(); len(config.Problems(inner)) > 0 {
				walk(inner) // "config FILE: ..."
			} else {
				out = append(out, err)
			}
		default:
			out = append(out, err)
		}
	}
	walk(err)
	return out
}

// newLogger builds the process logger: JSON (default) or text, at the configured level.
func newLogger(l config.Log, w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if l.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// configChecks judge, for config validation, what only the policy package knows.
func configChecks() config.Checks {
	return config.Checks{PolicyNames: policy.Names(), Policy: policy.Check, ReadSecrets: true}
}
