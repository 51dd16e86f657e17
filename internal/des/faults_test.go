package des

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/route"
	"github.com/kvroute/kvroute/internal/workload"
)

const victim = 3

// failures returns the failed records, and checks that each failed on the victim with an error
// that contains want.
func failures(t *testing.T, res *Result, want string) []report.Record {
	t.Helper()
	var out []report.Record
	for _, r := range res.Records {
		if r.Err == "" {
			continue
		}
		out = append(out, r)
		if r.EndpointID != victim || !strings.Contains(r.Err, want) {
			t.Errorf("request %s failed: %+v; want failures on sim-%d only, saying %q", r.ID, r, victim, want)
		}
	}
	return out
}

// TestFailFastEjected: an instance that answers 500 to everything from the start. Live, a 500
// before any byte reached the client is sent to the next ranked endpoint once per request
// (route.FailStatus is RetryableOnce), so each request round-robin sends it first goes on to
// the next instance and completes there: none fails. The 500s still count against the
// instance, and passive_failures of them in a row eject it: exactly that many requests took
// two attempts, and it is sent nothing more. (The simulator used to end each of those requests
// at its 500, failing 3 here where the live router fails none.) With ejection made
// ineffective it answers 500 to its whole share, each request of which completes on the next.
func TestFailFastEjected(t *testing.T) {
	reqs := killWorkload()
	cfg := toyConfig(8)
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Fail}}
	for _, tc := range []struct {
		name        string
		consecutive int
		retried     int
	}{
		{"ejected", 0, DefaultPassiveFailures},
		{"never ejected", 1 << 30, len(reqs) / 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg.Outlier.Consecutive = tc.consecutive
			res := run(t, cfg, reqs, Named("round-robin", nil))
			retried := 0
			for _, r := range res.Records {
				switch {
				case r.Err != "" || r.EndpointID == victim:
					t.Errorf("request %s: %+v; want it served by another instance", r.ID, r)
				case r.Attempts == 2 && r.EndpointID == victim+1:
					retried++ // round-robin ranks the next instance second
				case r.Attempts != 1:
					t.Errorf("request %s: %+v; want one attempt, or two after sim-%d's 500", r.ID, r, victim)
				}
			}
			if retried != tc.retried {
				t.Errorf("%d requests retried after a 500, want %d", retried, tc.retried)
			}
		})
	}
}

// TestFailRetriedOnce: a request may be sent on after a 500 once, as live: two failing
// instances side by side (3 and 4, ejection made ineffective) fail every request round-robin
// ranks 3 then 4, on its second attempt, though a third endpoint is allowed (Attempts 3): two
// engines that fail one request point at the request. Those it ranks 4 first complete on 5.
func TestFailRetriedOnce(t *testing.T) {
	reqs := killWorkload()
	cfg := toyConfig(8)
	cfg.Outlier.Consecutive = 1 << 30
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Fail}, {At: 0, Instance: victim + 1, Kind: Fail}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	var failed, movedOn int
	for _, r := range res.Records {
		switch {
		case r.Err != "":
			failed++
			if want := "sim-4 answered 500"; r.Attempts != 2 || r.EndpointID != victim+1 || r.Err != want {
				t.Errorf("request %s failed: %+v; want it failed at its second attempt, on sim-4, %q", r.ID, r, want)
			}
		case r.Attempts == 2 && r.EndpointID == victim+2:
			movedOn++
		case r.Attempts != 1:
			t.Errorf("request %s: %+v; want one attempt, or two after a 500", r.ID, r)
		}
	}
	if want := len(reqs) / 8; failed != want || movedOn != want {
		t.Errorf("%d requests failed (3 then 4), %d completed on sim-5 after sim-4's 500; want %d of each", failed, movedOn, want)
	}
}

// TestHangFailsOver: an instance that hangs from the start holds what it is sent; each attempt
// fails over at the first-token timeout to the next ranked endpoint, so every request
// completes, those that met the hang with a TTFT past the timeout, until the timeouts eject it.
func TestHangFailsOver(t *testing.T) {
	const timeout = 50 * time.Millisecond
	reqs := killWorkload()
	cfg := toyConfig(8)
	cfg.FirstTokenTimeout = timeout
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Hang}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	failures(t, res, "")
	fellBack := 0
	for _, r := range res.Records {
		if r.Attempts < 2 {
			continue
		}
		fellBack++
		if r.EndpointID == victim || r.TTFT() < timeout {
			t.Errorf("request %s fell back: %+v; want it served elsewhere after the %v timeout", r.ID, r, timeout)
		}
	}
	// Round-robin sends sim-3 a request every 16 ms; the third timeout, 50 ms after the third of
	// them, ejects it: the requests sent in those 82 ms met the hang.
	if fellBack < DefaultPassiveFailures || fellBack > 7 {
		t.Errorf("%d requests fell back, want %d to 7", fellBack, DefaultPassiveFailures)
	}
}

// TestHangCutsStreamsInProgress: an instance that hangs at half time leaves the streams it was
// sending silent: each fails at the stream idle timeout (its first token came: not sent
// again); the requests it had not started fail over at the first-token timeout.
func TestHangCutsStreamsInProgress(t *testing.T) {
	reqs := killWorkload()
	half := reqs[len(reqs)-1].Arrival / 2
	cfg := toyConfig(8)
	cfg.FirstTokenTimeout = 50 * time.Millisecond
	cfg.StreamIdleTimeout = 80 * time.Millisecond
	cfg.Changes = []Change{{At: half, Instance: victim, Kind: Hang}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	failed := failures(t, res, "stream idle timeout")
	for _, r := range failed {
		if r.FirstToken == 0 || r.FirstToken > half || r.Finish != half+cfg.StreamIdleTimeout {
			t.Errorf("request %s: %+v; want a stream started before %v, failed at %v", r.ID, r, half, half+cfg.StreamIdleTimeout)
		}
	}
	if len(failed) == 0 {
		t.Error("no stream was in progress on the hung instance: the test proves nothing")
	}
}

// TestCutStreams: an instance that cuts every stream after 5 tokens fails the requests it gets
// after their first token (not sent again), 4 steps after it, until they eject it.
func TestCutStreams(t *testing.T) {
	reqs := killWorkload()
	cfg := toyConfig(8)
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Cut, Tokens: 5}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	failed := failures(t, res, "cut the stream")
	if len(failed) != DefaultPassiveFailures {
		t.Errorf("%d streams cut, want %d (then the instance is ejected)", len(failed), DefaultPassiveFailures)
	}
	for _, r := range failed {
		// Each toy step after the first token gives one token and lasts at least 1 ms.
		if r.FirstToken == 0 || r.Finish-r.FirstToken < 4*time.Millisecond || r.Attempts != 1 {
			t.Errorf("cut request %s: %+v; want its first token, then the cut 4 steps later", r.ID, r)
		}
	}
}

// TestCutWholeAnswerRetried: an instance that cuts after 5 tokens closes the connection of an
// answer that comes whole before any byte of it (kvroute sim's cut_after): live, a connection
// lost before any byte, sent to the next ranked endpoint once (route.FailLost is
// RetryableOnce). So none fails; passive_failures of them eject the instance. Each retried
// record has the first token of its second attempt, not the one the cutting engine made.
func TestCutWholeAnswerRetried(t *testing.T) {
	reqs := killWorkload()
	for i := range reqs {
		reqs[i].Whole = true
	}
	cfg := toyConfig(8)
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Cut, Tokens: 5}}
	res := run(t, cfg, reqs, Named("round-robin", nil))
	var retried []report.Record
	once := time.Duration(1 << 62) // the shortest TTFT of a request served at once
	for _, r := range res.Records {
		switch {
		case r.Err != "" || r.EndpointID == victim:
			t.Errorf("request %s: %+v; want it served by another instance", r.ID, r)
		case r.Attempts == 2:
			retried = append(retried, r)
		default:
			once = min(once, r.TTFT())
		}
	}
	if len(retried) != DefaultPassiveFailures {
		t.Errorf("%d requests retried after the cut, want %d (then the instance is ejected)", len(retried), DefaultPassiveFailures)
	}
	for _, r := range retried {
		// The first attempt's first token, then 4 more steps of at least 1 ms before the cut,
		// then the second attempt's prefill.
		if r.TTFT() < once+4*time.Millisecond {
			t.Errorf("retried request %s: TTFT %v; want its second attempt's, over %v", r.ID, r.TTFT(), once+4*time.Millisecond)
		}
	}
}

// TestRecover: an instance failing fast from the start recovers at half time; once its
// ejection (100 ms here) is over it serves requests again. A killed instance that recovers
// restarts and serves too.
func TestRecover(t *testing.T) {
	reqs := killWorkload()
	half := reqs[len(reqs)-1].Arrival / 2
	for _, kind := range []ChangeKind{Fail, Kill, Hang, Cut} {
		t.Run(kind.String(), func(t *testing.T) {
			cfg := toyConfig(8)
			cfg.FirstTokenTimeout = 50 * time.Millisecond
			cfg.Outlier = route.OutlierConfig{BaseEjection: 100 * time.Millisecond}
			cfg.Changes = []Change{{At: 0, Instance: victim, Kind: kind, Tokens: 5}, {At: half, Instance: victim, Kind: Recover}}
			res := run(t, cfg, reqs, Named("round-robin", nil))
			after := 0
			for _, r := range res.Records {
				if r.Err != "" && r.Arrival > half {
					t.Errorf("request %s failed after the recovery: %+v", r.ID, r)
				}
				if r.Err == "" && r.EndpointID == victim && r.Arrival > half {
					after++
				}
			}
			if after == 0 {
				t.Error("the recovered instance served nothing")
			}
		})
	}
}

// TestBlind: an instance blind from the start serves every request it is sent and reports no
// cached tokens; the router's cache audit finds it blind before the instance recovers (at half
// time), and after the recovery it finds prefixes again. Without the audit (NoAudit) there
// is no verdict.
func TestBlind(t *testing.T) {
	// 1,200 requests of 40 groups, each prompt 8 blocks of its group's and one of its own.
	reqs := make([]workload.Request, 1200)
	for i := range reqs {
		g := uint64(i%40) * 100
		reqs[i] = req(i, time.Duration(i)*2*time.Millisecond, 36, 20, g, g+1, g+2, g+3, g+4, g+5, g+6, g+7, uint64(10000+i))
	}
	half := reqs[len(reqs)-1].Arrival / 2 // when it recovers
	cfg := toyConfig(4)
	cfg.Changes = []Change{{At: 0, Instance: victim, Kind: Blind}, {At: half, Instance: victim, Kind: Recover}}
	res := run(t, cfg, reqs, Named("prefix-aware", nil))
	var before, after, hitsAfter, probes int
	for _, r := range res.Records {
		if r.MovedBy == route.MovedCacheProbe {
			probes++
			if r.EndpointID != victim {
				t.Errorf("request %s probed %s, not the blind instance", r.ID, r.Endpoint)
			}
		}
		switch {
		case r.Err != "":
			t.Errorf("request %s failed: %+v", r.ID, r)
		case r.EndpointID != victim:
		case r.Arrival < half:
			before++
			if r.CachedTokens != 0 {
				t.Errorf("request %s found %d tokens cached on the blind instance", r.ID, r.CachedTokens)
			}
		case r.Arrival > half+10*time.Millisecond:
			after++
			hitsAfter += r.CachedTokens
		}
	}
	if before == 0 || after == 0 || hitsAfter == 0 {
		t.Errorf("the blind instance served %d requests before its recovery and %d after, which found %d tokens cached; want some of each", before, after, hitsAfter)
	}
	if len(res.Audit) == 0 || !res.Audit[0].Blind || res.Audit[0].Instance != victim || res.Audit[0].At >= half {
		t.Fatalf("audit verdicts %+v, want instance %d found blind first, before %v", res.Audit, victim, half)
	}
	t.Logf("audit verdicts %+v; the instance served %d requests before its recovery at %v, %d after; %d probes", res.Audit, before, half, after, probes)
	if probes == 0 {
		t.Error("no request probed the blind instance")
	}
	for _, v := range res.Audit {
		if v.Instance != victim {
			t.Errorf("verdict %+v on a healthy instance", v)
		}
	}

	cfg.NoAudit = true
	if res := run(t, cfg, reqs, Named("prefix-aware", nil)); len(res.Audit) != 0 {
		t.Errorf("NoAudit: verdicts %+v, want none", res.Audit)
	}
}

// TestFaultsDeterministic: faults do not make runs differ.
func TestFaultsDeterministic(t *testing.T) {
	reqs := randomWorkload(300)
	cfg := toyConfig(4)
	cfg.NetworkLatency = time.Millisecond
	cfg.FirstTokenTimeout = 20 * time.Millisecond
	cfg.StreamIdleTimeout = 30 * time.Millisecond
	span := reqs[len(reqs)-1].Arrival
	cfg.Changes = []Change{
		{At: span / 5, Instance: 0, Kind: Cut, Tokens: 2}, {At: span / 4, Instance: 1, Kind: Hang},
		{At: span / 3, Instance: 2, Kind: Fail}, {At: span / 2, Instance: 1, Kind: Recover},
	}
	a := run(t, cfg, reqs, Named("prefix-aware", nil))
	b := run(t, cfg, reqs, Named("prefix-aware", nil))
	if diff := cmp.Diff(a.Records, b.Records); diff != "" {
		t.Errorf("two runs differ (-first +second):\n%s", diff)
	}
}

func TestFaultConfigErrors(t *testing.T) {
	w := Prepare(randomWorkload(3), "toy", 4)
	for _, tc := range []struct {
		changes []Change
		want    string
	}{
		{[]Change{{Instance: 0, Kind: Cut}}, "want at least 1"},
		{[]Change{{Instance: 0, Kind: Blind + 1}}, "want kill, add, fail, hang, cut, blind or recover"},
		{[]Change{{At: time.Second, Instance: 1, Kind: Recover}}, "no kill, fail, hang, cut or blind of it by then"},
		{[]Change{{At: 2 * time.Second, Instance: 1, Kind: Hang}, {At: time.Second, Instance: 1, Kind: Recover}}, "no kill, fail, hang, cut or blind of it by then"},
		{[]Change{{At: time.Second, Instance: 0, Kind: Hang}, {At: 2 * time.Second, Instance: 1, Kind: Recover}}, "instance 1 at 2s: no kill"},
	} {
		cfg := toyConfig(2)
		cfg.Changes = tc.changes
		if _, err := Run(t.Context(), cfg, w, "p", Named("round-robin", nil)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want one saying %q", tc.changes, err, tc.want)
		}
	}
}

// FuzzFaults runs a small fleet through arbitrary kills, additions, faults and recoveries (each
// 4 input bytes: kind, instance, time, tokens) and checks what must hold whatever happens: a
// valid config runs to its end, every request completes or fails with a reason, no request is
// sent more often than the attempts allow, and a second run gives the same records.
func FuzzFaults(f *testing.F) {
	f.Add([]byte{byte(Hang), 1, 10, 0, byte(Recover), 1, 40, 0})
	f.Add([]byte{byte(Kill), 0, 5, 0, byte(Recover), 0, 6, 0, byte(Cut), 2, 0, 1})
	f.Add([]byte{byte(Fail), 3, 0, 0, byte(Hang), 2, 1, 0, byte(Cut), 1, 2, 3, byte(Add), 0, 9, 0})
	f.Add([]byte{byte(Blind), 1, 0, 0, byte(Recover), 1, 30, 0})
	reqs := randomWorkload(60)
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg := toyConfig(4)
		cfg.NetworkLatency = time.Duration(len(b)%3) * time.Millisecond
		cfg.FirstTokenTimeout = 20 * time.Millisecond
		cfg.StreamIdleTimeout = 30 * time.Millisecond
		cfg.Outlier = route.OutlierConfig{BaseEjection: 10 * time.Millisecond}
		for i := 0; i+3 < len(b) && len(cfg.Changes) < 16; i += 4 {
			cfg.Changes = append(cfg.Changes, Change{
				Kind: ChangeKind(b[i] % 7), Instance: int(b[i+1] % 4),
				At: time.Duration(b[i+2]) * 2 * time.Millisecond, Tokens: int(b[i+3]%8) + 1,
			})
		}
		w := Prepare(reqs, cfg.Model, cfg.BlockSize)
		a, err := Run(t.Context(), cfg, w, "p", Named("least-request", nil))
		if err != nil {
			if strings.Contains(err.Error(), "fleet config") {
				return // e.g. an instance added twice
			}
			t.Fatalf("changes %+v: %v", cfg.Changes, err)
		}
		for _, r := range a.Records {
			if r.Attempts > DefaultAttempts {
				t.Errorf("request %s sent %d times: %+v", r.ID, r.Attempts, r)
			}
			if r.Err == "" && (r.FirstToken < r.Arrival || r.Finish < r.FirstToken || r.EndpointID < 0) {
				t.Errorf("request %s completed inconsistently: %+v", r.ID, r)
			}
		}
		b2, err := Run(t.Context(), cfg, w, "p", Named("least-request", nil))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a.Records, b2.Records); diff != "" {
			t.Errorf("changes %+v: two runs differ (-first +second):\n%s", cfg.Changes, diff)
		}
	})
}

// TestWholeAnswerOutlastsFirstTokenTimeout: an answer that comes whole shows the router no
// first token, so the first-token timeout does not bound it (the live router's response
// timeout does): one whose decode outlasts that timeout completes on its first attempt, as
// the streamed one beside it does. Its record keeps the engine's first token.
func TestWholeAnswerOutlastsFirstTokenTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	reqs := []workload.Request{req(0, 0, 10, 200, 1, 2, 3), req(1, 0, 10, 200, 4, 5, 6)}
	reqs[0].Whole = true
	cfg := toyConfig(2)
	cfg.FirstTokenTimeout = timeout
	res := run(t, cfg, reqs, Named("prefix-aware", nil))
	for _, r := range res.Records {
		if r.Err != "" || r.Attempts != 1 || r.FirstToken <= 0 || r.Finish-r.FirstToken < timeout {
			t.Errorf("request %s: %+v; want done on its first attempt, its decode longer than %v", r.ID, r, timeout)
		}
	}
}
