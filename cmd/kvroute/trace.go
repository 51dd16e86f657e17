package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"

	"github.com/kvroute/kvroute/internal/workload"
)

// A --trace of "-" reads the trace from standard input, in every verb that takes --trace.
// analyze reads it there directly; the others hand their trace to package experiment, which
// opens it by path, so they read standard input once, check it, and keep it in a temporary
// file that experiment opens instead (spoolTrace).

// stdinTrace is the --trace value that means standard input.
const stdinTrace = "-"

// stdinTraceName is what reports call a trace read from standard input, where they would give
// a file's base name: the temporary file is called that.
const stdinTraceName = "stdin"

// stdinTraceHelp ends the help of every --trace flag.
const stdinTraceHelp = `; "-" reads it from standard input`

// checkStdin refuses a terminal as the trace's input: nobody types a trace, and the verb
// would seem to hang until Ctrl-D.
func checkStdin(stdin io.Reader, verb string) error {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return usageErr("--trace -: standard input is a terminal: pipe the trace in (%s --trace - < trace.jsonl) or give its path", verb)
	}
	return nil
}

// spooledTrace is a trace read from standard input and kept in a temporary file.
type spooledTrace struct {
	dir, path string
}

// spoolTrace reads the Mooncake trace on stdin to its end and keeps it in a temporary file,
// whose path the verb gives experiment as its trace; remove deletes it. The trace is checked
// as it is copied, so that a bad line or a trace without a request is reported as standard
// input's (experiment would name the temporary file). A large trace costs its size on disk, not
// in memory: only the check's requests are held, and dropped at once.
func spoolTrace(stdin io.Reader, verb string) (*spooledTrace, error) {
	if err := checkStdin(stdin, verb); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvroute-trace-")
	if err != nil {
		return nil, fmt.Errorf("--trace -: keep standard input in a temporary file: %w", err)
	}
	s := &spooledTrace{dir: dir, path: filepath.Join(dir, stdinTraceName)}
	fh, err := os.Create(s.path)
	if err == nil {
		_, err = workload.ReadMooncake(io.TeeReader(stdin, fh))
		if cerr := fh.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("keep it in a temporary file: %w", cerr)
		}
	}
	if err != nil {
		s.remove()
		return nil, fmt.Errorf("standard input: %w", err)
	}
	return s, nil
}

// spoolIfStdin spools the trace (spoolTrace) when *trace is "-", and points *trace at the
// temporary file; nil otherwise. The caller removes it.
func spoolIfStdin(trace *string, stdin io.Reader, verb string) (*spooledTrace, error) {
	if *trace != stdinTrace {
		return nil, nil
	}
	s, err := spoolTrace(stdin, verb)
	if err != nil {
		return nil, err
	}
	*trace = s.path
	return s, nil
}

// remove deletes the temporary file; on a nil s it does nothing.
func (s *spooledTrace) remove() {
	if s != nil {
		_ = os.RemoveAll(s.dir)
	}
}

// explain has err name standard input where it names the temporary file (a bench prompt too
// long for a server, say); errors.Is and errors.As see err as it was.
func (s *spooledTrace) explain(err error) error {
	if s == nil || err == nil || !strings.Contains(err.Error(), s.path) {
		return err
	}
	return renamedError{err, strings.ReplaceAll(err.Error(), s.path, "standard input")}
}

// renamedError is an error with another message.
type renamedError struct {
	err error
	msg string
}

func (e renamedError) Error() string { return e.msg }
func (e renamedError) Unwrap() error { return e.err }
