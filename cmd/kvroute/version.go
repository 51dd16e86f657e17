package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/internal/version"
)

// runVersion prints the version, the VCS revision and the Go version of this build (also as
// kvroute --version); --json prints them as an object.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute version")
	asJSON := fs.Bool("json", false, "print a JSON object")
	if _, code, exit := parseOrExit(fs, args, verbHelp{usage: []string{
		"usage: kvroute version [--json]",
		"\nprints the version and VCS revision this binary was built from (\"unknown\" when the build did not record them).",
	}}, stdout, stderr); exit {
		return code
	}
	info := version.Get()
	if *asJSON {
		b, _ := json.Marshal(info)
		fmt.Fprintln(stdout, string(b))
		return 0
	}
	fmt.Fprintln(stdout, info)
	return 0
}
