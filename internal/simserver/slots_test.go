package simserver

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/openai"
)

// On a profile whose KV cache is sequence slots (ollama-tiny-cpu: 4 slots of 378 blocks), a
// request must fit one slot, not the whole cache: one that does not is a 400 naming max_tokens,
// never a request the engine then refuses.
func TestSlotProfileRequestTooLongForSlot(t *testing.T) {
	f := startFleet(t, Options{Profile: "ollama-tiny-cpu"}, 1)
	// About 7,500 tokens of 4 bytes: more than a slot's 6,048, less than the cache's 24,192.
	resp, _ := post(t, f.URLs()[0], "/v1/chat/completions", chatBody(DefaultModel, strings.Repeat("word ", 6000), false, 4, ""))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error openai.Error }
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != "max_tokens" ||
		!strings.Contains(e.Error.Message, "at most 378") {
		t.Errorf("status %d, body %s (%v): want 400 on max_tokens saying at most 378 blocks", resp.StatusCode, b, err)
	}
}
