package workload

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
)

// A trace file is text, but not always bare UTF-8: traces are kept gzipped, editors on Windows
// start files with a byte order mark, and PowerShell's > writes UTF-16. openText reads the
// first two as they are meant and names the others, with the command that converts them,
// rather than letting the JSON decoder say "invalid character '\x1f'".

// sniffBytes is how much of the input is looked at to tell its encoding and format.
const sniffBytes = 16 << 10

// utf8BOM is the byte order mark some editors put before UTF-8 text.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// openText returns r as UTF-8 text: inflated when it is gzip (told by its magic bytes, so that
// standard input works too), without a leading UTF-8 byte order mark. Text in UTF-16, or data
// compressed another way, is an ErrBadTrace error that says what it is and how to convert it.
// A gzip stream that turns out damaged or cut short fails the read with an ErrBadTrace error.
func openText(r io.Reader) (*bufio.Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, _ := br.Peek(6)
	if bytes.HasPrefix(head, []byte{0x1F, 0x8B}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			if errors.Is(err, gzip.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return nil, badTrace{fmt.Errorf("%w (the gzip file is damaged or cut short)", err)}
			}
			return nil, fmt.Errorf("read trace: %w", err)
		}
		br = bufio.NewReaderSize(gzipText{gz}, 64<<10)
		head, _ = br.Peek(6)
	}
	if err := notText(head); err != nil {
		return nil, badTrace{err}
	}
	if bytes.HasPrefix(head, utf8BOM) {
		_, _ = br.Discard(len(utf8BOM))
	}
	return br, nil
}

// notText says what the input is when its first bytes show it is not UTF-8 text: UTF-16, or
// compressed otherwise than with gzip (inside gzip, too).
func notText(head []byte) error {
	const utf16Fix = "kvroute reads UTF-8: convert it with iconv -f UTF-16 -t UTF-8 FILE > trace.jsonl, or in PowerShell with Get-Content FILE | Set-Content -Encoding utf8 trace.jsonl"
	switch {
	case bytes.HasPrefix(head, []byte{0xFF, 0xFE}) || bytes.HasPrefix(head, []byte{0xFE, 0xFF}):
		return errors.New("the trace is UTF-16 text, with a byte order mark (what Windows PowerShell's > and Out-File write); " + utf16Fix)
	case len(head) >= 2 && (head[0] != 0 && head[1] == 0 || head[0] == 0 && head[1] != 0):
		// UTF-8 text has no NUL byte; UTF-16 has one in every ASCII character.
		return errors.New("the trace is UTF-16 text (it has a NUL byte in every other place); " + utf16Fix)
	}
	for _, c := range []struct {
		magic      []byte
		name, tool string
	}{
		{[]byte{0x28, 0xB5, 0x2F, 0xFD}, "zstd", "zstd -dc"},
		{[]byte("BZh"), "bzip2", "bzip2 -dc"},
		{[]byte{0xFD, '7', 'z', 'X', 'Z', 0x00}, "xz", "xz -dc"},
		{[]byte("PK\x03\x04"), "zip", "unzip -p"},
	} {
		if bytes.HasPrefix(head, c.magic) {
			return fmt.Errorf("the trace is compressed with %s; kvroute reads plain or gzip-compressed text: decompress it first (%s FILE > trace.jsonl, or %s FILE | kvroute ... --trace -)", c.name, c.tool, c.tool)
		}
	}
	return nil
}

// gzipText is a gzip stream whose checksum or header errors, and an end cut short, are bad
// trace errors: the file is at fault, not the machine.
type gzipText struct{ gz *gzip.Reader }

func (g gzipText) Read(p []byte) (int, error) {
	n, err := g.gz.Read(p)
	if err != nil && (errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF)) {
		err = badTrace{fmt.Errorf("%w (the gzip file is damaged or cut short)", err)}
	}
	return n, err
}
