package realengine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Lines as ollama v0.17.4 writes them (OLLAMA_DEBUG=1; runner/ollamarunner/cache.go).
func TestReadSlots(t *testing.T) {
	log := `time=2026-03-01T10:00:00.000Z level=INFO source=server.go:1 msg="starting runner"
time=2026-03-01T10:00:01.000Z level=DEBUG source=cache.go:151 msg="loading cache slot" id=0 cache=0 prompt=1131 used=0 remaining=1131
time=2026-03-01T10:00:02.000Z level=DEBUG source=cache.go:151 msg="loading cache slot" id=1 cache=1139 prompt=1145 used=1004 remaining=141
some runner output without the message prompt=5 used=5
time=2026-03-01T10:00:03.000Z level=DEBUG source=cache.go:151 msg="loading cache slot" id=2 cache=0 prompt=10 used=4 remaining=6
`
	path := filepath.Join(t.TempDir(), "ollama.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readSlots(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []slot{{1131, 0}, {1145, 1004}, {10, 4}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(slot{})); diff != "" {
		t.Errorf("slots (-want +got):\n%s", diff)
	}
	n, used, prompt := hits(got)
	if n != 1 || used != 1008 || prompt != 2286 {
		t.Errorf("hits = %d, used %d, prompt %d: want 1, 1008, 2286 (4 of 10 is under half)", n, used, prompt)
	}
	if _, err := readSlots(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing log should be an error")
	}
}
