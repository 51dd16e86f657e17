package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/simserver"
)

// simError is StartFleet's err as kvroute sim says it. StartFleet checks all its options
// before it listens, each bad one an OptionError: those are said with the flag that set the
// field (--time-scale -1: ...), not the package's words, as a usage error. A failure to listen
// says how to get another port; what remains is said as it is, but for the package's name.
func simError(err error) error {
	var flagErrs []error
	if walkLeaves(err, func(leaf error) bool {
		var oe *simserver.OptionError
		if !errors.As(leaf, &oe) || simFlag(oe.Field) == "" {
			return false
		}
		flagErrs = append(flagErrs, fmt.Errorf("--%s %s: %s", simFlag(oe.Field), oe.Value, oe.Msg))
		return true
	}) {
		return usageError{errors.Join(flagErrs...)}
	}
	msg := strings.TrimPrefix(err.Error(), "simserver: ")
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		msg += " (another process listens there: stop it or give --port another port; 0 takes free ones)"
	case !errors.As(err, new(*net.OpError)) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
		// Not listening (a port in use, an address not ours) nor the end of ctx: a flag's value.
		return usageError{renamedError{err, msg}}
	}
	return renamedError{err, msg}
}

// walkLeaves calls f on each error at the end of err's chains (errors.Join's, %w's), in order,
// and reports whether f took every one.
func walkLeaves(err error, f func(error) bool) bool {
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if !walkLeaves(inner, f) {
				return false
			}
		}
		return true
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return walkLeaves(inner, f)
		}
	}
	return f(err)
}

// simFlag is the flag of kvroute sim that sets the field of simserver.Options called field
// (an OptionError's Field), or "" for none.
func simFlag(field string) string {
	switch field {
	case "TimeScale":
		return "time-scale"
	case "Profile":
		return "profile"
	case "BlockSize":
		return "block-size"
	case "KVBlocks":
		return "kv-blocks"
	case "MaxModelLen":
		return "max-model-len"
	case "DefaultMaxTokens":
		return "default-max-tokens"
	case "KVEvents":
		return "kv-events"
	case "KVEventsReplay":
		return "kv-events-replay"
	case "Faults.FailRate":
		return "fail-rate"
	case "Faults.FailStatus":
		return "fail-status"
	case "Faults.Slow":
		return "slow"
	case "Faults.CutAfter":
		return "cut-after"
	case "Faults.DropOn":
		return "drop-on"
	}
	return ""
}

// runSim serves simulated vLLM instances until ctx ends (SIGINT, SIGTERM), then drains them.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute sim")
	var (
		o       simserver.Options
		n       = fs.Int("instances", 1, "`N` instances, served on ports --port to --port+N-1")
		port    = fs.Int("port", 8000, "first instance's port (0: free ports)")
		host    = fs.String("host", "127.0.0.1", "address to listen on")
		drain   = fs.Duration("drain", 10*time.Second, "on shutdown, how long in-flight streams may finish")
		verbose = fs.Bool("v", false, "log every request (never its text)")
	)
	fs.StringVar(&o.Profile, "profile", simserver.DefaultProfile, "engine profile: "+profileNames())
	fs.StringVar(&o.Model, "model", simserver.DefaultModel, "served model name")
	fs.Float64Var(&o.TimeScale, "time-scale", 1, "wall seconds per model second (0.1: ten times faster); reported durations stay in model time")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the generated text and fault draws")
	fs.IntVar(&o.BlockSize, "block-size", 0, "KV block size in tokens (0: the profile's)")
	fs.IntVar(&o.KVBlocks, "kv-blocks", 0, "KV blocks per instance (0: the profile's)")
	fs.IntVar(&o.MaxModelLen, "max-model-len", 131072, "prompt + output token limit")
	fs.IntVar(&o.DefaultMaxTokens, "default-max-tokens", 256, "output tokens when a request gives no max_tokens")
	fs.DurationVar(&o.StreamInterval, "stream-interval", 0, "least wall time between two writes of a stream; tokens in between go out together, each in its own chunk (0: 10ms, negative: every step)")
	fs.StringVar(&o.KVEvents, "kv-events", "", "ZMQ PUB endpoint of KV events, tcp://HOST:PORT (instance i uses PORT+i)")
	fs.StringVar(&o.KVEventsReplay, "kv-events-replay", "", "ZMQ ROUTER replay endpoint, tcp://HOST:PORT (instance i uses PORT+i)")
	fs.BoolVar(&o.Admin, "admin", false, "serve GET/POST /admin/faults on each instance")
	fs.BoolVar(&o.Faults.Unhealthy, "unhealthy", false, "fault: /health answers 503")
	fs.BoolVar(&o.Faults.Refuse, "refuse", false, "fault: close API connections without answering")
	fs.Float64Var(&o.Faults.FailRate, "fail-rate", 0, "fault: fraction of API requests that fail at once")
	fs.IntVar(&o.Faults.FailStatus, "fail-status", 503, "fault: status of failed requests (500 or 503)")
	fs.Float64Var(&o.Faults.Slow, "slow", 1, "fault: every engine step takes FACTOR times longer")
	fs.IntVar(&o.Faults.CutAfter, "cut-after", 0, "fault: cut every stream after N tokens (0: never)")
	fs.BoolVar(&o.Faults.Hang, "hang", false, "fault: accept API requests and never answer them (/health still answers)")
	fs.StringVar(&o.Faults.DropOn, "drop-on", "", "fault: drop the connection of a request whose body contains `TEXT` (a query of death)")
	fs.BoolVar(&o.Faults.DropAll, "drop-all", false, "fault: a --drop-on request drops every request in flight too (a crash)")
	fs.BoolVar(&o.Faults.NoPrefixCache, "no-prefix-cache", false, "fault: find nothing cached and report cached_tokens 0 (prefix caching off, or cache keys unlike the router's)")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute sim [--instances N] [--port P] [flags]",
			"\nServes simulated vLLM instances (OpenAI API, /metrics, /health) until SIGINT or SIGTERM.",
		},
		floats: map[string]string{
			"time-scale": "a positive factor (0.1 runs ten times faster)",
			"fail-rate":  "a fraction of the requests from 0 to 1",
			"slow":       "a factor of 1 or more (0 for none)",
		},
	}, stdout, stderr); exit {
		return code
	}
	// simserver reads a zero TimeScale, Model, MaxModelLen or DefaultMaxTokens as its default,
	// but the flags' defaults are already those: a zero given here is a mistake, not a request
	// for the default.
	var errs []error
	if o.TimeScale == 0 {
		errs = append(errs, errors.New("--time-scale 0: want a positive factor (0.1 runs ten times faster)"))
	}
	if strings.TrimSpace(o.Model) == "" {
		errs = append(errs, fmt.Errorf("--model %q: empty: give the served model's name (default %s)", o.Model, simserver.DefaultModel))
	}
	if o.MaxModelLen <= 0 {
		errs = append(errs, fmt.Errorf("--max-model-len %d: want a positive token count (default 131072)", o.MaxModelLen))
	}
	if o.DefaultMaxTokens <= 0 {
		errs = append(errs, fmt.Errorf("--default-max-tokens %d: want a positive token count (default 256)", o.DefaultMaxTokens))
	}
	if *drain < 0 {
		errs = append(errs, fmt.Errorf("--drain %v: want a duration >= 0 (0: close open streams at once)", *drain))
	}
	// The fleet's own arguments, and what joins two flags, said with the flags' names (simserver
	// refuses them too, in its own words).
	if *n < 1 {
		errs = append(errs, fmt.Errorf("--instances %d: want at least 1", *n))
	} else if *port < 0 || *port+*n-1 > 65535 {
		errs = append(errs, fmt.Errorf("--port %d: want a port from 1 to %d for %d instance(s) (0: free ports)", *port, 65536-*n, *n))
	}
	// The help lists 500 and 503, what an engine's own failures are; POST /admin/faults takes
	// any 4xx or 5xx (a 429 of an engine behind a rate limiter).
	if st := o.Faults.FailStatus; st != 500 && st != 503 {
		errs = append(errs, fmt.Errorf("--fail-status %d: want 500 or 503", st))
	}
	if o.Faults.DropAll && o.Faults.DropOn == "" {
		errs = append(errs, errors.New("--drop-all without --drop-on: give --drop-on TEXT, the text that makes the instance crash"))
	}
	if o.KVEventsReplay != "" && o.KVEvents == "" {
		errs = append(errs, errors.New("--kv-events-replay without --kv-events: give both"))
	}
	if len(errs) > 0 {
		return failed(stderr, fs.Name(), usageError{errors.Join(errs...)})
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	fleet, err := simserver.StartFleet(ctx, o, *n, *host, *port)
	if err != nil {
		return failed(stderr, fs.Name(), simError(err))
	}
	for i, u := range fleet.URLs() {
		in := fleet.Instances()[i]
		cfg := in.Config()
		line := fmt.Sprintf("instance %d: %s model=%s profile=%s blocks=%dx%d time-scale=%g", i, u, in.Model(), cfg.Profile.Name, cfg.NumBlocks, cfg.BlockSize, o.TimeScale)
		if pub, replay := in.KVEventsAddr(); pub != "" {
			line += " kv-events=" + pub
			if replay != "" {
				line += " replay=" + replay
			}
		}
		fmt.Fprintln(stdout, line)
	}
	<-ctx.Done()
	fmt.Fprintln(stderr, "kvroute sim: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	if err := fleet.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stderr, "kvroute sim: shutdown: %v\n", err)
		return 1
	}
	return 0
}
