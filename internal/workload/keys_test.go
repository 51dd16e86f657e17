package workload

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestKeysCount(t *testing.T) {
	r := &Request{Blocks: []uint64{1, 2, 3}, BlockTokens: 512, PromptTokens: 1100}
	tests := []struct{ blockSize, want int }{
		{16, 68}, {512, 2}, {100, 11}, {1100, 1}, {1101, 0}, {0, 0}, {-4, 0},
	}
	for _, tt := range tests {
		if got := len(Keys(nil, r, tt.blockSize)); got != tt.want {
			t.Errorf("len(Keys(blockSize=%d)) = %d, want %d", tt.blockSize, got, tt.want)
		}
	}
	short := &Request{Blocks: []uint64{1}, BlockTokens: 16, PromptTokens: 100}
	if got := len(Keys(nil, short, 16)); got != 1 {
		t.Errorf("blocks covering 16 of 100 tokens: %d keys, want 1", got)
	}
}

func TestKeysByHand(t *testing.T) {
	r := &Request{Blocks: []uint64{10, 20}, BlockTokens: 32, PromptTokens: 64}
	want := []uint64{blockKey(10, 16), blockKey(10, 32), blockKey(20, 16), blockKey(20, 32)}
	if diff := cmp.Diff(want, Keys(nil, r, 16)); diff != "" {
		t.Errorf("Keys (-want +got):\n%s", diff)
	}
	// An engine block straddling two workload blocks is keyed by the one holding its last token.
	want = []uint64{blockKey(10, 24), blockKey(20, 16)}
	if diff := cmp.Diff(want, Keys(nil, r, 24)); diff != "" {
		t.Errorf("Keys straddling (-want +got):\n%s", diff)
	}
	dst := []uint64{99}
	if got := Keys(dst, r, 64); len(got) != 2 || got[0] != 99 {
		t.Errorf("Keys must append to dst, got %v", got)
	}
}

func TestKeysSharedPrefix(t *testing.T) {
	// a and b share their first two workload blocks; b's third differs.
	a := &Request{Blocks: []uint64{1, 2, 3}, BlockTokens: 512, PromptTokens: 1536}
	b := &Request{Blocks: []uint64{1, 2, 4}, BlockTokens: 512, PromptTokens: 1400}
	for _, bs := range []int{16, 64, 512, 100} {
		ka, kb := Keys(nil, a, bs), Keys(nil, b, bs)
		shared := 1024 / bs // engine blocks ending inside the shared 1024 tokens
		for j := range kb {
			if same := ka[j] == kb[j]; same != (j < shared) {
				t.Errorf("blockSize %d: block %d equal=%v, want %v", bs, j, same, j < shared)
			}
		}
		seen := map[uint64]bool{}
		for j, k := range ka {
			if seen[k] {
				t.Errorf("blockSize %d: key of block %d repeats an earlier key", bs, j)
			}
			seen[k] = true
		}
	}
}
