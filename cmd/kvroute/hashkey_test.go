package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/config"
)

func TestHashKey(t *testing.T) {
	// Computed independently: printf %s sk-test | sha256sum
	const want = "sha256:f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0\n"
	tests := []struct {
		name, stdin string
		args        []string
		code        int
		out         string
		errHas      string
	}{
		{name: "stdin line", stdin: "sk-test\n", code: 0, out: want},
		{name: "stdin crlf", stdin: "sk-test\r\n", code: 0, out: config.KeyDigest("sk-test") + "\n"},
		{name: "stdin without newline", stdin: "sk-test", code: 0, out: want},
		{name: "blank lines around", stdin: "\n  sk-test\n\n \n", code: 0, out: want},
		// A second key was dropped silently: one key a run.
		{name: "two keys", stdin: "sk-test\r\nsk-other\n", code: 2, errHas: "stdin holds 2 lines, not one key: run once per key"},
		{name: "two keys in the flag", args: []string{"--key", "sk-test\nsk-other"}, code: 2, errHas: "--key holds 2 lines"},
		{name: "flag", args: []string{"--key", "sk-test"}, code: 0, out: config.KeyDigest("sk-test") + "\n"},
		{name: "empty", stdin: "\n", code: 2, errHas: "the key is empty"},
		{name: "extra args", args: []string{"sk-test"}, code: 2, errHas: "unexpected arguments"},
		{name: "both", args: []string{"--key", "a", "--new"}, code: 2, errHas: "not both"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := hashKeyMain(context.Background(), tc.args, strings.NewReader(tc.stdin), &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if tc.out != "" && out.String() != tc.out {
				t.Errorf("stdout %q, want %q", out.String(), tc.out)
			}
			if tc.code != 0 && out.Len() > 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if tc.errHas != "" && !strings.Contains(errOut.String(), tc.errHas) {
				t.Errorf("stderr %q, want it to contain %q", errOut.String(), tc.errHas)
			}
		})
	}
}

func TestHashKeyNew(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := hashKeyMain(context.Background(), []string{"--new"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var key, digest string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch k {
		case "key":
			key = strings.TrimSpace(v)
		case "digest":
			digest = strings.TrimSpace(v)
		}
	}
	if len(key) < 40 || digest != config.KeyDigest(key) {
		t.Errorf("--new printed key %q digest %q; want a long key and its digest", key, digest)
	}
}

// failingWriter fails every write, as standard output on a full disk or a closed pipe does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// Output that cannot be written fails the command: the digest (or a new key, which exists
// nowhere else) lost, with exit 0, before.
func TestHashKeyUnwritableOutput(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--key", "sk-test"}, "kvroute hash-key: write the digest: no space left on device\n"},
		{[]string{"--new"}, "kvroute hash-key: write the new key: no space left on device (nothing was kept: run it again)\n"},
	} {
		var errOut bytes.Buffer
		if code := hashKeyMain(context.Background(), tt.args, strings.NewReader(""), failingWriter{}, &errOut); code != 1 || errOut.String() != tt.want {
			t.Errorf("%q: exit %d, stderr %q; want 1 and %q", tt.args, code, errOut.String(), tt.want)
		}
	}
}
