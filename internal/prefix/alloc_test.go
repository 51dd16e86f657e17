package prefix

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// hugePrompt returns a prompt of about size bytes of the given kind: "words" is what a client
// sending one word again and again makes (nothing to collapse, a trailing space), "prose" has
// paragraph breaks and double spaces to collapse, "crlf" has Windows line endings, "unicode"
// is Japanese in NFC with ideographic spaces, and "nfd" has decomposed accents (not NFC).
func hugePrompt(kind string, size int) []byte {
	unit := map[string]string{
		"words":   "word ",
		"prose":   "The router reads each request once.\n\nIt hashes  its blocks\tthen picks. ",
		"crlf":    "a line of a file sent from Windows,\r\nwith  its line ends\r\n\r\n",
		"unicode": "日本語の長い文書です。\u3000\u3000次の段落、\n\n続きます。",
		"nfd":     "cafe\u0301 au lait, de\u0301ja\u0300  vu.\n\n",
	}[kind]
	return []byte(strings.Repeat(unit, size/len(unit)+1)[:size-size%len(unit)])
}

// allocated returns the bytes the heap gave out while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHugePromptAllocation: keying a prompt allocates a small fraction of its size: its block
// hashes (an eighth of it at 16-token blocks), a copy of them when Chains remembers it, and its
// marks. Collapsing the whole text into a growing buffer first cost about 6 times its size
// (15 MiB: 92 MB), which a few concurrent huge prompts turned into hundreds of MB of RSS. Text
// that must be put in NFC first is copied once.
func TestHugePromptAllocation(t *testing.T) {
	if testing.Short() {
		t.Skip("hashes 48 MiB of text")
	}
	seed := Seed("m", "salt")
	for _, c := range []struct {
		kind  string
		size  int
		limit float64 // bytes allocated per byte of prompt, at most
	}{
		{"words", 1 << 20, 0.4}, {"words", 15 << 20, 0.4},
		{"prose", 1 << 20, 0.4}, {"crlf", 1 << 20, 0.4}, {"unicode", 1 << 20, 0.4},
		{"nfd", 1 << 20, 1.5},
	} {
		text := hugePrompt(c.kind, c.size)
		for _, path := range []string{"Chains.Blocks", "NormalizedBlocks"} {
			t.Run(fmt.Sprintf("%s/%s/%dMiB", path, c.kind, c.size>>20), func(t *testing.T) {
				var n int
				got := allocated(func() {
					if path == "Chains.Blocks" {
						n = len(NewChains(1<<22).Blocks(nil, seed, text, DefaultBlockTokens, nil))
					} else {
						n = len(NormalizedBlocks(nil, seed, text, DefaultBlockTokens, nil))
					}
				})
				if n < len(text)/BlockBytes(DefaultBlockTokens)/2 {
					t.Fatalf("%d blocks of %d bytes of text", n, len(text))
				}
				ratio := float64(got) / float64(len(text))
				t.Logf("%d bytes of prompt: %d bytes allocated, %.3f a byte", len(text), got, ratio)
				if ratio > c.limit {
					t.Errorf("%d bytes allocated for %d bytes of prompt: %.2f a byte, want at most %.2f", got, len(text), ratio, c.limit)
				}
			})
		}
	}
}

// BenchmarkHugePrompt keys a 1 MiB and a 15 MiB prompt of each kind the way the router does
// (a Chains that has seen nothing like it, and NormalizedBlocks), "before" with the code as it
// was (keysold_test.go) and "after" with the code as it is, in the same run; alloc/byte is the
// bytes allocated per byte of prompt.
func BenchmarkHugePrompt(b *testing.B) {
	seed := Seed("m", "salt")
	for _, size := range []int{1 << 20, 15 << 20} {
		for _, kind := range []string{"words", "prose", "nfd"} {
			text := hugePrompt(kind, size)
			for _, impl := range []struct {
				name   string
				chains func(*Chains, []uint64) []uint64
				blocks func([]uint64) []uint64
			}{
				{"before",
					func(c *Chains, dst []uint64) []uint64 { return c.blocksOld(dst, seed, text, DefaultBlockTokens, nil) },
					func(dst []uint64) []uint64 { return normalizedBlocksOld(dst, seed, text, DefaultBlockTokens, nil) }},
				{"after",
					func(c *Chains, dst []uint64) []uint64 { return c.Blocks(dst, seed, text, DefaultBlockTokens, nil) },
					func(dst []uint64) []uint64 { return NormalizedBlocks(dst, seed, text, DefaultBlockTokens, nil) }},
			} {
				name := fmt.Sprintf("%s/%dMiB/%s", kind, size>>20, impl.name)
				b.Run("Chains/"+name, func(b *testing.B) {
					b.SetBytes(int64(len(text)))
					b.ReportAllocs()
					var ms0, ms1 runtime.MemStats
					runtime.ReadMemStats(&ms0)
					for b.Loop() {
						impl.chains(NewChains(1<<22), nil)
					}
					runtime.ReadMemStats(&ms1)
					b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(b.N)/float64(len(text)), "alloc/byte")
				})
				b.Run("NormalizedBlocks/"+name, func(b *testing.B) {
					b.SetBytes(int64(len(text)))
					b.ReportAllocs()
					var ms0, ms1 runtime.MemStats
					runtime.ReadMemStats(&ms0)
					for b.Loop() {
						impl.blocks(nil)
					}
					runtime.ReadMemStats(&ms1)
					b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(b.N)/float64(len(text)), "alloc/byte")
				})
			}
		}
	}
}
