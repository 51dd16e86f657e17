//go:build linux && (amd64 || arm64)

package logbuf

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Lines written to a regular file go out raw, whole and in order.
func TestRawWritesToAFile(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := New(f, time.Hour, 1<<20)
	if w.raw == nil || w.raw.poll {
		t.Fatalf("raw writer for a regular file: %+v, want one that does not poll", w.raw)
	}
	if n := w.raw.write([]byte("a\n")); n != 2 {
		t.Fatalf("raw write of 2 bytes wrote %d", n)
	}
	w.Write([]byte("b\n")) // at once: nothing written through w yet
	w.Write([]byte("c\n")) // waits for the hour, or Close
	w.Write([]byte(strings.Repeat("x", 2*pipeBuf) + "\n"))
	w.Close()
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if want := "a\nb\nc\n" + strings.Repeat("x", 2*pipeBuf) + "\n"; string(got) != want {
		t.Errorf("file holds %d bytes %q..., want %d", len(got), got[:min(len(got), 12)], len(want))
	}
}

// A full pipe is not written raw (the write would block holding the runtime's P): the raw
// writer writes nothing and the line goes through the file, which waits for the reader.
func TestRawSkipsAFullPipe(t *testing.T) {
	r, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer pw.Close()
	w := New(pw, time.Hour, 1<<20)
	if w.raw == nil || !w.raw.poll {
		t.Fatalf("raw writer for a pipe: %+v, want one that polls", w.raw)
	}
	if n := w.raw.write([]byte("a\n")); n != 2 {
		t.Fatalf("raw write to an empty pipe wrote %d of 2 bytes", n)
	}
	// Fill the pipe (os.Pipe's ends are non-blocking), bounded by the largest pipe Linux makes.
	rc, err := pw.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fill := bytes.Repeat([]byte("f"), 4096)
	filled := 2
	for i := 0; i < 1<<14; i++ {
		var n int
		var werr error
		_ = rc.Write(func(fd uintptr) bool {
			n, werr = syscall.Write(int(fd), fill)
			return true // never wait: EAGAIN says full
		})
		if werr != nil {
			break
		}
		filled += n
	}
	if n := w.raw.write([]byte("b\n")); n != 0 {
		t.Fatalf("raw write to a full pipe wrote %d bytes, want 0", n)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Write([]byte("b\n")) // through the file: waits for the reader below
	}()
	got := make([]byte, 0, filled+2)
	buf := make([]byte, 64<<10)
	for len(got) < filled+2 {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	<-done
	if !bytes.HasPrefix(got, []byte("a\n")) || !bytes.HasSuffix(got, []byte("fb\n")) {
		t.Errorf("the pipe carried %q...%q, want the first line, the fill, then the second line", got[:4], got[len(got)-4:])
	}
}

// A writer that is not a file, or a terminal-like file, gets no raw writer.
func TestRawOnlyForFilesThatCannotBlock(t *testing.T) {
	if w := New(io.Discard, 0, 0); w.raw != nil {
		t.Error("raw writer for io.Discard")
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if w := New(f, 0, 0); w.raw != nil {
		t.Error("raw writer for a character device")
	}
}
