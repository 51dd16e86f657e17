// Command kvroute is a prefix-aware router for LLM inference fleets, with the tools to decide
// and to prove: an engine simulator, a fleet simulator, a load generator, a trace analyser and
// a one-command demo. Each verb lives in its own file; this one only dispatches.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/suggest"
)

type verb struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func verbs() []verb {
	return []verb{
		{"demo", "simulated fleet + router + load, policies side by side, in one command", runDemo},
		{"serve", "the router: an OpenAI-compatible prefix-aware reverse proxy", runServe},
		{"sim", "a vLLM-compatible engine simulator (one or many instances)", runSim},
		{"bench", "a load generator for any OpenAI-compatible endpoint", runBench},
		{"simulate", "a fleet in virtual time: routing policies compared in seconds", runSimulate},
		{"analyze", "prefix statistics of a trace: will prefix-aware routing pay off?", runAnalyze},
		{"plan", "the fewest instances that meet a TTFT SLO, per policy, in virtual time", runPlan},
		{"trace", "convert other trace formats (OpenAI request logs, ShareGPT, Azure, BurstGPT, Mooncake in seconds or 64-token blocks) into the Mooncake trace the verbs above read", runTrace},
		{"hash-key", "print the sha256 form of an API key for the tenants config", runHashKey},
		{"version", "print the version and VCS revision of this build (also --version)", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command args names and returns its exit status. Output that could not be
// written (a full disk, a closed descriptor: kvroute help > /dev/full) fails a command that
// would otherwise exit 0, with a line on stderr, whichever of its writes failed; a command
// that Ctrl-C or SIGTERM stopped exits 130 or 143, as a shell reports a process the signal
// killed.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		// Left as it is: a verb tells a terminal by its *os.File (serve's announcement).
		return interrupted(ctx, dispatch(ctx, args, stdout, stderr))
	}
	out := &checkedWriter{w: stdout}
	code := dispatch(ctx, args, out, stderr)
	if err := out.failed(); err != nil && code == 0 {
		name := "kvroute"
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			name += " " + args[0]
		}
		fmt.Fprintf(stderr, "%s: the output could not be written: %v\n", name, err)
		code = 1
	}
	return interrupted(ctx, code)
}

// interrupted is code, but for an interrupted run's 130, which failed gives for any
// cancellation: 143 where SIGTERM was the signal.
func interrupted(ctx context.Context, code int) int {
	if code == 130 && ctx.Err() != nil {
		return interruptedStatus(ctx)
	}
	return code
}

// checkedWriter passes writes through to w and keeps the first error, so that run sees a
// write that failed whichever verb made it and whether or not that verb looked.
type checkedWriter struct {
	w   io.Writer
	mu  sync.Mutex
	err error
}

func (c *checkedWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if err != nil {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
	}
	return n, err
}

// failed is the first write error, nil when every write succeeded.
func (c *checkedWriter) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 2 && args[0] == "help" {
		fmt.Fprintf(stderr, "kvroute: help takes one command, not %q (run 'kvroute help')\n", args[1:])
		return 2
	}
	if len(args) == 2 && args[0] == "help" {
		// kvroute help CMD is kvroute CMD -h.
		args = []string{args[1], "-h"}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
	}
	var names []string
	for _, v := range verbs() {
		if v.name == args[0] {
			return v.run(ctx, args[1:], stdout, stderr)
		}
		names = append(names, v.name)
	}
	hint := ""
	if near := suggest.Nearest(args[0], names); near != "" {
		hint = fmt.Sprintf("did you mean %q? ", near)
	}
	fmt.Fprintf(stderr, "kvroute: unknown command %q (%srun 'kvroute help')\n", args[0], hint)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "kvroute: a prefix-aware router for LLM inference fleets")
	fmt.Fprintln(w, "\nusage: kvroute <command> [flags]   (kvroute help <command> or kvroute <command> -h for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	for _, v := range verbs() {
		fmt.Fprintf(w, "  %-9s %s\n", v.name, v.summary)
	}
}
