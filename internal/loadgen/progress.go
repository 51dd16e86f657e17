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

// Pacing is how a run sends its requests, as far as its ETA needs it (PacingOf).
type Pacing struct {
	// LastDue is when the last request is due, from the start of the run (an open loop: a
	// trace's times, --speedup or --rate).
	LastDue time.Duration
	// Concurrency is the number of workers of a closed loop; 0 for an open loop.
	Concurrency int
	// Duration is the time after which no request is sent (Config.Duration; 0: no bound).
	Duration time.Duration
}

// PacingOf is the pacing with which Run sends items under cfg.
func PacingOf(cfg Config, items []Item) Pacing {
	p := Pacing{Concurrency: cfg.Concurrency, Duration: cfg.Duration}
	if cfg.Concurrency > 0 {
		return p
	}
	for i := range items {
		if at := items[i].At; (cfg.Duration <= 0 || at < cfg.Duration) && at > p.LastDue {
			p.LastDue = at
		}
	}
	return p
}

// Progress reports a run's progress as records arrive. Feed it from Config.OnRecord and call
// Finish at the end. It is safe for concurrent use.
//
// Its ETA comes from the run's pacing when SetPacing gave it: an open loop ends when its last
// request is due plus the time a request takes from its due time to its end (the tail,
// measured on the requests finished); a closed loop takes the tail once per request left, over
// its workers. Without a pacing it comes from the completion rate since the first completion,
// once minRateSamples requests finished. Until it can be estimated it shows "?".
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
	barETA   string // the ETA in the bar's description

	pacing Pacing
	paced  bool
	// tail is the mean time from a request's due time to its end, over the requests done: the
	// first tailWindow of them, then a moving average that follows a target falling behind.
	tail      float64   // seconds
	firstDone time.Time // when the first request finished
}

// tailWindow is the number of requests the tail is averaged over (an exponential moving
// average with weight 1/tailWindow once that many finished).
const tailWindow = 16

// minRateSamples is how many requests must have finished before an ETA from the completion
// rate alone is shown.
const minRateSamples = 10

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
			// The bar's own prediction divides the requests left by its rate so far, which is far
			// off while the first requests are in flight: the ETA is in the description.
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
	}
	return p
}

// SetPacing tells p how the run sends its requests (PacingOf), for its ETA. Call it before the
// run starts.
func (p *Progress) SetPacing(pc Pacing) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pacing, p.paced = pc, true
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
	t := p.now()
	if p.done == 0 {
		p.firstDone = t
	}
	p.done++
	if !r.OK() {
		p.errs++
	}
	p.tail += ((r.Sent + r.E2E - r.Scheduled).Seconds() - p.tail) / float64(min(p.done, tailWindow))
	switch p.mode {
	case ProgressBar:
		if eta := p.eta(t); !r.OK() || eta != p.barETA {
			p.barETA = eta
			p.bar.Describe(p.barLabel())
		}
		_ = p.bar.Add(1)
	case ProgressLines:
		if t.Sub(p.lastLine) >= p.interval {
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

// barLabel is the bar's description: the label, with the ETA, the errors and the cancelled
// requests when there are any.
func (p *Progress) barLabel() string {
	var notes []string
	if p.barETA != "" && p.canceled == 0 {
		notes = append(notes, "eta "+p.barETA)
	}
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
	eta := p.eta(t)
	canceled := ""
	if p.canceled > 0 {
		canceled = fmt.Sprintf(", %d cancelled", p.canceled)
		eta = "-" // the run is over: the rest will not be sent
	}
	fmt.Fprintf(p.w, "%s: %d/%d requests, %d errors%s, %.1f req/s, elapsed %s, eta %s\n",
		p.label, p.done, p.total, p.errs, canceled, rate, el.Round(time.Second), eta)
}

// eta is the time the run has left at t, as printed: "12s", or "?" when it is not known yet.
func (p *Progress) eta(t time.Time) string {
	left := p.total - p.done
	if left <= 0 {
		return "0s"
	}
	el := t.Sub(p.start)
	tail := time.Duration(p.tail * float64(time.Second))
	var d time.Duration
	switch {
	case p.paced && p.done == 0:
		return "?"
	case p.paced && p.pacing.Concurrency == 0:
		// The last request ends a tail after it is due. A run past that with requests left
		// has stragglers, whose end nothing here tells.
		d = p.pacing.LastDue + tail - el
		if d < 0 {
			return "?"
		}
	case p.paced:
		d = time.Duration(float64(tail) * float64(left) / float64(p.pacing.Concurrency))
		if dur := p.pacing.Duration; dur > 0 {
			d = min(d, max(dur-el, 0)+tail)
		}
	default:
		// The completion rate from the start would count the first request's whole time as
		// a wait between completions: the rate since the first completion does not, once the
		// window is as long as that wait.
		win := t.Sub(p.firstDone)
		if p.done < minRateSamples || win <= 0 || win < p.firstDone.Sub(p.start) {
			return "?"
		}
		rate := float64(p.done-1) / win.Seconds()
		d = time.Duration(float64(left) / rate * float64(time.Second))
	}
	return d.Round(time.Second).String()
}
