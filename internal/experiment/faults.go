package experiment

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/des"
	"github.com/kvroute/kvroute/internal/route"
)

// changeFlags pairs each change kind with its flag values.
func (o *SimulateOptions) changeFlags() []struct {
	kind  des.ChangeKind
	specs []string
} {
	return []struct {
		kind  des.ChangeKind
		specs []string
	}{{des.Kill, o.Kill}, {des.Add, o.Add}, {des.Fail, o.Fail}, {des.Hang, o.Hang}, {des.Cut, o.Cut}, {des.Blind, o.Blind}, {des.Recover, o.Recover}}
}

// checkFaults returns the problems of the change (each INSTANCE@TIME), fault, timeout and
// outlier options.
func (o *SimulateOptions) checkFaults() []error {
	var errs []error
	for _, c := range o.changeFlags() {
		for _, spec := range c.specs {
			// The span only turns shares into times: any will do to read the value.
			ch, err := des.ParseChange(c.kind, spec, time.Hour)
			switch {
			case err != nil:
				errs = append(errs, err)
			case ch.Instance >= o.Instances:
				errs = append(errs, fmt.Errorf("--%s %s: instance %d, want 0 to %d (--instances %d)", c.kind, spec, ch.Instance, o.Instances-1, o.Instances))
			}
		}
	}
	if len(o.Cut) > 0 && o.CutAfter < 1 {
		errs = append(errs, fmt.Errorf("--cut-after %d: want at least 1 token before a cut", o.CutAfter))
	}
	for _, d := range []struct {
		flag, zero string
		v          time.Duration
	}{
		{"--first-token-timeout", "none", o.FirstTokenTimeout}, {"--stream-idle-timeout", "none", o.StreamIdleTimeout},
		{"--stall-timeout", "none", o.StallTimeout},
		{"--ejection-time", "the default", o.EjectionTime}, {"--max-ejection-time", "the default", o.MaxEjectionTime},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration (0: %s)", d.flag, d.v, d.zero))
		}
	}
	if o.MaxEjectionTime > 0 && o.EjectionTime > o.MaxEjectionTime {
		errs = append(errs, fmt.Errorf("--max-ejection-time %v: want at least --ejection-time %v", o.MaxEjectionTime, o.EjectionTime))
	}
	if o.PassiveFailures < 0 {
		errs = append(errs, fmt.Errorf("--passive-failures %d: want at least 1 (0: the default, %d)", o.PassiveFailures, des.DefaultPassiveFailures))
	}
	if o.MaxEjectedPercent < 0 || o.MaxEjectedPercent > 100 {
		errs = append(errs, fmt.Errorf("--max-ejected-percent %d: want a percentage from 1 to 100 (0: the default, %d)", o.MaxEjectedPercent, route.DefaultMaxEjectedPercent))
	}
	return errs
}

// applyFaults puts the changes (each INSTANCE@TIME, TIME a share of span or a duration), the
// timeouts and outlier detection into fleet.
func (o *SimulateOptions) applyFaults(fleet *des.Config, span time.Duration) error {
	var errs []error
	for _, c := range o.changeFlags() {
		for _, spec := range c.specs {
			ch, err := des.ParseChange(c.kind, spec, span)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if c.kind == des.Cut {
				ch.Tokens = o.CutAfter
			}
			fleet.Changes = append(fleet.Changes, ch)
		}
	}
	if len(errs) > 0 {
		return &UsageError{errors.Join(errs...)}
	}
	// 0 on the command line means none; in des.Config, the default.
	fleet.NoAudit = o.NoAudit
	fleet.FirstTokenTimeout, fleet.StreamIdleTimeout = noneIfZero(o.FirstTokenTimeout), noneIfZero(o.StreamIdleTimeout)
	fleet.StallTimeout = noneIfZero(o.StallTimeout)
	fleet.Outlier = route.OutlierConfig{
		Consecutive: o.PassiveFailures, BaseEjection: o.EjectionTime, MaxEjection: o.MaxEjectionTime,
		MaxEjectedPercent: o.MaxEjectedPercent,
	}
	return nil
}

func noneIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// faultsNote names the faults of the run and the settings that meet them ("" when no instance
// fails).
func (o *SimulateOptions) faultsNote() string {
	var parts []string
	for _, c := range o.changeFlags()[2:] { // kill and add are not faults the router can meet otherwise
		for _, spec := range c.specs {
			p := "--" + c.kind.String() + " " + spec
			if c.kind == des.Cut {
				p += fmt.Sprintf(" (after %d tokens)", o.CutAfter)
			}
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	or := func(v, def int) int {
		if v == 0 {
			return def
		}
		return v
	}
	ord := func(v, def time.Duration) time.Duration {
		if v == 0 {
			return def
		}
		return v
	}
	timeout := func(d time.Duration) string {
		if d == 0 {
			return "none"
		}
		return d.String()
	}
	return fmt.Sprintf("faults: %s; first-token timeout %s, stall timeout %s, stream idle timeout %s, passive_failures %d, ejection %v (at most %v, %d %% of the fleet)",
		strings.Join(parts, ", "), timeout(o.FirstTokenTimeout), timeout(o.StallTimeout), timeout(o.StreamIdleTimeout),
		or(o.PassiveFailures, des.DefaultPassiveFailures), ord(o.EjectionTime, route.DefaultBaseEjection),
		ord(o.MaxEjectionTime, max(route.DefaultMaxEjection, o.EjectionTime)), or(o.MaxEjectedPercent, route.DefaultMaxEjectedPercent))
}
