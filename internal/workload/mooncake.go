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
	"slices"
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
// parse or check, a line too long, no request at all (ErrNoRequests). The CLI exits 2 on it,
// as on a bad flag; a read that fails midway is not one.
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
func ReadMooncake(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var reqs []Request
	var stamps []float64 // milliseconds, as in the file
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, ms, err := parseMooncakeLine(b)
		if err != nil {
			return nil, badTrace{fmt.Errorf("line %d: %w", line, err)}
		}
		req.ID = len(reqs)
		reqs = append(reqs, req)
		stamps = append(stamps, ms)
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
	// Subtract in milliseconds: 1.7e12 ms in nanoseconds is past float64's exact integers.
	first := slices.Min(stamps)
	for i := range reqs {
		reqs[i].Arrival = time.Duration(math.Round((stamps[i] - first) * float64(time.Millisecond)))
	}
	return reqs, nil
}

// LoadMooncake reads the Mooncake JSONL trace at path.
func LoadMooncake(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, badTrace{fmt.Errorf("open trace: %w", err)}
	}
	defer f.Close()
	reqs, err := ReadMooncake(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// parseMooncakeLine parses and checks one non-blank trace line. It returns the request, with
// its arrival at the timestamp, and the timestamp in milliseconds.
func parseMooncakeLine(b []byte) (Request, float64, error) {
	var l mooncakeLine
	if err := json.Unmarshal(b, &l); err != nil {
		if len(b) > 0 && b[0] == '#' || bytes.HasPrefix(b, []byte("//")) {
			// A comment-only file reads as an empty trace to a person; say why it is not one.
			return Request{}, 0, fmt.Errorf("a comment, which JSON Lines do not have (want %s)", mooncakeFormat)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Request{}, 0, fmt.Errorf("field %s: want %s, got JSON %s: %w", te.Field, te.Type, te.Value, err)
		}
		return Request{}, 0, fmt.Errorf("invalid JSON object: %w", err)
	}
	switch {
	case l.Timestamp == nil:
		return Request{}, 0, errors.New("field timestamp: missing (milliseconds; arrivals are measured from the earliest)")
	case math.IsNaN(*l.Timestamp) || *l.Timestamp < 0 || *l.Timestamp > float64(math.MaxInt64/int64(time.Millisecond)):
		return Request{}, 0, fmt.Errorf("field timestamp: %v out of range (want milliseconds >= 0)", *l.Timestamp)
	case l.InputLength == nil:
		return Request{}, 0, errors.New("field input_length: missing (prompt tokens)")
	case *l.InputLength < 1 || *l.InputLength > maxTokens:
		return Request{}, 0, fmt.Errorf("field input_length: %d, want 1 to %d", *l.InputLength, maxTokens)
	case l.OutputLength == nil:
		return Request{}, 0, errors.New("field output_length: missing (generated tokens)")
	case *l.OutputLength < 1 || *l.OutputLength > maxTokens:
		return Request{}, 0, fmt.Errorf("field output_length: %d, want 1 to %d", *l.OutputLength, maxTokens)
	case l.HashIDs == nil:
		return Request{}, 0, errors.New("field hash_ids: missing (the prompt's 512-token block ids)")
	}
	want := (*l.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens
	if got := len(*l.HashIDs); got != want {
		return Request{}, 0, fmt.Errorf("field hash_ids: %d blocks for input_length %d, want ceil(%d/%d) = %d",
			got, *l.InputLength, *l.InputLength, MooncakeBlockTokens, want)
	}
	return Request{
		Arrival:      time.Duration(math.Round(*l.Timestamp * float64(time.Millisecond))),
		Blocks:       *l.HashIDs,
		BlockTokens:  MooncakeBlockTokens,
		PromptTokens: *l.InputLength,
		OutputTokens: *l.OutputLength,
	}, *l.Timestamp, nil
}
