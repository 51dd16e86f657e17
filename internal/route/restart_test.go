package route

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// TestCheckEndsARestart, step by step: an ejection whose failures mix ones that say the engine
// was unreachable or died (refused, lost, cut) with answers (a 503, a 5xx, a timeout), as a
// restarted engine gives (its streams cut, its connections refused, then llama.cpp's 503
// "Loading model" while it loads), is ended by a passing check only where a check sent since
// the failures began failed first: the checks saw the engine down, then up. A passing check
// alone ends it not (an engine failing requests behind a live /health), nor one sent before
// the failed one, nor a failed check sent before the failures began (here all at the
// ejection's instant; checks sent between them: TestCheckDuringTheRun). 503s alone (a
// llama.cpp restarted between requests: no cut, no refusal) end at a passing check only where
// the first check that told anything failed not ready (a 5xx, a refused connection; a timeout
// or a 4xx tells nothing): it was still loading when ejected. Other answers alone (a 5xx, a
// timeout, 503s among them or not) run their time whatever the checks say; unreachable
// failures alone end at any passing check, as before.
func TestCheckEndsARestart(t *testing.T) {
	type check struct {
		at     time.Duration // sent, after the ejection began (negative: before)
		passed bool
		why    CheckFailure // how it failed
	}
	fail := func(at time.Duration) check { return check{at, false, check503} }
	failAs := func(at time.Duration, why CheckFailure) check { return check{at, false, why} }
	pass := func(at time.Duration) check { return check{at, true, CheckFailure{}} }
	for _, tc := range []struct {
		name       string
		own, peers []Failure
		checks     []check
		ends       bool // ended by the last check
	}{
		{name: "cut, refused, 503: passed", own: []Failure{FailCut, FailConnect, FailUnavailable},
			checks: []check{pass(time.Second)}},
		{name: "cut, refused, 503: failed, passed", own: []Failure{FailCut, FailConnect, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		{name: "refused, refused, timeout: failed, passed", own: []Failure{FailConnect, FailConnect, FailTimeout},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		{name: "lost, 5xx, lost: failed twice, passed", own: []Failure{FailLost, FailStatus, FailLost},
			checks: []check{fail(time.Second), fail(6 * time.Second), pass(11 * time.Second)}, ends: true},
		{name: "peers cut and 503: failed, passed", peers: []Failure{FailCut, FailUnavailable, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		{name: "cut here, 503 at peers: failed, passed", own: []Failure{FailCut}, peers: []Failure{FailUnavailable, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		// The checks heard out of order: the one that passed was sent before the one that failed.
		{name: "cut, refused, 503: passed, then failed", own: []Failure{FailCut, FailConnect, FailUnavailable},
			checks: []check{fail(6 * time.Second), pass(time.Second)}},
		{name: "cut, refused, 503: failed before the ejection, passed", own: []Failure{FailCut, FailConnect, FailUnavailable},
			checks: []check{fail(-time.Second), fail(0), pass(time.Second)}},
		{name: "503s: failed, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		{name: "503s: failed twice, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{fail(time.Second), fail(6 * time.Second), pass(11 * time.Second)}, ends: true},
		{name: "peers 503s: failed, passed", peers: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
		// The first check passed: the engine was ready, and answers 503 behind a /health that
		// fails now and then.
		{name: "503s: passed, failed, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{pass(time.Second), fail(6 * time.Second), pass(11 * time.Second)}},
		{name: "503s: failed, passed, heard before the failed one", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{fail(6 * time.Second), pass(time.Second), pass(11 * time.Second)}},
		{name: "503s: failed before the ejection, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{fail(-time.Second), fail(0), pass(time.Second)}},
		// How the checks failed: not ready or down (a 5xx, refused) counts; a timeout, an
		// overloaded engine's /health as much as a loading one's, does not, nor does a 4xx.
		{name: "503s: timed out, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, checkTimeout), pass(6 * time.Second)}},
		{name: "503s: timed out twice, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, checkTimeout), failAs(6*time.Second, checkTimeout), pass(11 * time.Second)}},
		{name: "503s: 404, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, CheckFailure{Status: 404}), pass(6 * time.Second)}},
		{name: "503s: 504, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, CheckFailure{Status: 504}), pass(6 * time.Second)}},
		{name: "503s: timed out, failed, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, checkTimeout), fail(6 * time.Second), pass(11 * time.Second)}, ends: true},
		{name: "503s: timed out, passed, failed, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, checkTimeout), pass(6 * time.Second), fail(11 * time.Second), pass(16 * time.Second)}},
		{name: "503s: 500, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, CheckFailure{Status: 500}), pass(6 * time.Second)}, ends: true},
		{name: "503s: refused, passed", own: []Failure{FailUnavailable, FailUnavailable, FailUnavailable},
			checks: []check{failAs(time.Second, checkRefused), pass(6 * time.Second)}, ends: true},
		{name: "cut, refused, 503: timed out, passed", own: []Failure{FailCut, FailConnect, FailUnavailable},
			checks: []check{failAs(time.Second, checkTimeout), pass(6 * time.Second)}, ends: true},
		{name: "503s and a 5xx: failed, passed", own: []Failure{FailUnavailable, FailStatus, FailUnavailable},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "503s and a timeout: failed, passed", own: []Failure{FailUnavailable, FailUnavailable, FailTimeout},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "503 here, 5xx at peers: failed, passed", own: []Failure{FailUnavailable}, peers: []Failure{FailStatus, FailStatus},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "5xx: failed, passed", own: []Failure{FailStatus, FailStatus, FailStatus},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "timeouts: failed, passed", own: []Failure{FailTimeout, FailTimeout, FailTimeout},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "5xx and timeouts: failed, passed", own: []Failure{FailStatus, FailTimeout, FailStatus},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "peers 5xx: failed, passed", peers: []Failure{FailStatus, FailStatus, FailStatus},
			checks: []check{fail(time.Second), pass(6 * time.Second)}},
		{name: "refused: passed", own: []Failure{FailConnect, FailConnect, FailConnect},
			checks: []check{pass(time.Second)}, ends: true},
		{name: "refused: failed, passed", own: []Failure{FailConnect, FailConnect, FailConnect},
			checks: []check{fail(time.Second), pass(6 * time.Second)}, ends: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &stepClock{t: time.Unix(100, 0)}
			a := pool(t, "a", "b", "c")[0]
			o := NewOutlier(OutlierConfig{Consecutive: 3, Fleet: func() int { return 3 }}, clk)
			for _, f := range tc.own {
				o.Failed(a, f)
			}
			for _, f := range tc.peers {
				o.PeerFailed(a, f)
			}
			began := clk.t
			if !o.Ejected(a, began) {
				t.Fatal("a not ejected")
			}
			for i, c := range tc.checks {
				clk.t = began.Add(max(c.at, 0) + 500*time.Millisecond) // heard as answered
				if !c.passed {
					o.HealthFailed(a, began.Add(c.at), c.why)
					continue
				}
				ended := o.HealthPassed(a, began.Add(c.at))
				if last := i == len(tc.checks)-1; ended != (last && tc.ends) {
					t.Fatalf("check %d (passed, sent %v after the ejection began) ended it: %v, want %v", i, c.at, ended, last && tc.ends)
				}
			}
			if got := o.Ejected(a, clk.t); got == tc.ends {
				t.Errorf("a ejected after the checks: %v, want %v", got, !tc.ends)
			}
		})
	}
}

// TestCheckBackAfterARestart: a restart the checks saw (failed, then passed) takes the engine
// back; if it then fails again before it has served passive_failures attempts in a row (it
// dies at each request), its next ejection runs its time whatever the checks say, as after any
// ejection a check ended. Once it has served so, a restart is again ended by the checks.
func TestCheckBackAfterARestart(t *testing.T) {
	clk := &stepClock{t: time.Unix(100, 0)}
	a := pool(t, "a", "b", "c")[0]
	var told []string
	o := NewOutlier(OutlierConfig{Consecutive: 3, Fleet: func() int { return 3 },
		OnReadmit: func(ep *endpoint.Endpoint, byCheck bool) { told = append(told, fmt.Sprintf("by check %v", byCheck)) }}, clk)
	restart := func() (ended bool) {
		t.Helper()
		for _, f := range []Failure{FailCut, FailConnect, FailUnavailable} {
			o.Failed(a, f)
		}
		began := clk.t
		if !o.Ejected(a, began) {
			t.Fatal("a not ejected")
		}
		o.HealthFailed(a, began.Add(time.Second), checkRefused)
		clk.t = began.Add(6 * time.Second)
		return o.HealthPassed(a, clk.t)
	}
	if !restart() {
		t.Fatal("a restart the checks saw not ended by the passing check")
	}
	o.Succeeded(a)
	if restart() {
		t.Fatal("a check ended an ejection that came one success after a check readmitted a")
	}
	clk.t = clk.t.Add(2 * DefaultBaseEjection)
	if o.Ejected(a, clk.t) {
		t.Fatal("a still ejected after its second ejection's time")
	}
	for range 3 {
		o.Succeeded(a)
	}
	if !restart() {
		t.Fatal("a restart after a had served 3 in a row not ended by the checks")
	}
	want := []string{"by check true", "by check false", "by check true"}
	if fmt.Sprint(told) != fmt.Sprint(want) {
		t.Errorf("OnReadmit: %v, want %v", told, want)
	}
}

// restartRun runs engine a restarting three times, a minute apart, beside b and c, on a step
// clock of 100 ms: at each restart the attempt in flight is cut, its connections are refused
// for 500 ms, then it answers down (FailUnavailable: llama.cpp's 503 "Loading model"; or
// FailTimeout, hanging) for load, and serves from then on. A third of 10 requests a second go
// to a while it is in rotation (one each 300 ms); its health check, every 5 s (2.5 s after
// each restart, sent and answered at once), fails while it is down or loading (refused, then
// as its requests do: a 503, a timeout, a 500), and passes otherwise. failedTold says whether
// the Outlier hears of failed checks (HealthFailed; a4f56b6 heard only of passing ones). It returns, for each restart, how long a stayed ejected after
// its engine was ready (up to the next restart, or the end of the run, 5 minutes), and a's
// failed attempts.
func restartRun(t *testing.T, down Failure, load time.Duration, failedTold bool) (outAfterReady []time.Duration, failed int) {
	t.Helper()
	return restartRunWith(t, down, 500*time.Millisecond, load, failedTold)
}

// restartRunWith is restartRun with connections refused for refused after each restart; with
// refused 0, the restart happened between two of a's requests: none is cut, none refused, and
// the router sees only the engine's answers while it loads (a quick restart, or a model
// reloaded in place).
func restartRunWith(t *testing.T, down Failure, refused, load time.Duration, failedTold bool) (outAfterReady []time.Duration, failed int) {
	t.Helper()
	start := time.Unix(1000, 0)
	clk := &stepClock{t: start}
	a := pool(t, "a", "b", "c")[0]
	o := NewOutlier(OutlierConfig{Consecutive: 3, Fleet: func() int { return 3 }}, clk)
	const (
		step     = 100 * time.Millisecond
		every    = 300 * time.Millisecond
		interval = 5 * time.Second
		run      = 5 * time.Minute
	)
	restarts := []time.Duration{30 * time.Second, 90 * time.Second, 150 * time.Second}
	outAfterReady = make([]time.Duration, len(restarts))
	served := make([]bool, len(restarts)) // a served again after restart i
	nextReq, nextCheck := start.Add(every), start.Add(2500*time.Millisecond)
	cut := -1 // the last restart whose stream in flight was cut
	for tick := time.Duration(0); tick < run; tick += step {
		clk.t = clk.t.Add(step)
		// The engine's last restart so far (-1: none), and where it is: refused, loading or
		// serving.
		r, phase := -1, "serving"
		for i, at := range restarts {
			if since := clk.t.Sub(start.Add(at)); since >= 0 {
				r, phase = i, "serving"
				switch {
				case since < refused:
					phase = "refused"
				case since < refused+load:
					phase = "loading"
				}
			}
		}
		if !clk.t.Before(nextCheck) {
			switch {
			case phase == "serving":
				o.HealthPassed(a, nextCheck)
			case !failedTold:
			case phase == "refused":
				o.HealthFailed(a, nextCheck, checkRefused)
			case down == FailTimeout: // it hangs its /health too while it loads
				o.HealthFailed(a, nextCheck, checkTimeout)
			case down == FailStatus: // it answers 500 to its /health too
				o.HealthFailed(a, nextCheck, CheckFailure{Status: 500})
			default: // llama.cpp's 503 "Loading model"
				o.HealthFailed(a, nextCheck, check503)
			}
			nextCheck = nextCheck.Add(interval)
		}
		if r >= 0 && phase == "serving" && !served[r] {
			outAfterReady[r] = clk.t.Sub(start.Add(restarts[r] + refused + load))
		}
		if clk.t.Before(nextReq) {
			continue
		}
		nextReq = nextReq.Add(every)
		if o.Ejected(a, clk.t) {
			continue
		}
		switch {
		case phase == "serving":
			if r >= 0 {
				served[r] = true
			}
			o.Succeeded(a)
		case cut != r && refused > 0:
			cut = r
			failed++
			o.Failed(a, FailCut)
		case phase == "refused":
			failed++
			o.Failed(a, FailConnect)
		default:
			failed++
			o.Failed(a, down)
		}
	}
	return outAfterReady, failed
}

// TestRestartReadmitted: the reviewer's case, an engine restarted under load that answers 503
// while it loads its model (llama.cpp) or lets requests hang, is ejected on [cut, refused, 503]
// (or a timeout). Before, its passing check ended nothing, and it stayed out for the whole
// ejection after it was ready, longer at each restart (three restarts a minute apart, loading
// 8 s: 22.1 s, 51.4 s, 1 m 22.7 s). Its failed checks told, it is back within a health interval
// of being ready (4.1 s each time), at no more failed attempts (9).
func TestRestartReadmitted(t *testing.T) {
	for _, down := range []Failure{FailUnavailable, FailTimeout} {
		before, failedBefore := restartRun(t, down, 8*time.Second, false)
		now, failedNow := restartRun(t, down, 8*time.Second, true)
		t.Logf("%v while loading: out after ready %v, %d failed attempts (failed checks not told, a4f56b6); %v, %d told",
			down, before, failedBefore, now, failedNow)
		for i, d := range now {
			if d > 5*time.Second {
				t.Errorf("%v: restart %d: out %v after the engine was ready, want within a health interval (5 s)", down, i+1, d)
			}
		}
		if failedNow > failedBefore {
			t.Errorf("%v: %d failed attempts with failed checks told, %d without", down, failedNow, failedBefore)
		}
	}
}

// TestQuickRestartReadmitted: a llama.cpp restarted between two of the router's requests (or
// reloading its model) cuts no stream and refuses no connection: the router sees only its 503
// "Loading model" answers, and ejects it on 503s alone, while its health check fails too
// until the model is loaded. Before, such an ejection ran its time as answers alone do
// (three restarts a minute apart, loading 8 s: out 22.6 s, 51.9 s, 1 m 23.2 s after it was
// ready); now a passing check after the failed ones ends it, within a health interval (5 s) of
// the engine being ready (4.6 s each time), at the same 9 failed attempts; the same since the
// checks say why they failed (theirs fail by a 503, which says not ready).
// An engine that lets requests hang as it loads (timeouts alone), or answers 500, is no
// "not ready" answer: its ejection runs its time as before.
func TestQuickRestartReadmitted(t *testing.T) {
	for _, load := range []time.Duration{3 * time.Second, 8 * time.Second, 20 * time.Second} {
		before, failedBefore := restartRunWith(t, FailUnavailable, 0, load, false)
		now, failedNow := restartRunWith(t, FailUnavailable, 0, load, true)
		t.Logf("503s alone, loading %v: out after ready %v, %d failed attempts (failed checks not told); %v, %d told",
			load, before, failedBefore, now, failedNow)
		for i, d := range now {
			if d > 5*time.Second {
				t.Errorf("loading %v: restart %d: out %v after the engine was ready, want within a health interval (5 s)", load, i+1, d)
			}
		}
		if failedNow > failedBefore {
			t.Errorf("loading %v: %d failed attempts with failed checks told, %d without", load, failedNow, failedBefore)
		}
	}
	for _, down := range []Failure{FailTimeout, FailStatus} {
		out, _ := restartRunWith(t, down, 0, 8*time.Second, true)
		t.Logf("%v alone, loading 8s: out after ready %v", down, out)
		// The first ejection lasts DefaultBaseEjection from about the restart: the engine,
		// ready 8 s after it, stays out about 22 s more.
		if out[0] < DefaultBaseEjection-10*time.Second {
			t.Errorf("%v alone: out %v after the engine was ready, want the ejection's time run (about %v)", down, out[0], DefaultBaseEjection-8*time.Second)
		}
	}
}

// TestCheckDuringTheRun, step by step: the checks are judged against the run of failures that
// led to the ejection, from its first failure (the count going from 0 to 1), not from the
// ejection alone. A check that failed during the run, before the ejection (heard before or
// after it), saw the engine down or loading in the same episode: the reviewer's case, cut,
// refused, then 503 ejecting at +0.4 s, a check sent at +0.1 s refused, the model loaded and
// the next check passing at +1.1 s, ran its time (29.1 s more out); now that check ends it. For
// 503s alone the first check that tells anything since the run began must have failed: one
// that passed during the run, before the ejection, shows an engine answering its /health
// while it answers 503 to requests. A check sent before the run began, or during an earlier run
// that a success ended, tells nothing; and an engine failing requests behind a live /health
// is not taken back by its passing checks.
func TestCheckDuringTheRun(t *testing.T) {
	type step struct {
		at      time.Duration // since the first failure: when it came (a check: when it was heard)
		f       Failure       // an attempt failed so (FailNone: it succeeded)
		peer    bool          // at a peer (PeerFailed, PeerSucceeded)
		checked bool          // a check heard: sent at sent, passed or failed as why
		sent    time.Duration
		passed  bool
		why     CheckFailure
	}
	fail := func(at time.Duration, f Failure) step { return step{at: at, f: f} }
	ok := func(at time.Duration) step { return step{at: at} }
	peerFail := func(at time.Duration, f Failure) step { return step{at: at, f: f, peer: true} }
	peerOK := func(at time.Duration) step { return step{at: at, peer: true} }
	failed := func(sent, heard time.Duration, why CheckFailure) step {
		return step{at: heard, checked: true, sent: sent, why: why}
	}
	passed := func(sent, heard time.Duration) step {
		return step{at: heard, checked: true, sent: sent, passed: true}
	}
	const ms = time.Millisecond
	for _, tc := range []struct {
		name  string
		steps []step
		ends  bool // the last check, passing, ended the ejection
	}{
		{name: "cut, refused, 503: refused check sent before the ejection, heard after", ends: true,
			steps: []step{fail(0, FailCut), fail(200*ms, FailConnect), fail(400*ms, FailUnavailable),
				failed(100*ms, 400*ms, checkRefused), passed(1100*ms, 1100*ms)}},
		{name: "cut, refused, 503: refused check heard before the ejection", ends: true,
			steps: []step{fail(0, FailCut), failed(100*ms, 100*ms, checkRefused), fail(200*ms, FailConnect),
				fail(400*ms, FailUnavailable), passed(1100*ms, 1100*ms)}},
		{name: "cut, refused, 503: check failed before the run",
			steps: []step{failed(-100*ms, -100*ms, checkRefused), fail(0, FailCut), fail(200*ms, FailConnect),
				fail(400*ms, FailUnavailable), passed(1100*ms, 1100*ms)}},
		{name: "cut, refused, 503: check failed in an earlier run",
			steps: []step{fail(0, FailCut), failed(100*ms, 100*ms, checkRefused), ok(200 * ms),
				fail(300*ms, FailCut), fail(400*ms, FailConnect), fail(500*ms, FailUnavailable), passed(1500*ms, 1500*ms)}},
		{name: "503s: 503 check during the run", ends: true,
			steps: []step{fail(0, FailUnavailable), failed(100*ms, 100*ms, check503), fail(300*ms, FailUnavailable),
				fail(600*ms, FailUnavailable), passed(1600*ms, 1600*ms)}},
		{name: "503s: passed during the run, then failed, passed",
			steps: []step{fail(0, FailUnavailable), passed(100*ms, 100*ms), fail(300*ms, FailUnavailable),
				fail(600*ms, FailUnavailable), failed(1600*ms, 1600*ms, check503), passed(6600*ms, 6600*ms)}},
		{name: "503s: passed during the run, heard after the ejection, then failed, passed",
			steps: []step{fail(0, FailUnavailable), fail(300*ms, FailUnavailable), fail(600*ms, FailUnavailable),
				passed(100*ms, 700*ms), failed(1600*ms, 1600*ms, check503), passed(6600*ms, 6600*ms)}},
		{name: "503s: timed out during the run, then failed, passed", ends: true,
			steps: []step{fail(0, FailUnavailable), failed(100*ms, 300*ms, checkTimeout), fail(300*ms, FailUnavailable),
				fail(600*ms, FailUnavailable), failed(1600*ms, 1600*ms, check503), passed(6600*ms, 6600*ms)}},
		{name: "503s: failed in an earlier run",
			steps: []step{fail(0, FailUnavailable), failed(100*ms, 100*ms, check503), ok(200 * ms),
				fail(300*ms, FailUnavailable), fail(400*ms, FailUnavailable), fail(500*ms, FailUnavailable), passed(1500*ms, 1500*ms)}},
		{name: "peers' 503s: 503 check during the fleet's run", ends: true,
			steps: []step{peerFail(0, FailUnavailable), failed(100*ms, 100*ms, check503), peerFail(300*ms, FailUnavailable),
				peerFail(600*ms, FailUnavailable), passed(1600*ms, 1600*ms)}},
		{name: "peers' 503s: failed in an earlier run a peer's success ended",
			steps: []step{peerFail(0, FailUnavailable), failed(100*ms, 100*ms, check503), peerOK(200 * ms),
				peerFail(300*ms, FailUnavailable), peerFail(400*ms, FailUnavailable), peerFail(500*ms, FailUnavailable),
				passed(1500*ms, 1500*ms)}},
		// Behind a live /health: the checks pass throughout, during the run and after.
		{name: "lost, 5xx, lost behind a live /health",
			steps: []step{fail(0, FailLost), passed(100*ms, 100*ms), fail(200*ms, FailStatus), fail(400*ms, FailLost),
				passed(1400*ms, 1400*ms), passed(6400*ms, 6400*ms)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(100, 0)
			clk := &stepClock{t: start}
			a := pool(t, "a", "b", "c")[0]
			o := NewOutlier(OutlierConfig{Consecutive: 3, Fleet: func() int { return 3 }}, clk)
			ejected := false
			for i, s := range tc.steps {
				clk.t = start.Add(s.at)
				switch {
				case s.checked && !s.passed:
					o.HealthFailed(a, start.Add(s.sent), s.why)
				case s.checked:
					ended := o.HealthPassed(a, start.Add(s.sent))
					if last := i == len(tc.steps)-1; ended != (last && tc.ends) {
						t.Fatalf("step %d: a check (passed, sent at %v) ended the ejection: %v, want %v", i, s.sent, ended, last && tc.ends)
					}
				case s.peer && s.f == FailNone:
					o.PeerSucceeded(a)
				case s.peer:
					o.PeerFailed(a, s.f)
				case s.f == FailNone:
					o.Succeeded(a)
				default:
					o.Failed(a, s.f)
				}
				ejected = ejected || o.Ejected(a, clk.t)
			}
			if !ejected {
				t.Fatal("a never ejected")
			}
			if got := o.Ejected(a, clk.t); got == tc.ends {
				t.Errorf("a ejected after the steps: %v, want %v", got, !tc.ends)
			}
		})
	}
}
