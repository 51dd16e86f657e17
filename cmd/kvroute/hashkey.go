package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/tenant"
)

// runHashKey prints the form an API key takes in the config (tenants[].api_keys):
// sha256:<hex>. The key comes from stdin (one line; typed without echo on a terminal), from
// --key, or is made up with --new (printed once, with its digest).
func runHashKey(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return hashKeyMain(ctx, args, os.Stdin, stdout, stderr)
}

func hashKeyMain(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("kvroute hash-key")
	key := fs.String("key", "", "the API `key` (visible in the process list and shell history: prefer stdin)")
	gen := fs.Bool("new", false, "make a new random key; print it and its digest")
	if _, code, exit := parseOrExit(fs, args, verbHelp{
		usage: []string{
			"usage: kvroute hash-key [--key KEY | --new] < key",
			"\nprints sha256:<hex>, the form of an API key in tenants[].api_keys. The key is read from",
			"stdin, one line (typed without echo on a terminal), unless --key gives it; one key per",
			"run: stdin with more than one line is refused.",
		},
		argsHint: "give the key on stdin or with --key",
	}, stdout, stderr); exit {
		return code
	}
	if *gen && *key != "" {
		fmt.Fprintln(stderr, "kvroute hash-key: give --key or --new, not both")
		return 2
	}
	k, from := *key, "--key"
	switch {
	case *gen:
		var b [32]byte
		_, _ = rand.Read(b[:])
		k = "sk-kvr-" + base64.RawURLEncoding.EncodeToString(b[:])
		// The key exists nowhere else: output that cannot be written must fail the command.
		if _, err := fmt.Fprintf(stdout, "key:    %s\ndigest: %s\n", k, tenant.HashKey(k)); err != nil {
			fmt.Fprintf(stderr, "kvroute hash-key: write the new key: %v (nothing was kept: run it again)\n", err)
			return 1
		}
		return 0
	case k == "":
		var err error
		from = "stdin"
		if k, err = readKey(stdin, stderr); err != nil {
			fmt.Fprintf(stderr, "kvroute hash-key: reading the key from stdin: %v\n", err)
			return 1
		}
	}
	// A second key would be hashed into the first, or dropped: neither is what was meant.
	if n := countLines(k); n > 1 {
		fmt.Fprintf(stderr, "kvroute hash-key: %s holds %d lines, not one key: run once per key\n", from, n)
		return 2
	}
	k = strings.TrimSpace(k)
	if k == "" {
		fmt.Fprintln(stderr, `kvroute hash-key: the key is empty: pipe it on stdin (echo "$KEY" | kvroute hash-key) or give --key`)
		return 2
	}
	if _, err := fmt.Fprintln(stdout, tenant.HashKey(k)); err != nil {
		fmt.Fprintf(stderr, "kvroute hash-key: write the digest: %v\n", err)
		return 1
	}
	return 0
}

// readKey reads stdin (up to 64 KiB, which no key needs); on a terminal it prompts and reads
// one line without echo.
func readKey(stdin io.Reader, stderr io.Writer) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(stderr, "API key: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		return string(b), err
	}
	b, err := io.ReadAll(io.LimitReader(stdin, 64<<10))
	return string(b), err
}

// countLines counts the lines of s that hold more than white space.
func countLines(s string) int {
	n := 0
	for l := range strings.Lines(s) {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}
