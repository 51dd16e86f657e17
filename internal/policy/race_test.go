//go:build race

package policy

// raceEnabled: built with the race detector, under which the churn tests run ten times slower
// and take fewer cycles.
const raceEnabled = true
