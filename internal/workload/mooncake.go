package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// MooncakeBlockTokens is the number of tokens each hash_ids block of the Mooncake trace stands for.
const MooncakeBlockTokens = 512

// maxTokens bounds a prompt or output length, far above any context window.
const maxTokens = 1 << 30

// maxLineBytes bounds one trace line; the longest real line is a few kilobytes.
const maxLineBytes = 64 << 20

// ErrNoRequests is what ReadMooncake and LoadMooncake return, wrapped, for a trace without a
// request (empty, or blank lines only): no verb can do anything with one, and each would fail
// on it later with a message that does not name the trace.
var ErrNoRequests = errors.New("no requests")

// ErrBadTrace is what ReadMooncake and LoadMooncake errors are (errors.Is) when the trace
// itself is at fault rather than the machine: a path that does not open, a line that does not
// parse or check, a line too long, no request at all (ErrNoRequests), a file in another format
// or encoding, timestamps that are not milliseconds, a damaged gzip stream. The CLI exits 2 on
// it, as on a bad flag; a read that fails midway is not one.
var ErrBadTrace = errors.New("bad trace")

// badTrace marks err as ErrBadTrace without changing its message.
type badTrace struct{ error }

func (e badTrace) Unwrap() error        { return e.error }
func (e badTrace) Is(target error) bool { return target == ErrBadTrace }

// mooncakeFormat says what a Mooncake trace line is, for errors that must say what was expected.
const mooncakeFormat = "Mooncake JSON Lines, one object a line with timestamp, input_length, output_length and hash_ids"

// mooncakeLine is one line of the trace. Pointers tell a missing field from a zero one.
type mooncakeLine struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// ReadMooncake reads a Mooncake JSONL trace (one object a line with timestamp in milliseconds,
// input_length, output_length and hash_ids of 512-token blocks). Blank lines are skipped and
// unknown fields ignored. The first bad line is an error of the form "line N: field X: problem";
// a trace without a request is an error that wraps ErrNoRequests.
// Requests keep the file's order; IDs are 0, 1, ... in that order. Arrivals are measured from
// the earliest timestamp, so that a trace stamped in Unix milliseconds replays from its first
// request rather than from 1970.
//
// The input may be gzip-compressed (told by its first bytes, not by a name) and may start with
// a UTF-8 byte order mark. A file in another encoding (UTF-16), another compression or another
// trace format (a CSV, ShareGPT, OpenAI request bodies) is refused with an error that says what
// it is and how to convert it (kvroute trace convert, ConvertTrace). So are timestamps that
// are not milliseconds by the look of them: fractions of a millisecond, Unix time in seconds, or
// more prompt tokens a second than any fleet prefills (timeStats.check).
//
// Memory: one pass, the requests and their block ids held once, the ids of many requests
// packed into shared arrays of exactly their length.
func ReadMooncake(r io.Reader) ([]Request, error) {
	in, err := openText(r)
	if err != nil {
		return nil, err
	}
	// The head of the input, kept to name another format if the first line is not a trace line.
	head, _ := in.Peek(sniffBytes)
	head = bytes.Clone(head)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var (
		reqs   []Request
		stamps []float64 // milliseconds, as in the file
		times  timeStats
		ids    idArena
		l      mooncakeRecord
	)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := l.read(b); err != nil {
			if rerr := sc.Err(); rerr != nil {
				// A read that failed (a gzip stream cut short) left this line cut: say why.
				return nil, fmt.Errorf("read trace after line %d: %w", line-1, rerr)
			}
			if len(reqs) == 0 {
				if len(bytes.TrimSpace(head)) == 0 {
					// The input starts with more white space than head holds: this line,
					// the first that is not blank, is what tells another format.
					head = b
				}
				if ferr := otherFormat(head); ferr != nil {
					return nil, badTrace{ferr}
				}
			}
			return nil, badTrace{fmt.Errorf("line %d: %w", line, err)}
		}
		reqs = append(reqs, Request{
			ID:           len(reqs),
			Blocks:       ids.keep(l.ids),
			BlockTokens:  MooncakeBlockTokens,
			PromptTokens: l.input,
			OutputTokens: l.output,
		})
		stamps = append(stamps, l.timestamp)
		times.add(line, l.timestamp, l.input)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, badTrace{fmt.Errorf("line %d: longer than %d bytes: %w", line+1, maxLineBytes, err)}
		}
		return nil, fmt.Errorf("read trace after line %d: %w", line, err)
	}
	if len(reqs) == 0 {
		if line == 0 {
			return nil, badTrace{fmt.Errorf("%w: the trace is empty (want %s)", ErrNoRequests, mooncakeFormat)}
		}
		return nil, badTrace{fmt.Errorf("%w: nothing but %d blank line(s) (want %s)", ErrNoRequests, line, mooncakeFormat)}
	}
	if err := times.check(); err != nil {
		return nil, badTrace{err}
	}
	// Subtract in milliseconds: 1.7e12 ms in nanoseconds is past float64's exact integers.
	first := slices.Min(stamps)
	for i := range reqs {
		reqs[i].Arrival = time.Duration(math.Round((stamps[i] - first) * float64(time.Millisecond)))
	}
	return reqs, nil
}

// LoadMooncake reads the Mooncake JSONL trace at path (see ReadMooncake).
func LoadMooncake(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, badTrace{fmt.Errorf("open trace: %w", err)}
	}
	defer f.Close()
	// A directory opens, and fails the first read as "read trace after line 0": say what it is.
	if fi, err := f.Stat(); err == nil && fi.IsDir() {
		return nil, badTrace{fmt.Errorf("open trace: %s is a directory: give the path of the trace file in it", path)}
	}
	reqs, err := ReadMooncake(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// idArena holds the block ids of many requests in shared arrays, each request's ids a slice of
// exactly their length (its capacity too, so that an append elsewhere copies rather than
// overwrites a neighbour). Decoding each line into a slice of its own left up to half of it
// unused, plus the rounding of each allocation.
type idArena struct{ buf []uint64 }

// The shared arrays start at 8 KiB, for a small trace, and double up to 512 KiB, thousands of
// lines of a real trace.
const (
	idArenaFirst = 1 << 10
	idArenaMax   = 64 << 10
)

// keep copies ids into the arena and returns the copy.
func (a *idArena) keep(ids []uint64) []uint64 {
	if len(ids) > cap(a.buf)-len(a.buf) {
		size := min(max(2*cap(a.buf), idArenaFirst), idArenaMax)
		a.buf = make([]uint64, 0, max(size, len(ids)))
	}
	n := len(a.buf)
	a.buf = append(a.buf, ids...)
	return a.buf[n:len(a.buf):len(a.buf)]
}

// mooncakeRecord is one parsed trace line, its fields checked for presence and type only.
type mooncakeRecord struct {
	timestamp     float64 // in the trace's own unit
	input, output int
	ids           []uint64
}

// parse reads one non-blank line into l: every field present and of its type, the timestamp
// a number >= 0 (its range depends on its unit, which the caller knows). l.ids may be the
// memory of the previous line's ids, overwritten.
func (l *mooncakeRecord) parse(b []byte) error {
	if l.parseUsual(b) {
		return nil
	}
	return l.parseJSON(b)
}

// parseJSON is parse with encoding/json: every line that parseUsual does not read, and the
// errors.
func (l *mooncakeRecord) parseJSON(b []byte) error {
	var line mooncakeLine
	if err := json.Unmarshal(b, &line); err != nil {
		if len(b) > 0 && b[0] == '#' || bytes.HasPrefix(b, []byte("//")) {
			// A comment-only file reads as an empty trace to a person; say why it is not one.
			return fmt.Errorf("a comment, which JSON Lines do not have (want %s)", mooncakeFormat)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			if te.Field == "" {
				return fmt.Errorf("want a JSON object, got JSON %s (want %s)", te.Value, mooncakeFormat)
			}
			return fmt.Errorf("field %s: want %s, got JSON %s", te.Field, jsonWant(te.Type), te.Value)
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return fmt.Errorf("invalid JSON object: %v (at byte %d)", se, se.Offset)
		}
		return fmt.Errorf("invalid JSON object: %w", err)
	}
	switch {
	case line.Timestamp == nil:
		return errors.New("field timestamp: missing (milliseconds; arrivals are measured from the earliest)")
	case line.InputLength == nil:
		return errors.New("field input_length: missing (prompt tokens)")
	case line.OutputLength == nil:
		return errors.New("field output_length: missing (generated tokens)")
	case line.HashIDs == nil:
		// "hash_ids": null sets the pointer to nil.
		return errors.New("field hash_ids: missing (the prompt's 512-token block ids)")
	}
	l.timestamp, l.input, l.output, l.ids = *line.Timestamp, *line.InputLength, *line.OutputLength, *line.HashIDs
	if math.IsNaN(l.timestamp) || l.timestamp < 0 {
		return fmt.Errorf("field timestamp: %v out of range (want milliseconds >= 0)", l.timestamp)
	}
	return nil
}

// read parses line b into l and checks it: its blocks against its length, its timestamp as
// milliseconds.
func (l *mooncakeRecord) read(b []byte) error {
	if err := l.parse(b); err != nil {
		return err
	}
	if err := l.check(MooncakeBlockTokens); err != nil {
		return err
	}
	return checkMillis(l.timestamp)
}

// parseUsual reads a line of the usual form, the four fields once each, in any order, without
// null, escapes, negative or fractional lengths or other fields, into l, reusing l.ids; it
// returns false on anything else, which encoding/json then reads and words the errors of.
// encoding/json cost a dozen allocations a line, the ids' slice grown two or three times, and
// two thirds of the reader's time (FuzzParseUsual checks that both read the same).
func (l *mooncakeRecord) parseUsual(b []byte) bool {
	p := usualParser{b: b}
	ids := l.ids[:0]
	var seen [4]bool
	if !p.eat('{') {
		return false
	}
	for {
		key, ok := p.key()
		if !ok {
			return false
		}
		var i int
		switch string(key) {
		case "timestamp":
			i = 0
			l.timestamp, ok = p.number()
		case "input_length":
			i = 1
			var v uint64
			v, ok = p.uint(maxTokens * 2)
			l.input = int(v)
		case "output_length":
			i = 2
			var v uint64
			v, ok = p.uint(maxTokens * 2)
			l.output = int(v)
		case "hash_ids":
			i = 3
			ids, ok = p.uints(ids)
		default:
			return false
		}
		if !ok || seen[i] {
			return false
		}
		seen[i] = true
		if p.eat('}') {
			break
		}
		if !p.eat(',') {
			return false
		}
	}
	p.ws()
	if p.i != len(p.b) || seen != [4]bool{true, true, true, true} {
		return false
	}
	l.ids = ids
	return true
}

// usualParser reads the JSON of parseUsual.
type usualParser struct {
	b []byte
	i int
}

func (p *usualParser) ws() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// eat skips white space and c; false if the next byte is not c.
func (p *usualParser) eat(c byte) bool {
	p.ws()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads a name without escapes and its colon.
func (p *usualParser) key() ([]byte, bool) {
	if !p.eat('"') {
		return nil, false
	}
	start := p.i
	for p.i < len(p.b) && p.b[p.i] != '"' && p.b[p.i] != '\\' {
		p.i++
	}
	if p.i == len(p.b) || p.b[p.i] != '"' {
		return nil, false
	}
	key := p.b[start:p.i]
	p.i++
	return key, p.eat(':')
}

// digits reads a JSON integer without sign: 0, or digits without a leading 0.
func (p *usualParser) digits() ([]byte, bool) {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	d := p.b[start:p.i]
	return d, len(d) > 0 && (d[0] != '0' || len(d) == 1)
}

// uint reads a whole number from 0 to limit, not followed by a fraction or an exponent.
func (p *usualParser) uint(limit uint64) (uint64, bool) {
	p.ws()
	d, ok := p.digits()
	if !ok || len(d) > 19 || p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return 0, false
	}
	var v uint64
	for _, c := range d {
		v = v*10 + uint64(c-'0')
	}
	return v, v <= limit
}

// uints appends the numbers of an array of whole numbers (at most 19 digits each) to dst.
func (p *usualParser) uints(dst []uint64) ([]uint64, bool) {
	if !p.eat('[') {
		return dst, false
	}
	if p.eat(']') {
		return dst, true
	}
	for {
		v, ok := p.uint(math.MaxUint64)
		if !ok {
			return dst, false
		}
		dst = append(dst, v)
		if p.eat(']') {
			return dst, true
		}
		if !p.eat(',') {
			return dst, false
		}
	}
}

// number reads a JSON number that is not negative, as encoding/json reads it into a float64.
func (p *usualParser) number() (float64, bool) {
	p.ws()
	start := p.i
	if _, ok := p.digits(); !ok {
		return 0, false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if !p.someDigits() {
			return 0, false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if !p.someDigits() {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(string(p.b[start:p.i]), 64)
	return v, err == nil
}

// someDigits skips one digit or more.
func (p *usualParser) someDigits() bool {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}

// check checks the lengths, and that hash_ids has one id for each block of blockTokens tokens.
func (l *mooncakeRecord) check(blockTokens int) error {
	switch {
	case l.input < 1 || l.input > maxTokens:
		return fmt.Errorf("field input_length: %d, want 1 to %d", l.input, maxTokens)
	case l.output < 1 || l.output > maxTokens:
		return fmt.Errorf("field output_length: %d, want 1 to %d", l.output, maxTokens)
	}
	want := (l.input + blockTokens - 1) / blockTokens
	if got := len(l.ids); got != want {
		hint := ""
		if blockTokens == MooncakeBlockTokens {
			if other := fittingBlockTokens(l.input, got); other > 0 {
				hint = fmt.Sprintf(" (if the trace's blocks are %d tokens, convert it to 512-token blocks: kvroute trace convert --block-tokens %d FILE > trace.jsonl)", other, other)
			}
		}
		return fmt.Errorf("field hash_ids: %d blocks for input_length %d, want ceil(%d/%d) = %d%s",
			got, l.input, l.input, blockTokens, want, hint)
	}
	return nil
}

// fittingBlockTokens is the power of two from 1 to 65,536 tokens, other than 512, whose blocks
// cut a prompt of input tokens into exactly blocks blocks: the block size of a trace made with
// another engine's; 0 when none fits.
func fittingBlockTokens(input, blocks int) int {
	if blocks < 1 {
		return 0
	}
	for b := 1; b <= 1<<16; b *= 2 {
		if b != MooncakeBlockTokens && (input+b-1)/b == blocks {
			return b
		}
	}
	return 0
}

// jsonWant words a Go type that a JSON value did not fit, for a person who writes JSON.
func jsonWant(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("a whole number from 0 to %d", uint64(math.MaxUint64))
	case reflect.Slice, reflect.Array:
		return "an array of " + jsonWantPlural(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Pointer:
		return jsonWant(t.Elem())
	}
	return "a JSON object"
}

// jsonWantPlural is jsonWant for the elements of an array.
func jsonWantPlural(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("whole numbers from 0 to %d", uint64(math.MaxUint64))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "whole numbers"
	case reflect.Float32, reflect.Float64:
		return "numbers"
	}
	return "values"
}

// parseMooncakeLine parses and checks one non-blank line of a trace in milliseconds with
// 512-token blocks: the request (its ids a slice of its own), with its arrival at the
// timestamp, and the timestamp in milliseconds.
func parseMooncakeLine(b []byte) (Request, float64, error) {
	var l mooncakeRecord
	if err := l.read(b); err != nil {
		return Request{}, 0, err
	}
	return Request{
		Arrival:      time.Duration(math.Round(l.timestamp * float64(time.Millisecond))),
		Blocks:       slices.Clone(l.ids),
		BlockTokens:  MooncakeBlockTokens,
		PromptTokens: l.input,
		OutputTokens: l.output,
	}, l.timestamp, nil
}

// Timestamps are milliseconds. Nothing in a trace says its unit, so the reader looks at them
// as a whole: seconds read as milliseconds replay a trace a thousand times too fast (200
// requests of an hour in 3.6 s), and nothing downstream notices.
const (
	// maxMillis is the largest timestamp: its milliseconds in nanoseconds fit an int64 (2262).
	maxMillis = float64(math.MaxInt64 / int64(time.Millisecond))
	// unixFrom and unixTo bound the Unix times, in seconds, that a trace of today can have:
	// 2000-01-01 to 2100-01-01. The same numbers in microseconds or nanoseconds are far past
	// maxMillis; in seconds they are whole numbers that, as milliseconds, fall in January 1970.
	unixFrom = 946684800
	unixTo   = 4102444800
	// maxTokensPerSecond is a prompt rate no fleet that kvroute models could prefill: ten
	// million tokens a second is over 300 instances of Llama 3.1 70B on eight GPUs each (25 to
	// 33 thousand prefill tokens a second, package engine's calibration). checkTimes refuses
	// a trace that asks for more, over at least minRequestsForRate requests, as seconds.
	maxTokensPerSecond = 10e6
	minRequestsForRate = 100
)

// convertHint is how an error about a trace's time unit ends: the command that fixes it.
const convertHint = "kvroute trace convert --time-unit %s FILE > trace.jsonl"

// checkMillis checks that a timestamp, in milliseconds, is in range, and says which unit a
// timestamp too large for milliseconds looks like.
func checkMillis(ms float64) error {
	if ms <= maxMillis {
		return nil
	}
	switch {
	case ms >= unixFrom*1e6 && ms < unixTo*1e6:
		return fmt.Errorf("field timestamp: %v out of range for milliseconds: it looks like Unix time in microseconds; convert the trace: "+convertHint, ms, "us")
	case ms >= unixFrom*1e9 && ms < unixTo*1e9:
		return fmt.Errorf("field timestamp: %v out of range for milliseconds: it looks like Unix time in nanoseconds; convert the trace: "+convertHint, ms, "ns")
	}
	return fmt.Errorf("field timestamp: %v out of range (want milliseconds from 0 to %.0f)", ms, maxMillis)
}

// timeStats is what the reader keeps of the timestamps to judge their unit.
type timeStats struct {
	n        int
	min, max float64 // milliseconds
	tokens   float64 // prompt tokens in all
	// fracLine is the first line whose timestamp has a fraction of a millisecond, 0 if none.
	fracLine int
	frac     float64
}

func (s *timeStats) add(line int, ms float64, tokens int) {
	if s.n == 0 || ms < s.min {
		s.min = ms
	}
	if s.n == 0 || ms > s.max {
		s.max = ms
	}
	s.n++
	s.tokens += float64(tokens)
	if s.fracLine == 0 && hasFraction(ms) {
		s.fracLine, s.frac = line, ms
	}
}

// hasFraction reports whether ms is not a whole number, beyond the rounding of a number
// computed in floating point (seconds times 1000 gives 700.0000000000001 for 0.7).
func hasFraction(ms float64) bool {
	ulp := math.Nextafter(ms, math.Inf(1)) - ms
	return math.Abs(ms-math.Round(ms)) > 4*ulp
}

// check refuses timestamps that are not milliseconds by the look of them: with a fraction of a
// millisecond (seconds, most likely: no log keeps fractions of its unit), whole numbers in the
// range of today's Unix time in seconds, or a rate of prompt tokens that no fleet prefills.
// Each error says what the timestamps would mean as milliseconds and the command that
// converts the trace. Microseconds from a start, read as milliseconds, stretch a trace a
// thousand times and cannot be told from a quiet one: the converter takes their unit.
func (s *timeStats) check() error {
	switch {
	case s.fracLine > 0:
		return fmt.Errorf("line %d: timestamp %v has a fraction of a millisecond: the timestamps look like seconds (kvroute reads milliseconds; %s); if they are seconds, convert the trace: "+convertHint+" (if they are milliseconds, --time-unit ms rounds them)",
			s.fracLine, s.frac, s.asMillis(), "s")
	case s.min >= unixFrom && s.max < unixTo:
		return fmt.Errorf("timestamps from %.0f to %.0f look like Unix time in seconds (%s to %s UTC), and kvroute reads milliseconds (%s, in January 1970); convert the trace: "+convertHint,
			s.min, s.max, unixDate(s.min), unixDate(s.max), s.asMillis(), "s")
	case s.n >= minRequestsForRate && s.max > s.min && s.tokens/((s.max-s.min)/1000) > maxTokensPerSecond:
		return fmt.Errorf("the timestamps look like seconds: kvroute reads milliseconds, and %s: %.0f prompt tokens a second, more than 300 eight-GPU instances of a 70B model prefill; if they are seconds, convert the trace: "+convertHint,
			s.asMillis(), s.tokens/((s.max-s.min)/1000), "s")
	}
	return nil
}

// asMillis says how the trace replays when its timestamps are read as milliseconds.
func (s *timeStats) asMillis() string {
	span := s.max - s.min
	if span <= 0 {
		return fmt.Sprintf("as milliseconds, its %d requests of %.0f prompt tokens on average arrive at once", s.n, s.tokens/float64(s.n))
	}
	return fmt.Sprintf("as milliseconds, its %d requests of %.0f prompt tokens on average arrive within %v, %.2f requests/s",
		s.n, s.tokens/float64(s.n), time.Duration(span*float64(time.Millisecond)).Round(time.Microsecond), float64(s.n)/(span/1000))
}

// unixDate is the date of a Unix time in seconds.
func unixDate(sec float64) string {
	return time.Unix(int64(sec), 0).UTC().Format("2006-01-02")
}
