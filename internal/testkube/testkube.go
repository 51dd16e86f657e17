// Package testkube helps tests that build Kubernetes clients from a kubeconfig and then give
// them a fake API server instead.
package testkube

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// RunUntilCleanup runs run (a watch's or a source's Run) in a goroutine until the test ends;
// then it cancels run's context and checks that run returned context.Canceled within 10 s.
func RunUntilCleanup(t testing.TB, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of its context's end")
		}
	})
}

// Kubeconfig writes a kubeconfig, in a directory of the test's, whose context names namespace
// and an API server nobody listens on (127.0.0.1:1), and returns its path: clients built from
// it are valid and never reach a cluster.
func Kubeconfig(t testing.TB, namespace string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: %s}}]
current-context: x
`, namespace), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
