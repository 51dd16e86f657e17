package main

import (
	"context"
	"fmt"
	"io"
)

// runServe is not built yet: this file is replaced by the verb's implementation.
func runServe(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kvroute: this command is not built yet")
	return 1
}
