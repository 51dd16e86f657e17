package peer

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/metrics"
	"github.com/kvroute/kvroute/internal/route"
)

// TestDropReasonsListed: every reason the lifecycle drops an event for is among the reasons
// kvroute_peer_dropped_total is made with at 0 (and documented with), so that a new one is not
// a series that appears only when it first happens.
func TestDropReasonsListed(t *testing.T) {
	listed := metrics.DropReasons()
	for _, r := range route.DropReasons() {
		if !slices.Contains(listed, r) {
			t.Errorf("route drops events as %q, which metrics.DropReasons lacks", r)
		}
	}
}
