package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/tenant"
)

// runHashKey prints the form an API key takes in the config (tenants[].api_keys):
// sha256:<hex>. The key comes from stdin (first line; typed without echo on a terminal), from
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
			"\nprints sha256:<hex>, the form of an API key in tenants[].api_keys.",
		},
		argsHint: "give the key on stdin or with --key",
	}, stdout, stderr); exit {
		return code
	}
	if *gen && *key != "" {
		fmt.Fprintln(stderr, "kvroute hash-key: give --key or --new, not both")
		return 2
	}
	k := *key
	switch {
	case *gen:
		var b [32]byte
		_, _ = rand.Read(b[:])
		k = "sk-kvr-" + base64.RawURLEncoding.EncodeToString(b[:])
		fmt.Fprintf(stdout, "key:    %s\ndigest: %s\n", k, tenant.HashKey(k))
		return 0
	case k == "":
		var err error
		if k, err = readKey(stdin, stderr); err != nil {
			fmt.Fprintf(stderr, "kvroute hash-key: reading the key from stdin: %v\n", err)
			return 1
		}
	}
	k = strings.TrimSpace(k)
	if k == "" {
		fmt.Fprintln(stderr, `kvroute hash-key: the key is empty: pipe it on stdin (echo "$KEY" | kvroute hash-key) or give --key`)
		return 2
	}
	fmt.Fprintln(stdout, tenant.HashKey(k))
	return 0
}

// readKey reads the first line of stdin; on a terminal it prompts and does not echo.
func readKey(stdin io.Reader, stderr io.Writer) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(stderr, "API key: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(stderr)
		return string(b), err
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	return line, nil
}
