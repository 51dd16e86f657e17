package prefix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// Rule is an optional regex rewrite applied to the prompt before hashing, for volatile text
// that would otherwise break an otherwise equal prefix (a timestamp in a system prompt, a
// request id). Pattern is Go RE2 syntax; Replace may use $1-style group references.
type Rule struct {
	Pattern string `json:"pattern"`
	Replace string `json:"replace"`
}

// NormalizeOptions say which normalisations to skip and which rewrites to add. The zero value is
// the default: CRLF and CR become LF, text is put in Unicode NFC, every run of whitespace becomes
// one space (or one newline when the run holds a newline), and leading and trailing whitespace
// is trimmed; no regex rewrites.
type NormalizeOptions struct {
	KeepLineEndings bool   // do not turn CRLF and CR into LF
	KeepUnicodeForm bool   // do not put text in NFC
	KeepWhitespace  bool   // do not collapse runs of whitespace
	KeepEdges       bool   // do not trim leading and trailing whitespace
	Rules           []Rule // applied in order, after the other steps
}

// Normalizer turns prompt text into the canonical text that is chunked and hashed, so that
// prompts differing only in invisible ways share their routing keys. A nil *Normalizer applies
// the defaults. It is safe for concurrent use.
type Normalizer struct {
	opts  NormalizeOptions
	rules []compiledRule
}

type compiledRule struct {
	re      *regexp.Regexp
	replace string
}

// NewNormalizer validates the options and builds a Normalizer. Every bad rule is reported, at
// once, with its index and the fix.
func NewNormalizer(opts NormalizeOptions) (*Normalizer, error) {
	n := &Normalizer{opts: opts}
	var errs []error
	for i, r := range opts.Rules {
		if r.Pattern == "" {
			errs = append(errs, fmt.Errorf("normalize rule %d: pattern is empty (give a regular expression such as `\\d{4}-\\d{2}-\\d{2}`)", i))
			continue
		}
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			errs = append(errs, fmt.Errorf("normalize rule %d: pattern %q is not a valid RE2 regular expression: %w", i, r.Pattern, err))
			continue
		}
		if re.MatchString("") {
			errs = append(errs, fmt.Errorf("normalize rule %d: pattern %q matches the empty string (it would rewrite between every character; anchor it or use + instead of *)", i, r.Pattern))
			continue
		}
		n.rules = append(n.rules, compiledRule{re: re, replace: r.Replace})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return n, nil
}

// Normalize returns the canonical form of s.
func (n *Normalizer) Normalize(s string) string {
	var o NormalizeOptions
	var rules []compiledRule
	if n != nil {
		o, rules = n.opts, n.rules
	}
	if !o.KeepLineEndings && strings.IndexByte(s, '\r') >= 0 {
		s = strings.ReplaceAll(s, "\r\n", "\n")
		s = strings.ReplaceAll(s, "\r", "\n")
	}
	if !o.KeepUnicodeForm && !isASCII(stringBytes(s)) && !norm.NFC.IsNormalString(s) {
		s = norm.NFC.String(s)
	}
	if !o.KeepWhitespace {
		s = collapseSpace(s)
	}
	if !o.KeepEdges {
		s = strings.TrimSpace(s)
	}
	for _, r := range rules {
		s = r.re.ReplaceAllString(s, r.replace)
	}
	return s
}

// NormalizeBytes is Normalize for text held in a byte slice. When normalisation would change
// nothing but the edges, which is the common case for machine-built prompts, it returns a
// sub-slice of b and allocates nothing; otherwise it returns new bytes, which may be a string's
// memory: the result is read-only either way. Its bytes equal Normalize(string(b)).
func (n *Normalizer) NormalizeBytes(b []byte) []byte {
	var o NormalizeOptions
	rules := 0
	if n != nil {
		o, rules = n.opts, len(n.rules)
	}
	if rules == 0 &&
		(o.KeepLineEndings || bytes.IndexByte(b, '\r') < 0) &&
		(o.KeepUnicodeForm || isASCII(b) || norm.NFC.IsNormal(b)) &&
		(o.KeepWhitespace || !needsCollapse(b)) {
		if o.KeepEdges {
			return b
		}
		return bytes.TrimSpace(b)
	}
	// b is only read (a string view, not a copy), and the result is read-only: no copy of a
	// long prompt on either side.
	return stringBytes(n.Normalize(unsafe.String(unsafe.SliceData(b), len(b))))
}

// isASCII reports whether b holds only ASCII bytes.
func isASCII(b []byte) bool {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		if word(b, i)&highs != 0 {
			return false
		}
	}
	for ; i < len(b); i++ {
		if b[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// stringBytes returns the bytes of s without copying them, for the read-only scans above and
// below (a prompt can be megabytes: a copy per check would cost more than the check).
func stringBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// collapseSpace turns every run of whitespace into one space, or one newline when the run holds
// a newline (so that line structure, which models do see, survives). It returns s itself when
// nothing changes, which is the common case for machine-built prompts.
func collapseSpace(s string) string {
	if !needsCollapse(stringBytes(s)) {
		return s
	}
	b := appendCollapsed(make([]byte, 0, len(s)), s)
	// b is new and never written again: it can be the string's memory.
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// appendCollapsed appends to dst what collapseSpace(s) returns. Only the runs that change (two
// or more characters, or a tab, a carriage return, a Unicode space...) cut the text: a single
// space or newline stays in the segment being copied, and ASCII that changes nothing is skipped
// eight bytes at a time, so prose with a paragraph break here and there is copied in a few long
// segments (a byte-at-a-time copy that cut at every space cost about 9 ns a byte).
func appendCollapsed(out []byte, s string) []byte {
	b := stringBytes(s)
	start := 0 // start of the pending segment, copied as it is
	for i := 0; i < len(s); {
		// Eight ASCII bytes at a time, as long as they change nothing: no tab, carriage return,
		// vertical tab or form feed, and no two spaces or newlines side by side (within the
		// word or across its edge). Then one character or one run at a time.
		prevSpace := false // the byte before i is a space or a newline
		for ; i+8 <= len(b); i += 8 {
			x := word(b, i)
			// low marks the bytes up to ' ' (whitespace is among them), and may mark a byte
			// right after a marked one that is not (a borrow): a false mark only sends the
			// word to the slow path below. One mark next to another, or after a space that
			// ended the word before, may be a run to collapse.
			low := (x - 0x21*ones) &^ x & highs
			if x&highs != 0 || low&(low<<8) != 0 || prevSpace && low&0x80 != 0 {
				break
			}
			// A byte below ' ' (most often a newline) must be a newline to stay.
			if (x-0x20*ones)&^x&highs != 0 && low&^(eqBytes(x, ' ')|eqBytes(x, '\n')) != 0 {
				break
			}
			prevSpace = low>>63 != 0
		}
		if prevSpace {
			i-- // a run may start with the last byte taken
		}
		if i == len(s) {
			break
		}
		if c := s[i]; c > ' ' && c < utf8.RuneSelf {
			i++ // printable ASCII (all ASCII whitespace is <= ' ')
			continue
		}
		size, space := spaceAt(s, i)
		if !space {
			i += size
			continue
		}
		run, newline := i, false
		for i < len(s) {
			size, space = spaceAt(s, i)
			if !space {
				break
			}
			newline = newline || s[i] == '\n'
			i += size
		}
		if i-run == 1 && (s[run] == ' ' || s[run] == '\n') {
			continue // one space or one newline: unchanged
		}
		out = append(out, s[start:run]...)
		if newline {
			out = append(out, '\n')
		} else {
			out = append(out, ' ')
		}
		start = i
	}
	return append(out, s[start:]...)
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// word returns b[i:i+8] as a little-endian uint64: one load.
func word(b []byte, i int) uint64 { return binary.LittleEndian.Uint64(b[i:]) }

// eqBytes returns highs's bit set in every byte of x equal to c; x must be ASCII (no byte
// above 0x7f), so that the additions carry nothing from one byte to the next.
func eqBytes(x uint64, c byte) uint64 {
	t := x ^ uint64(c)*ones
	return ^(t + 0x7f*ones) & highs
}

// spaceAt returns the length of the character at s[i] and whether it is whitespace.
func spaceAt(s string, i int) (int, bool) {
	c := s[i]
	if c < utf8.RuneSelf {
		return 1, c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	return size, unicode.IsSpace(r)
}

// needsCollapse reports whether b holds whitespace other than single spaces and single
// newlines. Prose has a space every few bytes, so ASCII text is checked eight bytes at a time
// whatever it holds: which bytes are spaces or newlines, whether two of them touch (within the
// word or across its edge), and whether any is a tab, vertical tab, form feed or carriage
// return; only a word with a non-ASCII byte is checked a character at a time.
func needsCollapse(b []byte) bool {
	prevSpace := false // the byte before i is a space or a newline
	for i := 0; i < len(b); {
		for ; i+8 <= len(b); i += 8 {
			x := word(b, i)
			if x&highs != 0 {
				break
			}
			if (x-0x21*ones)&^x&highs == 0 { // no byte below '!': no whitespace
				prevSpace = false
				continue
			}
			sp := eqBytes(x, ' ') | eqBytes(x, '\n')
			// Bytes from 9 (tab) to 13 (carriage return) other than 10 (newline).
			ctl := (x + (0x80-9)*ones) &^ (x + (0x80-14)*ones) & highs &^ sp
			if ctl != 0 || sp&(sp<<8) != 0 || prevSpace && sp&0x80 != 0 {
				return true
			}
			prevSpace = sp>>63 != 0
		}
		if i == len(b) {
			break
		}
		c := b[i]
		if c >= utf8.RuneSelf {
			// Unicode spaces (NBSP, ideographic space, ...) are rare: take the slow path.
			r, size := utf8.DecodeRune(b[i:])
			if unicode.IsSpace(r) {
				return true
			}
			prevSpace = false
			i += size
			continue
		}
		switch c {
		case ' ', '\n':
			if prevSpace {
				return true
			}
			prevSpace = true
		case '\t', '\v', '\f', '\r':
			return true
		default:
			prevSpace = false
		}
		i++
	}
	return false
}
