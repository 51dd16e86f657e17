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
	// The first line finds the writer idle and goes out at once; the rest wait for a line an
	// interval after it, or for the timer (ten intervals).
	if s, writes := out.get(); s != "line 0\n" || writes != 1 {
		t.Fatalf("before the interval: %q in %d writes, want the first line alone", s, writes)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, writes := out.get()
		if strings.Count(s, "\n") == 100 {
			if writes != 2 {
				t.Errorf("100 lines took %d writes, want 2 (the first line, then a batch)", writes)
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
	// A line right after the batch was written starts a new batch, which is flushed too.
	fmt.Fprintln(w, "later")
	if s, _ := out.get(); strings.HasSuffix(s, "later\n") {
		t.Error("a line right after a batch was written at once, not batched")
	}
	for deadline = time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s, _ := out.get(); strings.HasSuffix(s, "later\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second batch was not flushed")
		}
	}
}

// A line that comes an interval or more after the last write goes out at once: no timer has to
// wake an idle process to write it.
func TestWritesThroughWhenIdle(t *testing.T) {
	var out syncBuffer
	const interval = 20 * time.Millisecond
	w := New(&out, interval, 1<<20)
	defer w.Close()
	for i := range 3 {
		start := time.Now()
		fmt.Fprintf(w, "idle %d\n", i)
		if s, writes := out.get(); !strings.HasSuffix(s, fmt.Sprintf("idle %d\n", i)) || writes != i+1 {
			t.Fatalf("line %d after an idle interval: %q in %d writes, want it written at once", i, s, writes)
		}
		for time.Since(start) < interval { // the clock, not another goroutine, is waited for
			time.Sleep(interval / 4)
		}
	}
}

// Lines that wait go out with the first line that comes an interval or more after the last
// write, in one write and in order, without a timer.
func TestWaitingLinesGoWithTheNextLine(t *testing.T) {
	var out syncBuffer
	const interval = 20 * time.Millisecond
	w := New(&out, interval, 1<<20)
	w.maxWait = time.Hour // only a line can take the waiting ones along
	defer w.Close()
	start := time.Now()
	w.Write([]byte("a\n")) // at once: nothing written yet
	w.Write([]byte("b\n"))
	w.Write([]byte("c\n"))
	if s, writes := out.get(); s != "a\n" || writes != 1 {
		t.Fatalf("within the interval: %q in %d writes, want the first line alone", s, writes)
	}
	for time.Since(start) < interval { // the clock, not another goroutine, is waited for
		time.Sleep(interval / 4)
	}
	w.Write([]byte("d\n"))
	if s, writes := out.get(); s != "a\nb\nc\nd\n" || writes != 2 {
		t.Errorf("a line an interval later: %q in %d writes, want the waiting lines with it in one", s, writes)
	}
}

// When no line comes to take them along, the timer writes the waiting lines: not before its
// time, and in one write.
func TestTimerWritesWaitingLines(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 1<<20)
	const wait = 30 * time.Millisecond
	w.maxWait = wait
	defer w.Close()
	w.Write([]byte("a\n")) // at once: nothing written yet
	armed := time.Now()
	w.Write([]byte("b\n"))
	w.Write([]byte("c\n"))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		s, writes := out.get()
		if s == "a\nb\nc\n" {
			if since := time.Since(armed); since < wait {
				t.Errorf("the waiting lines went out %v after the first of them, before the timer's %v", since, wait)
			}
			if writes != 2 {
				t.Errorf("%d writes, want 2 (the first line, then the timer's batch)", writes)
			}
			break
		}
		if s != "a\n" || time.Now().After(deadline) {
			t.Fatalf("got %q in %d writes, want the waiting lines written by the timer within 5 s", s, writes)
		}
	}
	// The timer is set again for the next line that waits.
	w.Write([]byte("d\n"))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if s, _ := out.get(); s == "a\nb\nc\nd\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a line that waited after the timer's batch was not written")
		}
	}
}

func TestFlushesWhenFull(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 100)
	defer w.Close()
	line := strings.Repeat("x", 39) + "\n"
	for range 4 { // the first goes out at once; 120 bytes wait after the fourth: past 100
		w.Write([]byte(line))
	}
	if s, writes := out.get(); len(s) != 160 || writes != 2 {
		t.Errorf("got %d bytes in %d writes, want 160 in 2", len(s), writes)
	}
}

func TestCloseFlushesThenWritesThrough(t *testing.T) {
	var out syncBuffer
	w := New(&out, time.Hour, 1<<20)
	w.Write([]byte("a\n")) // at once: nothing written yet
	w.Write([]byte("b\n")) // waits for the hour
	if s, _ := out.get(); s != "a\n" {
		t.Fatalf("before Close: %q", s)
	}
	w.Close()
	if s, _ := out.get(); s != "a\nb\n" {
		t.Fatalf("after Close: %q", s)
	}
	w.Write([]byte("c\n"))
	if s, _ := out.get(); s != "a\nb\nc\n" {
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
