//go:build race

package openai

// raceEnabled: built with the race detector, whose instrumentation allocates where the plain
// build does not (slices.Grow's make, for one).
const raceEnabled = true
