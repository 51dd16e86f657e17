package des

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/policy"
)

// Autoscale grows the fleet during a run as a controller decides: an autoscaler reading what
// the router exports, as KEDA and a HorizontalPodAutoscaler would in a cluster. Instances from
// Start on are absent until the controller asks for them; each one it asks for joins Delay
// later (a pod is scheduled, pulls its image, loads its weights), empty, and the router's
// warm-up ramp brings it its share of traffic.
type Autoscale struct {
	// Start is how many instances (0 .. Start-1) are there from the start; at least 1, at
	// most Config.Instances, which is the most there can be.
	Start int
	// Interval is how often the controller is asked (KEDA's pollingInterval); positive.
	Interval time.Duration
	// Delay is the time from the controller's asking to the instance taking requests.
	Delay time.Duration
	// Want is the controller: the number of instances it wants, given what router replica
	// 0 sees. It is called from the run's goroutine, Interval apart, until the first look
	// after the last arrival; a Config shared by runs in parallel needs one per run. Asking for fewer
	// instances than there are removes none (scale-in is not simulated).
	Want func(v View) int
}

// View is what an autoscaler sees at one of its looks.
type View struct {
	// Now is the virtual time.
	Now time.Duration
	// Endpoints are router replica 0's endpoints of the instances in the fleet: their load
	// counters and the engine-metric snapshots the router scraped.
	Endpoints []*endpoint.Endpoint
	// Picker is router replica 0's policy.
	Picker policy.Picker
	// Current is the instances in the fleet and on their way: the replicas a Deployment has.
	Current int
}

// Scaled is one instance an autoscaler added.
type Scaled struct {
	Instance int
	// Asked is when the controller asked for it; Joined when it took requests.
	Asked, Joined time.Duration
}

func (a *Autoscale) check(c *Config) []error {
	if a == nil {
		return nil
	}
	var errs []error
	if a.Start < 1 || a.Start > c.Instances {
		errs = append(errs, fmt.Errorf("autoscale start: %d instances, want 1..%d (the instances)", a.Start, c.Instances))
	}
	if a.Interval <= 0 {
		errs = append(errs, fmt.Errorf("autoscale interval: %v, want a positive duration such as 30s", a.Interval))
	}
	if a.Delay < 0 {
		errs = append(errs, fmt.Errorf("autoscale delay: %v, want 0 or more", a.Delay))
	}
	if a.Want == nil {
		errs = append(errs, errors.New("autoscale: no controller (Want is nil)"))
	}
	for _, ch := range c.Changes {
		if ch.Kind == Add && ch.Instance >= a.Start {
			errs = append(errs, fmt.Errorf("change add of instance %d: the autoscaler adds instances from %d on", ch.Instance, a.Start))
		}
	}
	return errs
}

// startAutoscale keeps the instances the autoscaler may add out of the fleet and schedules its
// first look.
func (s *sim) startAutoscale() {
	a := s.cfg.Autoscale
	if a == nil {
		return
	}
	for i := a.Start; i < s.cfg.Instances; i++ {
		s.present[i] = false
	}
	s.asked = a.Start
	s.push(event{at: a.Interval, kind: evControl})
}

// control asks the autoscaler how many instances it wants, and has the next ones join Delay
// later. It looks again Interval later if requests are still to arrive.
func (s *sim) control() {
	a := s.cfg.Autoscale
	r := &s.routers[0]
	v := View{Now: s.clock.now, Picker: r.lc.Picker(), Current: s.asked}
	for i, ep := range r.eps {
		if s.present[i] && !s.dead[i] {
			v.Endpoints = append(v.Endpoints, ep)
		}
	}
	for want := min(a.Want(v), s.cfg.Instances); s.asked < want; s.asked++ {
		s.scaled = append(s.scaled, Scaled{Instance: s.asked, Asked: s.clock.now, Joined: s.clock.now + a.Delay})
		// The config's Changes may share their array with other runs' configs: copy on append.
		s.cfg.Changes = append(slices.Clip(s.cfg.Changes), Change{At: s.clock.now + a.Delay, Instance: s.asked, Kind: Add})
		s.push(event{at: s.clock.now + a.Delay, kind: evChange, req: int32(len(s.cfg.Changes) - 1)})
	}
	if s.next < len(s.w.order) {
		s.push(event{at: s.clock.now + a.Interval, kind: evControl})
	}
}
