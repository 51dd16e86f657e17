package workload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
)

// ConvertTrace turns traces of other formats into the Mooncake JSON Lines every verb replays:
// timestamps in whole milliseconds from the first request, input_length, output_length, and
// hash_ids of 512-token blocks with Mooncake's meaning (equal ids at the same position: an
// equal prompt up to the end of that block).
//
//   - Text (OpenAI bodies, ShareGPT): the prompt is rendered as the router renders it
//     (openai.Request.AppendCanonical: the same canonical text the router hashes), its tokens
//     counted with the router's and simulator's estimate (prefix.EstimateTokens, 4 bytes a
//     token), and each 512-token block (2,048 bytes; the last may be partial) hashed chained
//     from the model's seed, as the router chains its blocks: equal prefixes get equal ids. The
//     ids are then numbered 0, 1, 2, ... in order of first appearance, as in Mooncake's files.
//     These formats have no times: requests are spaced evenly at ConvertOptions.Rate.
//   - Token counts only (Azure, BurstGPT): every request gets ids of its own, since nothing
//     says what its prompt shares; a note says that no prefix sharing will show.
//   - Mooncake with timestamps in another unit, or blocks of another size: rescaled, and the
//     blocks regrouped into 512-token blocks (see regroup).
//
// It streams: memory holds one record at a time, plus the numbering of the text formats' block
// hashes (about 40 bytes for each distinct block).
//
// Errors in the input are ErrBadTrace errors naming the line (or conversation); a request that
// cannot be a Mooncake line (no prompt) is left out and counted in a note, as are lengths that
// had to be changed (an output of 0 tokens written as 1).
func ConvertTrace(w io.Writer, r io.Reader, o ConvertOptions) (ConvertStats, error) {
	if err := o.check(); err != nil {
		return ConvertStats{}, err
	}
	in, err := openText(r)
	if err != nil {
		return ConvertStats{}, err
	}
	// The format is told from the first bytes after the white space, however long it runs:
	// a file that starts with more blank lines than the sniff window holds is not blank.
	skip, err := skipSpace(in)
	if err != nil {
		return ConvertStats{}, err
	}
	head, _ := in.Peek(sniffBytes)
	from := o.From
	if from == "" && len(bytes.TrimSpace(head)) == 0 {
		// Nothing to tell a format from: say so, rather than that the format is unknown.
		what := "empty"
		if len(head) > 0 || skip.bytes > 0 {
			what = "blank (white space only)"
		}
		return ConvertStats{}, badTrace{fmt.Errorf("%w: the input is %s", ErrNoRequests, what)}
	}
	if from == "" {
		f, what := detectTraceFormat(head)
		if f == "" {
			if what == "" {
				what = "in no format known here"
			}
			return ConvertStats{}, badTrace{fmt.Errorf("the input is %s: give its format with --from (one of %s)", what, formatNames())}
		}
		from = f
	}
	if from != FormatMooncake && (o.TimeUnit != 0 || o.BlockTokens != 0) {
		return ConvertStats{Format: from}, badOption{fmt.Errorf("the time unit and the block size are settings of a Mooncake trace, not of %s one", withArticle(from))}
	}
	c := converter{o: o, out: newTraceWriter(w), stats: ConvertStats{Format: from}, skipped: skip}
	switch from {
	case FormatMooncake:
		err = c.mooncake(in)
	case FormatOpenAI:
		err = c.openAI(in)
	case FormatShareGPT:
		err = c.shareGPT(in)
	case FormatAzure, FormatBurstGPT:
		err = c.csv(in, from)
	default:
		err = badOption{fmt.Errorf("unknown trace format %q, want one of %s", from, formatNames())}
	}
	if err == nil {
		err = c.out.flush()
	}
	if err == nil && c.stats.Requests == 0 {
		err = badTrace{fmt.Errorf("%w: the input has no request to convert", ErrNoRequests)}
	}
	c.finish()
	return c.stats, err
}

// withArticle is "an azure", "an openai", "a sharegpt": the format's name after its article.
func withArticle(f TraceFormat) string {
	if strings.ContainsRune("aeiou", rune(f[0])) {
		return "an " + string(f)
	}
	return "a " + string(f)
}

// DefaultConvertRate is the requests a second that ConvertTrace spaces a format without times at.
const DefaultConvertRate = 1.0

// DefaultOutputTokens is the output_length that ConvertTrace gives a request that does not say
// how many tokens it wants.
const DefaultOutputTokens = 256

// ConvertOptions are ConvertTrace's settings; the zero value converts a trace of a format it
// detects with the defaults.
type ConvertOptions struct {
	// From is the input's format; "" detects it from its first bytes.
	From TraceFormat
	// TimeUnit is the unit of a Mooncake input's timestamps: time.Second, time.Millisecond,
	// time.Microsecond or time.Nanosecond. 0 means milliseconds judged as ReadMooncake judges
	// them (timestamps that look like seconds are an error); time.Millisecond given is taken
	// at its word, and rounds fractions of a millisecond.
	TimeUnit time.Duration
	// BlockTokens is the size of a Mooncake input's blocks in tokens; 0 means 512.
	BlockTokens int
	// Rate spaces the requests of a format without times (openai, sharegpt) evenly, this many
	// a second, in the file's order; 0 means DefaultConvertRate.
	Rate float64
	// OutputTokens is the output_length of an OpenAI request that gives no max_tokens (nor
	// max_completion_tokens, max_output_tokens, output_tokens, output_len); 0 means
	// DefaultOutputTokens.
	OutputTokens int
}

// ConvertStats is what ConvertTrace did.
type ConvertStats struct {
	Format   TraceFormat // the input's, as given or detected
	Requests int         // lines written
	// Notes are what the output does not show of the input, for a person: synthesised times,
	// requests left out or changed, the lack of prefix information.
	Notes []string
}

func (o *ConvertOptions) check() error {
	var errs []error
	switch o.TimeUnit {
	case 0, time.Second, time.Millisecond, time.Microsecond, time.Nanosecond:
	default:
		errs = append(errs, fmt.Errorf("time unit %v: want s, ms, us or ns", o.TimeUnit))
	}
	if o.BlockTokens < 0 || o.BlockTokens > maxTokens {
		errs = append(errs, fmt.Errorf("block tokens %d: want 1 to %d", o.BlockTokens, maxTokens))
	}
	if math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) || o.Rate < 0 {
		errs = append(errs, fmt.Errorf("rate %v: want a positive number of requests a second", o.Rate))
	}
	if o.OutputTokens < 0 || o.OutputTokens > maxTokens {
		errs = append(errs, fmt.Errorf("output tokens %d: want 1 to %d", o.OutputTokens, maxTokens))
	}
	if len(errs) > 0 {
		return badOption{errors.Join(errs...)}
	}
	return nil
}

// ErrBadConvertOption is what ConvertTrace's errors are (errors.Is) when a ConvertOptions
// field is out of range or does not apply to the input's format: the command line is at fault.
var ErrBadConvertOption = errors.New("bad conversion option")

// badOption marks err as ErrBadConvertOption without changing its message.
type badOption struct{ error }

func (e badOption) Unwrap() error        { return e.error }
func (e badOption) Is(target error) bool { return target == ErrBadConvertOption }

func formatNames() string {
	var names []string
	for _, f := range TraceFormats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

// converter is one run of ConvertTrace.
type converter struct {
	o     ConvertOptions
	out   *traceWriter
	stats ConvertStats
	// skipped is the white space read before the input the formats' readers see: its lines
	// and bytes are added to the positions they name.
	skipped skipped
	// ids numbers block hashes 0, 1, 2, ... in order of first appearance.
	ids map[uint64]uint64
	// next is the next id of a request that gets ids of its own (no prompt text).
	next uint64
	// Counts for the notes.
	noPrompt, zeroOutput, defaultOutput, splitPrompts int
	synthesised                                       bool
}

// finish words the notes.
func (c *converter) finish() {
	s := &c.stats
	if c.synthesised {
		rate := c.rate()
		s.Notes = append(s.Notes, fmt.Sprintf("%s has no times: the requests are spaced evenly, %s apart (%g a second), in the input's order; bench --rate re-times them as a Poisson process",
			s.Format, time.Duration(float64(time.Second)/rate).Round(time.Microsecond), rate))
	}
	if s.Format == FormatShareGPT {
		s.Notes = append(s.Notes, "one request per assistant turn, its prompt the conversation before it; output_length is the turn's own length")
	}
	if s.Format == FormatAzure || s.Format == FormatBurstGPT {
		s.Notes = append(s.Notes, fmt.Sprintf("%s has token counts but no prompt text: each request has hash_ids of its own, so analyze, simulate and plan see no prefix sharing (the trace says nothing of it)", s.Format))
	}
	if c.noPrompt > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d request(s) without prompt tokens left out", c.noPrompt))
	}
	if c.zeroOutput > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d request(s) with 0 output tokens written with output_length 1", c.zeroOutput))
	}
	if c.defaultOutput > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d request(s) without max_tokens written with output_length %d (the output tokens setting)", c.defaultOutput, c.outputTokens()))
	}
	if c.splitPrompts > 0 {
		s.Notes = append(s.Notes, fmt.Sprintf("%d completion request(s) with a list of prompts written as one request per prompt, as the engine serves them", c.splitPrompts))
	}
}

func (c *converter) rate() float64 {
	if c.o.Rate > 0 {
		return c.o.Rate
	}
	return DefaultConvertRate
}

func (c *converter) outputTokens() int {
	if c.o.OutputTokens > 0 {
		return c.o.OutputTokens
	}
	return DefaultOutputTokens
}

// synthesisedMillis is the timestamp of the next request of a format without times.
func (c *converter) synthesisedMillis() int64 {
	c.synthesised = true
	return int64(math.Round(float64(c.stats.Requests) * 1000 / c.rate()))
}

// write writes one request, its output length made at least 1.
func (c *converter) write(ms int64, input, output int, ids []uint64) error {
	if output < 1 {
		c.zeroOutput++
		output = 1
	}
	if err := c.out.write(ms, input, min(output, maxTokens), ids); err != nil {
		return err
	}
	c.stats.Requests++
	return nil
}

// dense numbers block hashes in place: 0, 1, 2, ... in order of first appearance.
func (c *converter) dense(hashes []uint64) []uint64 {
	if c.ids == nil {
		c.ids = map[uint64]uint64{}
	}
	for i, h := range hashes {
		id, ok := c.ids[h]
		if !ok {
			id = uint64(len(c.ids))
			c.ids[h] = id
		}
		hashes[i] = id
	}
	return hashes
}

// own returns the ids of a request of input tokens that shares nothing: ids no other has.
func (c *converter) own(dst []uint64, input int) []uint64 {
	for range (input + MooncakeBlockTokens - 1) / MooncakeBlockTokens {
		dst = append(dst, c.next)
		c.next++
	}
	return dst
}

// textBlockBytes is the text of one 512-token block, by the token estimate.
var textBlockBytes = prefix.BlockBytes(MooncakeBlockTokens)

// textBlocks appends the chained hashes of text's 512-token blocks, the last one partial,
// from seed: prefix.BlocksBytes, the router's chain, plus the partial block.
func textBlocks(dst []uint64, seed uint64, text []byte) []uint64 {
	dst = prefix.BlocksBytes(dst, seed, text, MooncakeBlockTokens)
	if rest := len(text) % textBlockBytes; rest > 0 {
		h := seed
		if len(dst) > 0 {
			h = dst[len(dst)-1]
		}
		dst = append(dst, prefix.Next(h, xxhash.Sum64(text[len(text)-rest:])))
	}
	return dst
}

// skipped is the white space at the start of an input, read before its format is told.
type skipped struct {
	bytes int64
	lines int // the line ends among them
}

// skipSpace reads the white space at the start of in, however long, and leaves in at its first
// other byte (or its end).
func skipSpace(in *bufio.Reader) (skipped, error) {
	var s skipped
	for {
		b, err := in.ReadByte()
		if err == io.EOF {
			return s, nil
		}
		if err != nil {
			if errors.Is(err, ErrBadTrace) {
				return s, err
			}
			return s, fmt.Errorf("read trace: %w", err)
		}
		switch b {
		case '\n':
			s.lines++
		case ' ', '\t', '\r', '\v', '\f':
		default:
			return s, in.UnreadByte()
		}
		s.bytes++
	}
}

// lines calls f with each non-blank line of in and its number, counted from the first line
// after the skip lines; an error from f is a bad trace error naming the line.
func lines(in io.Reader, skip int, f func(n int, b []byte) error) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	n := skip
	for sc.Scan() {
		n++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := f(n, b); err != nil {
			if rerr := sc.Err(); rerr != nil {
				// A read that failed (a gzip stream cut short) left this line cut: say why.
				return fmt.Errorf("read after line %d: %w", n-1, rerr)
			}
			if errors.As(err, new(writeError)) {
				return err
			}
			return badTrace{fmt.Errorf("line %d: %w", n, err)}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return badTrace{fmt.Errorf("line %d: longer than %d bytes: %w", n+1, maxLineBytes, err)}
		}
		return fmt.Errorf("read after line %d: %w", n, err)
	}
	return nil
}

// mooncake converts a Mooncake trace whose timestamps are in another unit or whose blocks are
// of another size.
func (c *converter) mooncake(in io.Reader) error {
	unit := c.o.TimeUnit
	var times *timeStats // the reader's judgement of the unit, when none is given
	if unit == 0 {
		unit, times = time.Millisecond, &timeStats{}
	}
	perMilli := float64(unit) / float64(time.Millisecond)
	bt := c.o.BlockTokens
	if bt == 0 {
		bt = MooncakeBlockTokens
	}
	var (
		l       mooncakeRecord
		first   float64
		grouped []uint64
	)
	err := lines(in, c.skipped.lines, func(n int, b []byte) error {
		if err := l.parse(b); err != nil {
			return err
		}
		if err := l.check(bt); err != nil {
			return err
		}
		if times != nil {
			// As the reader: Unix microseconds, say, are refused rather than made relative.
			if err := checkMillis(l.timestamp); err != nil {
				return err
			}
			times.add(n, l.timestamp, l.input)
		}
		if c.stats.Requests == 0 {
			first = l.timestamp
		}
		if l.timestamp < first {
			return fmt.Errorf("field timestamp: %v is before the first line's %v: the converted trace is measured from its first line, so sort the input by timestamp first (jq -c -s 'sort_by(.timestamp)[]')", l.timestamp, first)
		}
		ms := math.Round((l.timestamp - first) * perMilli)
		if err := checkMillis(ms); err != nil {
			return err
		}
		ids := l.ids
		if bt != MooncakeBlockTokens {
			grouped = c.regroup(grouped[:0], l.ids, l.input, bt)
			ids = grouped
		}
		return c.write(int64(ms), l.input, l.output, ids)
	})
	if err == nil && times != nil && times.n > 0 {
		if err := times.check(); err != nil {
			return badTrace{err}
		}
	}
	return err
}

// regroup appends the 512-token blocks of a prompt of input tokens given as ids of blocks of
// bt tokens. Block k of 512 tokens ends within (or with) small block j = ceil(512(k+1)/bt)-1,
// the last one at most; equal ids at j mean an equal prompt up to the end of block j, and so
// up to the end of block k: block k's id numbers the pair (k, j) and the id at j.
func (c *converter) regroup(dst, small []uint64, input, bt int) []uint64 {
	blocks := (input + MooncakeBlockTokens - 1) / MooncakeBlockTokens
	for k := range blocks {
		j := min((MooncakeBlockTokens*(k+1)+bt-1)/bt, len(small)) - 1
		dst = append(dst, prefix.Next(prefix.Next(uint64(k), uint64(j)), small[j]))
	}
	return c.dense(dst)
}

// openAI converts JSON Lines of OpenAI request bodies (see FormatOpenAI).
func (c *converter) openAI(in io.Reader) error {
	var (
		buf    []byte
		hashes []uint64
	)
	return lines(in, c.skipped.lines, func(n int, b []byte) error {
		var err error
		buf, hashes, err = c.openAILine(b, buf, hashes)
		return err
	})
}

// openAIProbe is what tells the kind of request on a line.
type openAIProbe struct {
	Model        *string         `json:"model"`
	Messages     json.RawMessage `json:"messages"`
	Prompt       json.RawMessage `json:"prompt"`
	Input        json.RawMessage `json:"input"`
	Body         json.RawMessage `json:"body"`
	URL          *string         `json:"url"`
	OutputTokens *int            `json:"output_tokens"`
	OutputLen    *int            `json:"output_len"`
	MaxTokens    *int            `json:"max_tokens"`
}

// openAILine converts one line: a request body, a Batch API line or a vLLM benchmark prompt.
// text and hashes are reused from line to line.
func (c *converter) openAILine(b, text []byte, hashes []uint64) ([]byte, []uint64, error) {
	var p openAIProbe
	if err := json.Unmarshal(b, &p); err != nil {
		return text, hashes, fmt.Errorf("not a JSON object: %v", jsonError(err))
	}
	if isJSONObject(p.Body) && p.URL != nil {
		// A Batch API line: the request is its body.
		return c.openAILine(p.Body, text, hashes)
	}
	var kind openai.Kind
	switch {
	case p.Messages != nil:
		kind = openai.KindChat
	case p.Prompt != nil && p.Model == nil:
		return c.vllmPrompt(&p, text, hashes)
	case p.Prompt != nil:
		kind = openai.KindCompletion
	case p.Input != nil:
		kind = openai.KindResponse
	default:
		return text, hashes, errors.New("no messages, prompt or input: not a chat, completion or Responses request body")
	}
	req, err := openai.Parse(kind, b)
	if err != nil {
		return text, hashes, err
	}
	output := req.MaxTokens
	if output <= 0 {
		output = c.outputTokens()
		c.defaultOutput++
	}
	seed := prefix.Seed(req.Model, req.CacheSalt)
	prompts := req.Prompts()
	if prompts > 1 {
		c.splitPrompts++
	}
	for i := range max(prompts, 1) {
		if prompts > 1 {
			text = req.AppendPrompt(text[:0], i)
		} else {
			text = req.AppendCanonical(text[:0])
		}
		if err := c.writeText(seed, text, output, &hashes); err != nil {
			return text, hashes, err
		}
	}
	return text, hashes, nil
}

// vllmPrompt converts a vLLM benchmark line: {"prompt": "...", "output_tokens": N}.
func (c *converter) vllmPrompt(p *openAIProbe, text []byte, hashes []uint64) ([]byte, []uint64, error) {
	var s string
	if err := json.Unmarshal(p.Prompt, &s); err != nil {
		return text, hashes, errors.New(`field prompt: want a string (a request body without "model" is read as a vLLM benchmark prompt)`)
	}
	output := 0
	for _, v := range []*int{p.MaxTokens, p.OutputLen, p.OutputTokens} {
		if v != nil {
			output = *v
		}
	}
	if output <= 0 {
		output = c.outputTokens()
		c.defaultOutput++
	}
	text = append(text[:0], s...)
	return text, hashes, c.writeText(prefix.Seed("", ""), text, output, &hashes)
}

// writeText writes one request whose prompt is text.
func (c *converter) writeText(seed uint64, text []byte, output int, hashes *[]uint64) error {
	input := prefix.EstimateTokensBytes(text)
	if input < 1 {
		c.noPrompt++
		return nil
	}
	if input > maxTokens {
		return fmt.Errorf("a prompt of %d tokens, more than %d", input, maxTokens)
	}
	*hashes = c.dense(textBlocks((*hashes)[:0], seed, text))
	return c.write(c.synthesisedMillis(), input, output, *hashes)
}

// shareGPTConversation is one conversation of a ShareGPT data set. Some copies use OpenAI's
// names (messages, role, content) for the same thing.
type shareGPTConversation struct {
	Conversations []shareGPTTurn `json:"conversations"`
	Messages      []shareGPTTurn `json:"messages"`
}

type shareGPTTurn struct {
	From    string `json:"from"`
	Value   string `json:"value"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

// shareGPTRoles maps ShareGPT's speakers to chat roles; others keep their name as the role.
var shareGPTRoles = map[string]string{
	"human": "user", "user": "user",
	"gpt": "assistant", "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant", "assistant": "assistant",
	"system": "system",
}

// shareGPT converts a ShareGPT data set, a JSON array of conversations or JSON Lines of them:
// one request per assistant turn, its prompt the conversation before it as the router renders
// a chat. A conversation is read whole, one at a time.
func (c *converter) shareGPT(in *bufio.Reader) error {
	dec := json.NewDecoder(in)
	array := false
	if b, _ := in.Peek(sniffBytes); len(bytes.TrimLeft(b, " \t\r\n")) > 0 && bytes.TrimLeft(b, " \t\r\n")[0] == '[' {
		if _, err := dec.Token(); err != nil {
			return badTrace{fmt.Errorf("invalid JSON: %v", jsonError(err))}
		}
		array = true
	}
	var (
		text, msg []byte
		hashes    []uint64
		seed      = prefix.Seed("", "")
	)
	for i := 0; ; i++ {
		if array && !dec.More() {
			break
		}
		var conv shareGPTConversation
		if err := dec.Decode(&conv); err != nil {
			if !array && err == io.EOF {
				break
			}
			if errors.Is(err, ErrBadTrace) {
				return err
			}
			return badTrace{fmt.Errorf("conversation %d (byte %d): %v", i+1, c.skipped.bytes+dec.InputOffset(), jsonError(err))}
		}
		turns := conv.Conversations
		if turns == nil {
			turns = conv.Messages
		}
		text = text[:0]
		for _, t := range turns {
			from, value := t.From, t.Value
			if from == "" {
				from, value = t.Role, t.Content
			}
			role := strings.ToLower(from)
			if r, ok := shareGPTRoles[role]; ok {
				role = r
			}
			if role == "assistant" && len(text) > 0 {
				if err := c.writeText(seed, text, prefix.EstimateTokens(value), &hashes); err != nil {
					if errors.As(err, new(writeError)) {
						return err
					}
					return badTrace{fmt.Errorf("conversation %d: %w", i+1, err)}
				}
			}
			// A message renders the same alone as in its conversation (AppendCanonical).
			m := openai.Request{Messages: []openai.Message{{Role: role, Parts: []string{value}}}}
			msg = m.AppendCanonical(msg[:0])
			text = append(text, msg...)
		}
	}
	if array {
		if _, err := dec.Token(); err != nil {
			return badTrace{fmt.Errorf("the array does not end: %v", jsonError(err))}
		}
	}
	return nil
}

// csv converts an Azure or BurstGPT trace.
func (c *converter) csv(in io.Reader, f TraceFormat) error {
	r := csv.NewReader(in)
	r.ReuseRecord = true
	// Lines as the reader counts them (blank lines too), after those skipped before it.
	skip := c.skipped.lines
	header, err := r.Read()
	if err != nil {
		return badTrace{fmt.Errorf("line %d: no CSV header: %v", skip+1, err)}
	}
	header = slices.Clone(header) // the reader reuses its record
	cols := map[string]int{}
	for i, h := range header {
		cols[strings.ToLower(strings.TrimSpace(h))] = i
	}
	names := map[TraceFormat][3]string{
		FormatAzure:    {"timestamp", "contexttokens", "generatedtokens"},
		FormatBurstGPT: {"timestamp", "request tokens", "response tokens"},
	}[f]
	var at [3]int
	for i, name := range names {
		j, ok := cols[name]
		if !ok {
			line, _ := r.FieldPos(0)
			return badTrace{fmt.Errorf("line %d: no column %q in the header %q (want %s trace's)", skip+line, name, strings.Join(header, ","), withArticle(f))}
		}
		at[i] = j
	}
	var (
		first   float64 // milliseconds, the first row's
		started bool
		ids     []uint64
	)
	for {
		rec, err := r.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return badTrace{fmt.Errorf("line %d: %v", skip+pe.Line, pe.Err)}
			}
			return fmt.Errorf("read: %w", err)
		}
		line, _ := r.FieldPos(0)
		line += skip
		ms, err := csvMillis(f, rec[at[0]])
		if err != nil {
			return badTrace{fmt.Errorf("line %d: column %s: %w", line, header[at[0]], err)}
		}
		var n [2]int
		for i := range n {
			s := strings.TrimSpace(rec[at[i+1]])
			v, err := strconv.ParseFloat(s, 64)
			if err != nil || v < 0 || v > maxTokens || v != math.Trunc(v) {
				return badTrace{fmt.Errorf("line %d: column %s: %q, want a whole number of tokens from 0 to %d", line, header[at[i+1]], s, maxTokens)}
			}
			n[i] = int(v)
		}
		if !started {
			first, started = ms, true
		}
		if ms < first {
			return badTrace{fmt.Errorf("line %d: column %s: before the first row's time: the converted trace is measured from its first row, so sort the input by time first", line, header[at[0]])}
		}
		if n[0] < 1 {
			c.noPrompt++
			continue
		}
		ids = c.own(ids[:0], n[0])
		if err := c.write(int64(math.Round(ms-first)), n[0], n[1], ids); err != nil {
			return err
		}
	}
}

// azureLayouts are the forms of the Azure traces' TIMESTAMP: 2023's "2023-11-16
// 18:15:46.6805900" and 2024's "2024-05-10 00:00:00.009930+00:00" (fractions are read
// whatever their length).
var azureLayouts = []string{"2006-01-02 15:04:05Z07:00", "2006-01-02 15:04:05", time.RFC3339Nano}

// csvMillis reads a row's time in milliseconds: a date and time (Azure), seconds (BurstGPT).
func csvMillis(f TraceFormat, s string) (float64, error) {
	s = strings.TrimSpace(s)
	if f == FormatBurstGPT {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || v*1000 > maxMillis {
			return 0, fmt.Errorf("%q, want seconds from the trace's start", s)
		}
		return v * 1000, nil
	}
	for _, layout := range azureLayouts {
		if t, err := time.Parse(layout, s); err == nil {
			return float64(t.UnixMicro()) / 1000, nil
		}
	}
	return 0, fmt.Errorf("%q, want a date and time such as 2023-11-16 18:15:46.6805900", s)
}

// isJSONObject reports whether raw is a JSON object.
func isJSONObject(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}

// jsonError words an encoding/json error without Go's type names.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return fmt.Sprintf("want a JSON object, got JSON %s", te.Value)
		}
		return fmt.Sprintf("field %s: want %s, got JSON %s", te.Field, jsonWant(te.Type), te.Value)
	}
	return err.Error()
}

// traceWriter writes Mooncake lines.
type traceWriter struct {
	w   *bufio.Writer
	buf []byte
}

// writeError is a failure to write the output, as against a fault of the input.
type writeError struct{ error }

func (e writeError) Unwrap() error { return e.error }

func newTraceWriter(w io.Writer) *traceWriter {
	return &traceWriter{w: bufio.NewWriterSize(w, 64<<10)}
}

func (t *traceWriter) write(ms int64, input, output int, ids []uint64) error {
	b := append(t.buf[:0], `{"timestamp": `...)
	b = strconv.AppendInt(b, ms, 10)
	b = append(b, `, "input_length": `...)
	b = strconv.AppendInt(b, int64(input), 10)
	b = append(b, `, "output_length": `...)
	b = strconv.AppendInt(b, int64(output), 10)
	b = append(b, `, "hash_ids": [`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = strconv.AppendUint(b, id, 10)
	}
	b = append(b, "]}\n"...)
	t.buf = b
	if _, err := t.w.Write(b); err != nil {
		return writeError{fmt.Errorf("write: %w", err)}
	}
	return nil
}

func (t *traceWriter) flush() error {
	if err := t.w.Flush(); err != nil {
		return writeError{fmt.Errorf("write: %w", err)}
	}
	return nil
}
