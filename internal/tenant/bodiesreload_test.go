package tenant

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// A reload that raises a tenant's max_concurrent, or lifts it, lets the request bodies
// waiting for a place in at once, and a newcomer after them: before, the waiters and the
// newcomer were refused after bodyWait (1 s) with 16 places free.
func TestReloadLetsWaitingBodiesIn(t *testing.T) {
	for _, tc := range []struct{ name, limits string }{
		{"raised", "{max_concurrent: 10}"},
		{"lifted", "{}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := HashKey("sk-tight")
			g, _ := newTestGate(t, `tenants:
  - {name: tight, api_keys: ["`+key+`"], limits: {max_concurrent: 1}}
`, nil)
			id, oe := g.Authenticate(http.Header{"Authorization": {"Bearer sk-tight"}})
			if oe != nil {
				t.Fatal(oe)
			}
			ctx := context.Background()
			for range minBodies { // the bound: max(2 x 1, minBodies)
				if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
					t.Fatal(oe)
				}
			}
			got := make(chan *openai.Error, 2)
			for range 2 {
				go func() { got <- g.TakeBody(ctx, id, 0, http.Header{}) }()
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
				id.state.mu.Lock()
				n := len(id.state.bodyWaiters)
				id.state.mu.Unlock()
				if n == 2 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d bodies waiting, want 2", n)
				}
			}
			start := time.Now()
			if err := g.Reload(testConfig(t, `tenants:
  - {name: tight, api_keys: ["`+key+`"], limits: `+tc.limits+`}
`)); err != nil {
				t.Fatal(err)
			}
			for range 2 {
				select {
				case oe := <-got:
					if oe != nil {
						t.Errorf("a waiting body refused with places free: %v", oe)
					}
				case <-time.After(bodyWait / 2):
					t.Fatalf("a waiting body still waits %v after the reload (bodyWait %v)", time.Since(start), bodyWait)
				}
			}
			if oe := g.TakeBody(ctx, id, 0, http.Header{}); oe != nil {
				t.Errorf("a newcomer after the reload: %v", oe)
			}
			if d := time.Since(start); d >= bodyWait/2 {
				t.Errorf("the waiters and the newcomer took %v", d)
			}
		})
	}
}
