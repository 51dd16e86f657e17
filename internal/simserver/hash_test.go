package simserver

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/prefix"
)

func TestTokenIDs(t *testing.T) {
	id := func(s string) int64 { return int64(xxhash.Sum64String(s) % Vocab) } // by hand
	tests := []struct {
		name      string
		text      string
		blockSize int
		want      []int64
	}{
		{"empty", "", 2, nil},
		{"a partial block has no ids", "abcdefg", 2, nil},
		{"one block", "abcdefgh", 2, []int64{id("abcd"), id("efgh")}},
		{"the partial tail is left out", "abcdefghijkl", 2, []int64{id("abcd"), id("efgh")}},
		{"two blocks", "abcdefghijklmnop", 2, []int64{id("abcd"), id("efgh"), id("ijkl"), id("mnop")}},
		{"a block of one token", "abcdefghij", 1, []int64{id("abcd"), id("efgh")}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, TokenIDs(nil, []byte(tt.text), tt.blockSize)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

// TestTokenIDsFollowBlocks checks the properties consumers rely on: block_size ids for each
// block BlockKeys cuts, the same ids for the same text wherever it stands, ids in the
// vocabulary, and distinct tokens mostly distinct ids.
func TestTokenIDsFollowBlocks(t *testing.T) {
	const bs = 16
	size := prefix.BlockBytes(bs)
	a, b := []byte(text("common", 300)), []byte(text("common", 200)+text("differs", 100))
	ia, ib := TokenIDs(nil, a, bs), TokenIDs(nil, b, bs)
	if got, want := len(ia), len(prefix.ContentKeys(nil, a, bs))*bs; got != want {
		t.Errorf("%d ids for %d blocks of %d", got, want/bs, bs)
	}
	// Blocks with equal keys have equal ids; the shared 200 tokens are 12 full blocks.
	ka, kb := prefix.ContentKeys(nil, a, bs), prefix.ContentKeys(nil, b, bs)
	for i := range min(len(ka), len(kb)) {
		same := ka[i] == kb[i]
		if eq := cmp.Equal(ia[i*bs:(i+1)*bs], ib[i*bs:(i+1)*bs]); eq != same {
			t.Errorf("block %d: equal keys %v but equal ids %v", i, same, eq)
		}
		if same != (i < 12) {
			t.Errorf("block %d: equal keys %v, want %v", i, same, i < 12)
		}
	}
	// A block's ids do not depend on what comes before it.
	for i := range len(ka) {
		if diff := cmp.Diff(ia[i*bs:(i+1)*bs], TokenIDs(nil, a[i*size:(i+1)*size], bs)); diff != "" {
			t.Errorf("block %d alone (-in text +alone):\n%s", i, diff)
		}
	}
	// Appending keeps dst.
	if got := TokenIDs([]int64{-7}, a[:size], bs); len(got) != bs+1 || got[0] != -7 {
		t.Errorf("TokenIDs with dst = %v", got)
	}
	distinct := map[int64]bool{}
	tokens := map[string]bool{}
	for i, v := range ia {
		if v < 0 || v >= Vocab {
			t.Fatalf("id %d = %d: outside [0, %d)", i, v, Vocab)
		}
		distinct[v] = true
		tokens[string(a[i*4:i*4+4])] = true
	}
	if len(distinct) < len(tokens)-1 {
		t.Errorf("%d distinct tokens got %d distinct ids", len(tokens), len(distinct))
	}
}

func BenchmarkTokenIDs(b *testing.B) {
	for _, tokens := range []int{2000, 32000} {
		src := []byte(text("bench", tokens))
		b.Run(fmt.Sprint("tokens=", tokens), func(b *testing.B) {
			dst := make([]int64, 0, tokens)
			b.SetBytes(int64(len(src)))
			b.ReportAllocs()
			for b.Loop() {
				dst = TokenIDs(dst[:0], src, 16)
			}
		})
	}
}
