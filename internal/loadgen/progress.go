package loadgen

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// ProgressMode is how a run reports progress.
type ProgressMode int

const (
	// ProgressNone prints nothing (--quiet).
	ProgressNone ProgressMode = iota
	// ProgressLines prints one plain line every interval (stderr is not a terminal).
	ProgressLines
	// ProgressBar draws a progress bar with rate, errors and ETA (stderr is a terminal).
	ProgressBar
)

// Progress reports a run's progress as records arrive. Feed it from Config.OnRecord and call
// Finish at the end. It is safe for concurrent use.
type Progress struct {
	mu       sync.Mutex
	w        io.Writer
	mode     ProgressMode
	label    string
	total    int
	interval time.Duration
	now      func() time.Time
	start    time.Time
	lastLine time.Time
	done     int
	errs     int
	canceled int // in flight when the run was cancelled: neither done nor failed
	bar      *progressbar.ProgressBar
}

// NewProgress reports on w the progress of a run of total requests, labelled label. In line
// mode it prints at most one line per interval (default 5 s). now is the clock (nil: time.Now).
func NewProgress(w io.Writer, mode ProgressMode, label string, total int, interval time.Duration, now func() time.Time) *Progress {
	if now == nil {
		now = time.Now
	}
	if interval <= 0 {
		interval = 5 * time.Second
	}
	p := &Progress{w: w, mode: mode, label: label, total: total, interval: interval, now: now}
	p.start = now()
	p.lastLine = p.start
	if mode == ProgressBar {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(label),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("req"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
	}
	return p
}

// Record counts one finished request. A request the run's cancellation cut short
// (ClassCanceled, at Ctrl-C) is counted apart: it did not fail, and it did not finish.
func (p *Progress) Record(r Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Class == ClassCanceled {
		p.canceled++
		if p.mode == ProgressBar {
			p.bar.Describe(p.barLabel())
		}
		return
	}
	p.done++
	if !r.OK() {
		p.errs++
	}
	switch p.mode {
	case ProgressBar:
		if !r.OK() {
			p.bar.Describe(p.barLabel())
		}
		_ = p.bar.Add(1)
	case ProgressLines:
		if t := p.now(); t.Sub(p.lastLine) >= p.interval {
			p.lastLine = t
			p.line(t)
		}
	}
}

// Finish prints the closing line (or completes the bar).
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.mode {
	case ProgressBar:
		if p.canceled > 0 {
			// Interrupted: a bar filled to the end would say every request was sent; the
			// line says how far the run got.
			fmt.Fprintln(p.w)
			p.line(p.now())
			return
		}
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	case ProgressLines:
		p.line(p.now())
	}
}

// barLabel is the bar's description: the label, with the errors and the cancelled requests
// when there are any.
func (p *Progress) barLabel() string {
	var notes []string
	if p.errs > 0 {
		notes = append(notes, fmt.Sprintf("%d errors", p.errs))
	}
	if p.canceled > 0 {
		notes = append(notes, fmt.Sprintf("%d cancelled", p.canceled))
	}
	if len(notes) == 0 {
		return p.label
	}
	return fmt.Sprintf("%s (%s)", p.label, strings.Join(notes, ", "))
}

// line prints "label: done/total requests, errors[, cancelled], rate, eta".
func (p *Progress) line(t time.Time) {
	el := t.Sub(p.start)
	rate := 0.0
	if el > 0 {
		rate = float64(p.done) / el.Seconds()
	}
	eta := "?"
	if rate > 0 && p.total >= p.done {
		eta = time.Duration(float64(p.total-p.done) / rate * float64(time.Second)).Round(time.Second).String()
	}
	canceled := ""
	if p.canceled > 0 {
		canceled = fmt.Sprintf(", %d cancelled", p.canceled)
		eta = "-" // the run is over: the rest will not be sent
	}
	fmt.Fprintf(p.w, "%s: %d/%d requests, %d errors%s, %.1f req/s, elapsed %s, eta %s\n",
		p.label, p.done, p.total, p.errs, canceled, rate, el.Round(time.Second), eta)
}
