package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// holding is a policy that holds every request 7 ms per candidate it is shown, and records
// what it heard in order.
type holding struct{ replicated }

func (p *holding) Defer(r *policy.Request, c []*endpoint.Endpoint) time.Duration {
	p.got = append(p.got, fmt.Sprintf("defer %s among %d", r.ID, len(c)))
	return time.Duration(len(c)) * 7 * time.Millisecond
}

// TestHold: the lifecycle asks a holding policy with the replicas' settings passed on first,
// among the admitted candidates only; never for a pinned request or a policy that does not
// hold, nor with no candidate admitted.
func TestHold(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	p := &holding{}
	a := newReplica(t, 1, p, clk, ShareConfig{}, "x", "y", "z")
	a.share.SetReplicas(2, 1, 5*time.Millisecond)
	r := &policy.Request{ID: "r"}
	if got := a.lc.Hold(r, a.eps, ""); got != 21*time.Millisecond {
		t.Errorf("held %v, want 21ms (three candidates)", got)
	}
	if got := a.lc.Hold(r, a.eps, "resp_1"); got != 0 {
		t.Errorf("a pinned request held %v, want 0", got)
	}
	lc, err := New(Config{Picker: p, Clock: clk, Share: a.share, Health: ejectOne{a.eps[1]}})
	if err != nil {
		t.Fatal(err)
	}
	if got := lc.Hold(r, a.eps, ""); got != 14*time.Millisecond {
		t.Errorf("held %v with y ejected, want 14ms", got)
	}
	want := []string{"2 1 5ms before pick 1", "defer r among 3", "2 1 5ms before pick 1", "defer r among 2"}
	if diff := cmp.Diff(want, p.got); diff != "" {
		t.Errorf("what the policy heard (-want +got):\n%s", diff)
	}

	b := newReplica(t, 2, &replicated{}, clk, ShareConfig{}, "x")
	b.share.SetReplicas(2, 0, 5*time.Millisecond)
	if got := b.lc.Hold(r, b.eps, ""); got != 0 {
		t.Errorf("a policy that does not hold: held %v", got)
	}
}

// ejectOne is a Health that has ejected one endpoint.
type ejectOne struct{ ep *endpoint.Endpoint }

func (h ejectOne) Failed(*endpoint.Endpoint, Failure) bool              { return false }
func (h ejectOne) Succeeded(*endpoint.Endpoint)                         {}
func (h ejectOne) Ejected(ep *endpoint.Endpoint, _ time.Time) bool      { return ep == h.ep }
func (h ejectOne) Backoff(*endpoint.Endpoint, time.Time, time.Duration) {}
func (h ejectOne) BackedOff(*endpoint.Endpoint, time.Time) bool         { return false }
func (h ejectOne) Forget(*endpoint.Endpoint)                            {}
