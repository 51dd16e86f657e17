package scrape

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestStatusJSONNoZeroTimes: /debug/endpoints shows no last_check or last_scrape for an
// endpoint never checked or scraped (it showed 0001-01-01T00:00:00Z), and shows them once
// there is one.
func TestStatusJSONNoZeroTimes(t *testing.T) {
	b, err := json.Marshal(Status{})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "0001-01-01") || strings.Contains(s, "last_scrape") || strings.Contains(s, "last_check") {
		t.Errorf("never checked nor scraped: %s", s)
	}
	at := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	b, err = json.Marshal(Status{LastCheck: at, LastScrape: at})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, `"last_check":"2026-12-07T15:00:00Z"`) || !strings.Contains(s, `"last_scrape":"2026-12-07T15:00:00Z"`) {
		t.Errorf("checked and scraped: %s", s)
	}
}
