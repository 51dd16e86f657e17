package main

import (
	"context"
	"fmt"
	"io"
)

// runDemo is not built yet: this file is replaced by the verb's implementation.
func runDemo(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvroute: this command is not built yet")
	return 1
}
