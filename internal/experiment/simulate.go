package experiment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/report"
	"github.com/kvroute/kvroute/internal/workload"
)

// SimulateOptions are the flags of kvroute simulate.
type SimulateOptions struct {
	// Trace (a Mooncake JSONL file) or Workload (a generator spec): exactly one.
	Trace, Workload string
	// Instances of engine Profile; BlockSize overrides the profile's (0: keep it).
	Instances int
	Profile   string
	BlockSize int
	// Policies to compare, ParsePolicies' form (empty: all).
	Policies string
	// Load scales arrivals to this offered load, or Speedup divides them (at most one; default 1).
	Load, Speedup float64
	// Limit keeps the first requests only (0: all); Seed seeds policies and generators.
	Limit int
	Seed  uint64
	// NonStreamed is the fraction of requests (drawn from Seed) whose clients ask for the
	// answer whole: the router sees no first token of theirs (workload.Whole).
	NonStreamed float64
	// ScrapeInterval and NetworkLatency as in des.Config.
	ScrapeInterval, NetworkLatency time.Duration
	// Routers is the number of router replicas; ReplicaAffinity (none or session) how the
	// load balancer spreads requests over them.
	Routers         int
	ReplicaAffinity string
	// ReplicaSync ("off" or a delay), ReplicaSyncLoss and ReplicaSyncBatch: des.ParseReplicaSync.
	ReplicaSync      string
	ReplicaSyncLoss  float64
	ReplicaSyncBatch time.Duration
	// Kill and Add are instances killed or added mid-run, each INSTANCE@TIME (des.ParseChange);
	// Fail, Hang and Cut make an instance fail fast, hang or cut its streams after CutAfter
	// tokens, Blind makes it find nothing cached (a silent zero hit), and Recover ends its
	// fault (a killed one restarts).
	Kill, Add, Fail, Hang, Cut, Recover, Blind []string
	CutAfter                                   int
	// NoAudit runs the routers without the cache audit (des.Config.NoAudit).
	NoAudit bool
	// FirstTokenTimeout and StreamIdleTimeout are the router's per-attempt timeouts (0: none);
	// PassiveFailures, EjectionTime, MaxEjectionTime and MaxEjectedPercent its outlier
	// detection, as the health section sets them live.
	FirstTokenTimeout, StreamIdleTimeout time.Duration
	// StallTimeout is limits.stall_timeout (0: none): an attempt whose engine answers nothing
	// for that long (or 20 x its predicted TTFT) is given up before its first-token timeout.
	StallTimeout                  time.Duration
	PassiveFailures               int
	EjectionTime, MaxEjectionTime time.Duration
	MaxEjectedPercent             int
	// Records and HTML, when set, are files to write every request's record and a report to.
	Records, HTML string
	// Autoscale runs an autoscaler on the router's saturation signal (ParseScale); Ramp
	// makes the arrival rate rise or fall over the run (ParseRamp). Empty: neither.
	Autoscale, Ramp string
}

// CheckNonStreamed checks --non-streamed: a fraction of the requests, from 0 to 1.
func CheckNonStreamed(f float64) error {
	if !(f >= 0 && f <= 1) {
		return fmt.Errorf("--non-streamed %v: want a fraction of the requests from 0 to 1", f)
	}
	return nil
}

// Simulation is what Simulate found: the summary, and the router replicas it had.
type Simulation struct {
	*report.Summary
	routers  int
	affinity string
	faults   string // the faults and the settings that meet them, for the table's header
	sync     des.ReplicaSync
	scale    *ScaleSpec
	scaling  []scaling // per policy, with --autoscale
}

// Simulate checks the options, loads the workload and runs every policy on it in virtual time,
// in parallel; it writes the records and HTML files asked for.
func Simulate(ctx context.Context, o SimulateOptions) (*Simulation, error) {
	prof, specs, errs := checkSimulation(o.Trace, o.Workload, o.Limit, o.Profile, o.Policies)
	if err := CheckInstances("--instances", o.Instances); err != nil {
		errs = append(errs, err)
	}
	if o.Load < 0 || o.Speedup < 0 {
		errs = append(errs, errors.New("--load and --speedup must be positive"))
	}
	if o.Load > 0 && o.Speedup > 0 {
		errs = append(errs, errors.New("give --load or --speedup, not both"))
	}
	if err := CheckNonStreamed(o.NonStreamed); err != nil {
		errs = append(errs, err)
	}
	if o.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("--block-size %d: want 0 (the profile's) or a positive number of tokens", o.BlockSize))
	}
	if o.ScrapeInterval <= 0 {
		errs = append(errs, fmt.Errorf("--scrape-interval %v: want a positive duration such as 200ms", o.ScrapeInterval))
	}
	if o.NetworkLatency < 0 {
		errs = append(errs, fmt.Errorf("--network-latency %v: want 0 or more", o.NetworkLatency))
	}
	if o.Routers < 1 {
		errs = append(errs, fmt.Errorf("--routers %d: want at least 1 (the number of router replicas)", o.Routers))
	}
	spread := des.SpreadRoundRobin
	switch o.ReplicaAffinity {
	case "none":
	case "session":
		spread = des.SpreadSession
	default:
		errs = append(errs, fmt.Errorf("--replica-affinity %q: want none (round-robin per request) or session", o.ReplicaAffinity))
	}
	errs = append(errs, o.checkFaults()...)
	errs = append(errs, o.checkScale()...)
	rsync, err := des.ParseReplicaSync(o.ReplicaSync, o.ReplicaSyncLoss, o.ReplicaSyncBatch)
	if err != nil {
		errs = append(errs, err)
	}
	if o.BlockSize > 0 {
		prof = prof.WithBlockSize(o.BlockSize)
	}
	if len(errs) > 0 {
		return nil, &UsageError{errors.Join(errs...)}
	}

	reqs, name, err := loadRequests(o.Trace, o.Workload, o.Seed, o.Limit)
	if err != nil {
		return nil, err
	}
	speedup := o.Speedup
	if o.Load > 0 {
		speedup, err = speedupForLoad(reqs, prof, o.Instances, o.Load)
		if err != nil {
			return nil, err
		}
	}
	if speedup == 0 {
		speedup = 1
	}
	reqs = o.ramp(workload.Speedup(reqs, speedup))
	if o.NonStreamed > 0 {
		reqs = workload.Whole(reqs, o.NonStreamed, o.Seed)
	}

	fleet := des.ProfileFleet(prof, o.Instances)
	fleet.ScrapeInterval = o.ScrapeInterval
	fleet.NetworkLatency = o.NetworkLatency
	fleet.Seed = o.Seed
	fleet.Routers = o.Routers
	fleet.Spread = spread
	fleet.ReplicaSync = rsync
	if err := o.applyFaults(&fleet, span(reqs)); err != nil {
		return nil, err
	}
	// Once for the fleet, not per policy as each run would (a --recover with nothing to
	// recover from, say).
	if err := fleet.Check(); err != nil {
		return nil, &UsageError{err}
	}

	sim := &Simulation{routers: o.Routers, affinity: o.ReplicaAffinity, faults: o.faultsNote(), sync: rsync, Summary: &report.Summary{
		Scenario: report.Scenario{
			Workload: name, Requests: len(reqs), Instances: o.Instances, Profile: prof.Name,
			Speedup: speedup, Seed: int64(o.Seed), BlockSize: prof.BlockSize,
			Load:             OfferedLoad(reqs, prof, o.Instances),
			ScrapeIntervalMS: float64(o.ScrapeInterval) / float64(time.Millisecond),
			NonStreamed:      o.NonStreamed,
		},
		Results: make([]report.Result, len(specs)),
	}}
	sum := sim.Summary
	var records [][]report.Record
	if o.Records != "" || o.HTML != "" {
		records = make([][]report.Record, len(specs))
	}
	w := des.Prepare(reqs, fleet.Model, fleet.BlockSize)
	if o.Autoscale != "" {
		spec, _ := ParseScale(o.Autoscale, o.Instances)
		sim.scale, sim.scaling = &spec, make([]scaling, len(specs))
	}

	// One simulation per policy, at most one per CPU at a time; the bounds beside them.
	bounds := make(chan report.Bounds, 1)
	go func() {
		bounds <- report.Bounds{
			InfiniteCacheHitRate: workload.InfiniteCacheHitRate(reqs, prof.BlockSize),
			PooledLRUHitRate:     workload.LRUHitRate(reqs, prof.BlockSize, o.Instances*prof.KVTokens()),
		}
	}()
	slots := newSlots()
	err = forEach(ctx, len(specs), "simulation", func(ctx context.Context, i int) error {
		sp := specs[i]
		fl, sc := fleet, (*scaler)(nil)
		if sim.scale != nil {
			sc = newScaler(*sim.scale, o.Instances)
			fl.Autoscale = sc.config()
		}
		res, wall, err := slots.run(ctx, fl, w, sp)
		if err != nil {
			return fmt.Errorf("policy %s: %w", sp.Label, err)
		}
		if sc != nil {
			sim.scaling[i] = sc.result(sp.Label, res, o.Instances)
		}
		r := report.Summarize(sp.Label, res.Records, res.Busy)
		r.Preemptions = res.Preemptions()
		r.Stalls = res.Stalls
		for _, a := range res.Audit {
			r.CacheAudit = append(r.CacheAudit, report.AuditVerdict{AtSeconds: a.At.Seconds(), Router: a.Router, Instance: a.Instance, Blind: a.Blind})
		}
		r.WallSeconds = wall.Seconds()
		sum.Results[i] = r
		if records != nil {
			records[i] = res.Records
		}
		return nil
	})
	sum.Bounds = <-bounds
	if err != nil {
		return nil, err
	}
	if o.Records != "" {
		if err := writeRecords(o.Records, records); err != nil {
			return nil, err
		}
	}
	if o.HTML != "" {
		opt := report.HTMLOptions{
			Title: "kvroute simulate: " + name,
			Notes: []string{fmt.Sprintf("Virtual time: arrivals divided by %.3g; engine metrics scraped every %v; router-engine latency %v.",
				speedup, o.ScrapeInterval, o.NetworkLatency)},
		}
		if o.Routers > 1 {
			opt.Notes = append(opt.Notes, sim.routersNote()+", each with its own policy instance and load counters.")
		}
		opt.Notes = append(opt.Notes, sim.faultNotes()...)
		if err := writeHTML(o.HTML, sum, records, opt); err != nil {
			return nil, err
		}
	}
	return sim, nil
}

// WriteJSON writes the summary as JSON, with the router replicas in the scenario when there
// are several (with one, the output is what it was before replicas).
func (s *Simulation) WriteJSON(w io.Writer) error {
	if s.routers <= 1 && s.scale == nil {
		return report.WriteJSON(w, s.Summary)
	}
	type scenario struct {
		report.Scenario
		Routers         int    `json:"routers"`
		ReplicaAffinity string `json:"replica_affinity"`
		ReplicaSync     string `json:"replica_sync"`
	}
	out := struct {
		Scenario scenario `json:"scenario"`
		*report.Summary
		Autoscale []scaling `json:"autoscale,omitempty"`
	}{scenario{s.Scenario, s.routers, s.affinity, s.sync.String()}, s.Summary, s.scaling}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fmt.Errorf("write json summary: %w", err)
	}
	return nil
}

// WriteTable writes the summary as a table, with the router replicas at the end of its header
// line when there are several, and after it, when instances fail, a line naming the faults and
// the settings that meet them; with --autoscale, each policy's autoscaling timeline follows.
func (s *Simulation) WriteTable(w io.Writer) (err error) {
	if s.scale != nil {
		defer func() {
			if err == nil {
				err = writeScaling(w, *s.scale, s.scaling)
			}
		}()
	}
	notes := s.faultNotes()
	if s.routers <= 1 && notes == nil {
		return report.WriteTable(w, s.Summary)
	}
	var b bytes.Buffer
	if err := report.WriteTable(&b, s.Summary); err != nil {
		return err
	}
	head, rest, _ := bytes.Cut(b.Bytes(), []byte("\n"))
	more := ""
	if s.routers > 1 {
		more = ", " + s.routersNote()
	}
	for _, n := range notes {
		more += "\n" + n
	}
	if _, err := fmt.Fprintf(w, "%s%s\n%s", head, more, rest); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// routersNote says how many router replicas there are and how requests reach them.
func (s *Simulation) routersNote() string {
	how := "round-robin per request"
	if s.affinity == "session" {
		how = "by session key"
	}
	if s.sync.On {
		how += ", sharing their events after " + s.sync.String()
	}
	return fmt.Sprintf("%d router replicas (%s)", s.routers, how)
}

// writeRecords writes every policy's records to path as JSON Lines.
func writeRecords(path string, records [][]report.Record) error {
	err := writeFile(path, func(w io.Writer) error {
		for _, recs := range records {
			if err := report.WriteRecords(w, recs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("--records: %w", err)
	}
	return nil
}

// writeHTML writes the HTML report to path.
func writeHTML(path string, s *report.Summary, recs [][]report.Record, opt report.HTMLOptions) error {
	if err := writeFile(path, func(w io.Writer) error { return report.WriteHTML(w, s, recs, opt) }); err != nil {
		return fmt.Errorf("--html: %w", err)
	}
	return nil
}

// writeFile creates path and fills it with write.
func writeFile(path string, write func(io.Writer) error) (err error) {
	fh, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := fh.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", path, cerr)
		}
	}()
	if err := write(fh); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// faultNotes returns the lines the summary's table carries under its header (nil when there
// are none): the faults and the settings that meet them, the attempts given up as stalled, and
// the cache audit's verdicts.
func (s *Simulation) faultNotes() []string {
	var notes, stalls, audits []string
	if s.faults != "" {
		notes = append(notes, s.faults)
	}
	for _, r := range s.Results {
		if r.Stalls > 0 {
			stalls = append(stalls, fmt.Sprintf("%s %d", r.Policy, r.Stalls))
		}
		if len(r.CacheAudit) > 0 {
			audits = append(audits, r.Policy+": "+auditNote(r.CacheAudit, s.routers))
		}
	}
	if stalls != nil {
		notes = append(notes, "attempts given up as stalled (limits.stall_timeout): "+strings.Join(stalls, ", "))
	}
	if audits != nil {
		notes = append(notes, "cache audit, instances whose reported hits stayed far below the predictions (blind) and agree again (sees): "+strings.Join(audits, "; "))
	}
	return notes
}

// auditNote lists a run's cache-audit verdicts in order, as "3 blind 812.4s, 3 sees 1240.1s"
// (with router replicas, "r1 3 blind ..."), the first maxAuditNotes of them.
func auditNote(vs []report.AuditVerdict, routers int) string {
	const maxAuditNotes = 8
	var parts []string
	for i, v := range vs {
		if i == maxAuditNotes {
			parts = append(parts, fmt.Sprintf("%d more", len(vs)-i))
			break
		}
		verdict := "sees"
		if v.Blind {
			verdict = "blind"
		}
		p := fmt.Sprintf("%d %s %.1fs", v.Instance, verdict, v.AtSeconds)
		if routers > 1 {
			p = fmt.Sprintf("r%d %s", v.Router, p)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}
