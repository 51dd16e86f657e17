//go:build race

package proxy

// raceEnabled: built with the race detector, under which sync.Pool drops a share of what it is
// given back, at random.
const raceEnabled = true
