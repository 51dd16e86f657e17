package prefix

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func randText(r *rand.Rand, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ.,\n0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func TestBlocks_FullBlocksOnly(t *testing.T) {
	seed := Seed("m", "")
	for _, tc := range []struct {
		textLen, blockTokens, want int
	}{
		{0, 16, 0}, {63, 16, 0}, {64, 16, 1}, {127, 16, 1}, {128, 16, 2}, {64, 0, 1}, {8, 2, 1},
	} {
		got := Blocks(nil, seed, strings.Repeat("x", tc.textLen), tc.blockTokens)
		if len(got) != tc.want {
			t.Errorf("Blocks(len %d, bt %d) = %d blocks, want %d", tc.textLen, tc.blockTokens, len(got), tc.want)
		}
	}
}

func TestBlocks_MatchesChainOfContentKeys(t *testing.T) {
	text := strings.Repeat("0123456789abcdef", 12) // 192 bytes: 3 blocks
	seed := Seed("llama", "salt")
	got := Blocks(nil, seed, text, 16)
	var keys []uint64
	for i := 0; i < 3; i++ {
		keys = append(keys, hashString(text[i*64:(i+1)*64]))
	}
	want := Chain(nil, seed, keys)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Blocks differs from Chain of content keys (-want +got):\n%s", diff)
	}
}

// Property: equal text prefixes give equal leading hashes, and the first differing block and
// every later one differ.
func TestBlocks_PrefixProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	seed := Seed("m", "s")
	for iter := 0; iter < 200; iter++ {
		n := 64 * (1 + r.IntN(20))
		a := randText(r, n)
		k := r.IntN(n / 64)      // block that changes
		pos := k*64 + r.IntN(64) // byte inside block k
		bb := []byte(a)
		bb[pos] ^= 0x01
		b := string(bb)
		ha, hb := Blocks(nil, seed, a, 16), Blocks(nil, seed, b, 16)
		if len(ha) != len(hb) {
			t.Fatalf("lengths differ: %d vs %d", len(ha), len(hb))
		}
		for i := range ha {
			if i < k && ha[i] != hb[i] {
				t.Fatalf("iter %d: block %d changed though only block %d differs", iter, i, k)
			}
			if i >= k && ha[i] == hb[i] {
				t.Fatalf("iter %d: block %d unchanged though block %d differs", iter, i, k)
			}
		}
		// A longer text with the same prefix shares all leading hashes.
		hc := Blocks(nil, seed, a+randText(r, 200), 16)
		if diff := cmp.Diff(ha, hc[:len(ha)]); diff != "" {
			t.Fatalf("extended text changed leading hashes (-want +got):\n%s", diff)
		}
	}
}

// Property: a different model or salt gives disjoint hashes for the same text.
func TestBlocks_SeedDisjoint(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	text := randText(r, 64*200)
	sets := map[string][]uint64{
		"m/a": Blocks(nil, Seed("m", "a"), text, 16),
		"m/b": Blocks(nil, Seed("m", "b"), text, 16),
		"n/a": Blocks(nil, Seed("n", "a"), text, 16),
		"m/":  Blocks(nil, Seed("m", ""), text, 16),
	}
	seen := map[uint64]string{}
	for name, hs := range sets {
		for _, h := range hs {
			if other, ok := seen[h]; ok && other != name {
				t.Fatalf("hash %x shared by %s and %s", h, name, other)
			}
			seen[h] = name
		}
	}
}

func TestBlocks_ReusesDst(t *testing.T) {
	dst := make([]uint64, 0, 4)
	text := strings.Repeat("y", 64*4)
	got := Blocks(dst, 1, text, 16)
	if &got[0] != &dst[:1][0] {
		t.Errorf("Blocks allocated although dst had room")
	}
}

func TestContentKeys_ChainMatchesBlocks(t *testing.T) {
	text := []byte(strings.Repeat("You are a helpful assistant. ", 20))
	for _, bt := range []int{1, 4, 16} {
		keys := ContentKeys(nil, text, bt)
		if got, want := len(keys), len(text)/BlockBytes(bt); got != want {
			t.Fatalf("block tokens %d: %d keys, want %d", bt, got, want)
		}
		seed := Seed("m", "salt")
		if diff := cmp.Diff(BlocksBytes(nil, seed, text, bt), Chain(nil, seed, keys)); diff != "" {
			t.Errorf("block tokens %d: BlocksBytes differs from Chain of ContentKeys (-fused +chained):\n%s", bt, diff)
		}
	}
}

// TestBlockWriter: text written in pieces of every length, short ones gathered and long ones
// hashed where they lie, at block sizes below and above the piece it hashes in place, gives
// the hashes of the text written whole, and partial is always what is past the last full block.
func TestBlockWriter(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	text := []byte(randText(r, 200<<10))
	for _, size := range []int{1, 4, 64, 68, writerDirect + 100, writerWindow + 3} {
		seed := uint64(size)
		want := chainBytes([]uint64{9}, seed, text, size)
		w := newBlockWriter([]uint64{9}, seed, size)
		for pos := 0; pos < len(text); {
			n := min(len(text)-pos, []int{0, 1, 7, size - 1, size, writerDirect - 1, writerDirect, 3 * size, writerWindow}[r.IntN(9)]+r.IntN(3))
			if n == 1 && r.IntN(2) == 0 {
				w.writeByte(text[pos])
			} else {
				w.write(text[pos : pos+n])
			}
			pos += n
			if got := string(w.partial()); got != string(text[pos-pos%size:pos]) {
				t.Fatalf("size %d, %d bytes written: partial %q, want %q", size, pos, got, text[pos-pos%size:pos])
			}
		}
		if got := w.blocks(); !slices.Equal(got, want) {
			t.Errorf("size %d: %d hashes, want %d; first difference at %d", size, len(got), len(want), firstDiff(got, want))
		}
		w.release()
	}
}
