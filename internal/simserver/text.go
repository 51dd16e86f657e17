package simserver

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
	"github.com/kvroute/kvroute/internal/prefix"
)

// words are the generated tokens: each is exactly prefix.BytesPerToken bytes, so that the
// router's token estimate of a generated text counts its tokens exactly.
var words = [...]string{
	" the", " cat", " sat", " and", " dog", " ran", " far", " sky", " sea", " red", " big", " old",
	" new", " sun", " day", " way", " one", " two", " all", " end", " map", " key", " row", " log",
	" run", " set", " get", " put", " hot", " top", " low", " few", " now", " yet", " you", " our",
	" its", " who", " why", " how", " use", " try", " add", " fix", " job", " art", " air", " ice",
	" oak", " elm", " fog", " bay", " hue", " pen", " ink", " gem", " cup",
	" ask", " say", " see", " let", " may", " own", " far",
}

// textSeed is the base of a request's generated text: the same seed and prompt always give
// the same words.
func textSeed(seed uint64, prompt []byte) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	d := xxhash.New()
	_, _ = d.Write(b[:])
	_, _ = d.Write(prompt)
	return d.Sum64()
}

// token returns the text of output token i of the request whose text seed is base.
func token(base uint64, i int) string {
	return words[prefix.Next(base, uint64(i))%uint64(len(words))]
}

// appendText appends output tokens [from, to) to dst.
func appendText(dst []byte, base uint64, from, to int) []byte {
	for i := from; i < to; i++ {
		dst = append(dst, token(base, i)...)
	}
	return dst
}
