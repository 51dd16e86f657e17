package scrape

import (
	"bytes"
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
// same as from the whole page wherever the whole page parses.

// maxPooledPage is the largest page buffer kept for the next scrape.
const maxPooledPage = 1 << 20

var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// wanted is the set of family names Parse reads for one engine, each true where the family is
// a histogram read for its sum and count only (its buckets are cut too).
type wanted map[string]bool

func (n names) wanted() wanted {
	w := wanted{}
	for _, list := range [][]string{n.running, n.waiting, n.kvUsage, n.queries, n.hits, n.prompted, n.generated, n.steps} {
		for _, name := range list {
			w[name] = false
		}
	}
	for _, name := range []string{n.cacheInfo, n.capacityTokens} {
		if name != "" {
			w[name] = false
		}
	}
	for _, name := range n.ttft {
		w[name] = true
	}
	return w
}

// sampleSuffixes are the endings the exposition adds to a family's name on its samples.
var sampleSuffixes = [...]string{"_total", "_bucket", "_sum", "_count", "_created", "_info", "_gsum", "_gcount"}

// has reports whether name is a wanted family, or one of its samples' names.
func (w wanted) has(name []byte) bool {
	if _, ok := w[string(name)]; ok {
		return true
	}
	for _, s := range sampleSuffixes {
		if base, ok := bytes.CutSuffix(name, []byte(s)); ok {
			if sumOnly, ok := w[string(base)]; ok {
				return !sumOnly || s != "_bucket"
			}
		}
	}
	return false
}

// readWanted reads the page from r and returns the lines Parse may need, in their order, in a
// pooled buffer that the caller hands back with putPage.
func readWanted(r io.Reader, w wanted) (*bytes.Buffer, error) {
	buf := pages.Get().(*bytes.Buffer)
	buf.Reset()
	if _, err := buf.ReadFrom(r); err != nil {
		putPage(buf)
		return nil, err
	}
	page := buf.Bytes()
	out := 0
	for rest := page; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		if keepLine(line, w) {
			out += copy(page[out:], line)
		}
	}
	buf.Truncate(out)
	return buf, nil
}

func putPage(buf *bytes.Buffer) {
	if buf.Cap() <= maxPooledPage {
		pages.Put(buf)
	}
}

// keepLine reports whether a line of the exposition may matter to the snapshot: a sample, HELP
// or TYPE line of a wanted family, or a line whose name it cannot read for sure.
func keepLine(line []byte, w wanted) bool {
	line = bytes.TrimLeft(line, " \t")
	switch {
	case len(bytes.TrimRight(line, "\r\n")) == 0:
		return false // a blank line: the parser skips it
	case line[0] == '#':
		fields := bytes.Fields(line[1:])
		if len(fields) < 2 || (string(fields[0]) != "HELP" && string(fields[0]) != "TYPE") {
			return false // a comment: the parser ignores it
		}
		return !legacyName(fields[1]) || w.has(fields[1])
	}
	end := bytes.IndexAny(line, "{ \t\r\n")
	if end < 0 {
		end = len(line)
	}
	name := line[:end]
	return !legacyName(name) || w.has(name)
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
