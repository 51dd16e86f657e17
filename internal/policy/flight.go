package policy

import (
	"time"

	"github.com/kvroute/kvroute/internal/endpoint"
)

// Flight is what a FlightObserver keeps of one request in flight, held by its caller between
// the calls: opaque to the caller, nil when the observer keeps nothing.
type Flight any

// FlightObserver is implemented by observers that let their caller hold each request's state
// in flight, instead of finding it again by the request (Observer's FirstToken and Done are
// given only the request, which the observer must look up). Router replicas replay the other
// replicas' requests from their events (route.Share), and keep each remote request in a table
// of their own until its end anyway: handing the observer's state back with each event spares
// the observer a table entry of its own per remote request (for prefix-aware, a sync.Map
// store, load and delete: about a quarter of its Routed and Done and a third of its
// FirstToken, by perf on a syncing replica whose requests spanned several batches;
// docs/replicas.md).
//
// RoutedFlight, FirstTokenFlight and DoneFlight do what Routed, FirstToken and Done do, in
// everything the policy can observe afterwards: the caller calls each of a request's at most
// once, in that order, with the Flight that RoutedFlight returned, and calls none of Routed,
// FirstToken or Done for that request.
type FlightObserver interface {
	RoutedFlight(req *Request, ep *endpoint.Endpoint) Flight
	FirstTokenFlight(fl Flight, req *Request, ep *endpoint.Endpoint, ttft time.Duration)
	DoneFlight(fl Flight, req *Request, ep *endpoint.Endpoint, res Result)
}

// RoutedFlight is Routed, with the request's flight returned rather than stored
// (FlightObserver).
func (pa *prefixAware) RoutedFlight(req *Request, ep *endpoint.Endpoint) Flight {
	if f := pa.routed(req, ep); f != nil {
		return f
	}
	return nil // (not a nil *paFlight: the later calls would take it for one)
}

// FirstTokenFlight is FirstToken of the request whose flight is fl (FlightObserver).
func (pa *prefixAware) FirstTokenFlight(fl Flight, _ *Request, ep *endpoint.Endpoint, ttft time.Duration) {
	if f, ok := fl.(*paFlight); ok {
		pa.firstToken(f, ep, ttft)
	}
}

// DoneFlight is Done of the request whose flight is fl (FlightObserver).
func (pa *prefixAware) DoneFlight(fl Flight, req *Request, ep *endpoint.Endpoint, res Result) {
	if f, ok := fl.(*paFlight); ok {
		pa.done(f, req, ep, res)
	}
}
