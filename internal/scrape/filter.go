package scrape

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
)

// The router reads six or so samples of an engine's metrics page, and an engine exposes many
// more: vLLM's page (as kvroute sim serves it, 22 KB) is seven latency histograms of about 20
// buckets each around them. expfmt's parser builds a protobuf family of every sample it reads,
// so a scrape cost 1.77 ms and 6,779 allocations, nearly all of them for histograms nobody
// reads (BenchmarkParseFull). The page is therefore cut down before it is parsed: lines of a
// family the engine's names do not list are dropped, and expfmt parses the rest. Whatever the
// cut cannot read for sure (a quoted UTF-8 name, a name with characters the classic format does
// not allow, text that is not the format at all) is kept, so the parser still sees it and still
// rejects a page that is not Prometheus text. FuzzParseFiltered checks that the snapshot is the
// same as from the whole page wherever the whole page parses and is not refused.
//
// The cut is made as the page streams in, a line at a time, so a scrape holds a line and what
// it keeps, not the page: reading the whole page first cost a buffer of twice its size (16 MiB
// for a page near the 8 MiB limit), and a page of 160,000 series of a wanted family (7 MB) went
// whole to expfmt, 93 MB and 0.8 s a scrape (BenchmarkScrape_Hostile). What is kept is bounded
// three ways, each refusing the page with an error that says which: a kept line's length, the
// series of each wanted family, and the bytes kept in all.
const (
	// maxLine is the longest line kept; a longer line of another family is skipped.
	maxLine = 64 << 10
	// maxSeries is the most series (label sets) a wanted family may have: far more than the
	// data-parallel ranks and LoRA adapters of one engine.
	maxSeries = 1024
	// maxKept bounds the bytes kept of one page (a normal page keeps a few KB).
	maxKept = 1 << 20
)

// errRefused marks a page the cut refuses.
var errRefused = errors.New("metrics page refused")

// errNoFamilies marks a page refused for having none of the engine kind's families: an empty
// page, or another engine's (the prober then asks what the endpoint looks like).
var errNoFamilies = errors.New("none of the families the router reads")

// maxPooledPage is the largest page buffer kept for the next scrape.
const maxPooledPage = maxKept

// page is the cut of one metrics page, with what cutting it needs; pooled between scrapes.
type page struct {
	bytes.Buffer
	rd *bufio.Reader
	// samples counts the sample lines of each slot (see wanted.has).
	samples []int
	// declared is whether a line (sample, HELP or TYPE) of a wanted family was read by name.
	declared bool
}

var pages = sync.Pool{New: func() any { return &page{rd: bufio.NewReaderSize(nil, maxLine)} }}

// family is a wanted family: its index among the engine's families, and whether it is a
// histogram read for its sum and count only (its buckets are cut too).
type family struct {
	index   int
	sumOnly bool
}

// wanted is the set of family names Parse reads for one engine.
type wanted map[string]family

func (n names) wanted() wanted {
	w := wanted{}
	add := func(name string, sumOnly bool) {
		if _, ok := w[name]; !ok && name != "" {
			w[name] = family{index: len(w), sumOnly: sumOnly}
		}
	}
	for _, list := range [][]string{n.running, n.waiting, n.kvUsage, n.queries, n.hits, n.prompted, n.generated, n.steps} {
		for _, name := range list {
			add(name, false)
		}
	}
	add(n.cacheInfo, false)
	add(n.capacityTokens, false)
	for _, name := range n.ttft {
		add(name, true)
	}
	return w
}

// sampleSuffixes are the endings the exposition adds to a family's name on its samples.
var sampleSuffixes = [...]string{"_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount"}

// slots is the number of sample names the cut counts apart: each family's name and its
// name with each suffix.
func (w wanted) slots() int { return len(w) * (1 + len(sampleSuffixes)) }

// has reports whether name is a wanted family, or one of its samples' names, and the slot in
// which its samples are counted.
func (w wanted) has(name []byte) (slot int, ok bool) {
	if f, ok := w[string(name)]; ok {
		return f.index * (1 + len(sampleSuffixes)), true
	}
	for i, s := range sampleSuffixes {
		if base, ok := bytes.CutSuffix(name, []byte(s)); ok {
			if f, ok := w[string(base)]; ok && (!f.sumOnly || s != "_bucket") {
				return f.index*(1+len(sampleSuffixes)) + 1 + i, true
			}
		}
	}
	return 0, false
}

// readWanted reads the page from r and returns the lines Parse may need, in their order, in a
// pooled page that the caller hands back with putPage. It refuses (errRefused) a page with a
// kept line over maxLine bytes, a wanted family of over maxSeries series, or over maxKept
// bytes kept in all.
func readWanted(r io.Reader, w wanted) (*page, error) {
	p := pages.Get().(*page)
	p.Reset()
	p.rd.Reset(r)
	p.declared = false
	if n := w.slots(); cap(p.samples) < n {
		p.samples = make([]int, n)
	} else {
		p.samples = p.samples[:n]
		clear(p.samples)
	}
	if err := p.cut(w); err != nil {
		putPage(p)
		return nil, err
	}
	return p, nil
}

func (p *page) cut(w wanted) error {
	for {
		line, err := p.rd.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Over maxLine bytes: refused if kept, else skipped to its end.
			if keep, _, name, _ := keepLine(line, w); keep {
				what := "a line"
				if name != nil {
					what = "a line of " + shortName(name)
				}
				return fmt.Errorf("%w: %s is over %d bytes", errRefused, what, maxLine)
			}
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = p.rd.ReadSlice('\n')
			}
			line = nil
		}
		if len(line) > 0 {
			if err := p.keep(line, w); err != nil {
				return err
			}
		}
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return err
		}
	}
}

// keep appends line to the cut if it may matter, counting the samples of wanted families.
func (p *page) keep(line []byte, w wanted) error {
	keep, slot, name, sample := keepLine(line, w)
	if !keep {
		return nil
	}
	if name != nil {
		p.declared = true
		if sample {
			// A series has one sample of each name, so more samples of one name than
			// maxSeries are more series than that (or duplicates, refused anyway).
			if p.samples[slot]++; p.samples[slot] > maxSeries {
				return fmt.Errorf("%w: over %d series of %s (the most one family may have)", errRefused, maxSeries, name)
			}
		}
	}
	if p.Len()+len(line) > maxKept {
		return fmt.Errorf("%w: over %d bytes of lines the router may read", errRefused, maxKept)
	}
	p.Write(line)
	return nil
}

func putPage(p *page) {
	p.rd.Reset(nil)
	if p.Cap() <= maxPooledPage {
		pages.Put(p)
	}
}

// keepLine reports whether a line of the exposition may matter to the snapshot: a sample, HELP
// or TYPE line of a wanted family, or a line whose name it cannot read for sure. For a kept
// line of a wanted family it returns the name and its slot (see wanted.has), and whether the
// line is a sample; for a kept line whose name it cannot read, a nil name.
func keepLine(line []byte, w wanted) (keep bool, slot int, name []byte, sample bool) {
	line = bytes.TrimLeft(line, " \t")
	switch {
	case len(bytes.TrimRight(line, "\r\n")) == 0:
		return false, 0, nil, false // a blank line: the parser skips it
	case line[0] == '#':
		fields := bytes.Fields(line[1:])
		if len(fields) < 2 || (string(fields[0]) != "HELP" && string(fields[0]) != "TYPE") {
			return false, 0, nil, false // a comment: the parser ignores it
		}
		name = fields[1]
	default:
		end := bytes.IndexAny(line, "{ \t\r\n")
		if end < 0 {
			end = len(line)
		}
		name, sample = line[:end], true
	}
	if !legacyName(name) {
		return true, 0, nil, false
	}
	slot, ok := w.has(name)
	return ok, slot, name, sample
}

// shortName is a name for an error message: at most 100 bytes of it.
func shortName(name []byte) string {
	if len(name) > 100 {
		return string(name[:100]) + "..."
	}
	return string(name)
}

// legacyName reports whether b is a metric name of the classic format, [a-zA-Z_:][a-zA-Z0-9_:]*.
func legacyName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_', c == ':':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
