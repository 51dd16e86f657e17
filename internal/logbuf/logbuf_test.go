package logbuf

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the timer's goroutine and the test's.
type syncBuffer struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return s.b.Write(p)
}

func (s *syncBuffer) get() (string, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String(), s.writes
}

func TestBatchesAndFlushesAfterInterval(t *testing.T) {
	var out syncBuffer
	w := New(&out, 50*time.Millisecond, 1<<20)
	defer w.Close()
	for i := range 100 {
		fmt.Fprintf(w, "line %d\n", i)
	}
	if s, _ := out.get(); s != "" {
		t.Fatalf("written before the interval: %q", s)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, writes := out.get()
		if strings.Count(s, "\n") == 100 {
			if writes != 1 {
				t.Errorf("100 lines took %d writes, want 1", writes)
			}
			if !strings.HasPrefix(s, "line 0\n") || !strings.HasSuffix(s, "line 99\n") {
				t.Errorf("lines out of order: %q...", s[:20])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not flushed within 5 s: %q", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A later line starts a new batch, which is flushed too.
	fmt.Fprintln(w, "later")
	for deadline = time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s, _ := out.get(); strings.HasSuffix(s, "later\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second batch was not flushed")
		}
	}
}

func TestFlushesWhenFull(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 100)
	defer w.Close()
	line := strings.Repeat("x", 39) + "\n"
	for range 3 { // 120 bytes: past the 100-byte size on the third
		w.Write([]byte(line))
	}
	if s, writes := out.get(); len(s) != 120 || writes != 1 {
		t.Errorf("got %d bytes in %d writes, want 120 in 1", len(s), writes)
	}
}

func TestCloseFlushesThenWritesThrough(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 1<<20)
	w.Write([]byte("a\n"))
	w.Close()
	if s, _ := out.get(); s != "a\n" {
		t.Fatalf("after Close: %q", s)
	}
	w.Write([]byte("b\n"))
	if s, _ := out.get(); s != "a\nb\n" {
		t.Errorf("after Close, a write is not written through: %q", s)
	}
}

func TestConcurrentWritesKeepLinesWhole(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Millisecond, 256)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				fmt.Fprintf(w, "g%d-%d|%s\n", g, i, strings.Repeat("y", g*3))
			}
		})
	}
	wg.Wait()
	w.Close()
	s, _ := out.get()
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 1600 {
		t.Fatalf("%d lines, want 1600", len(lines))
	}
	for _, l := range lines {
		var g, i int
		var tail string
		if _, err := fmt.Sscanf(l, "g%d-%d|%s", &g, &i, &tail); err != nil && g != 0 {
			t.Fatalf("broken line %q", l)
		}
		if len(tail) != g*3 {
			t.Fatalf("broken line %q", l)
		}
	}
}
