package simserver

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// POST /admin/faults with an unknown field answers with every field it takes: those Faults
// encodes to, the later ones (no_prefix_cache) included.
func TestAdminFaultsListsEveryField(t *testing.T) {
	f := startFleet(t, Options{Profile: "instant", Admin: true}, 1)
	code, body := setFaults(t, f.URLs()[0], `{"nope":1}`)
	b, err := json.Marshal(Faults{})
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	if len(fields) < 10 {
		t.Fatalf("Faults encodes to %d fields: %s", len(fields), b)
	}
	_, list, _ := strings.Cut(body, "(fields: ")
	list, _, _ = strings.Cut(list, ")")
	listed := map[string]bool{}
	for _, name := range strings.Split(list, ", ") {
		listed[name] = true
	}
	for name := range fields {
		if !listed[name] {
			t.Errorf("POST {\"nope\":1} = %d %s: the list of fields lacks %s", code, body, name)
		}
	}
	if code != http.StatusBadRequest {
		t.Errorf("POST {\"nope\":1} = %d %s, want 400", code, body)
	}
}
