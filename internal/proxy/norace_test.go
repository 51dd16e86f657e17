//go:build !race

package proxy

// raceEnabled: built with the race detector (see race_test.go).
const raceEnabled = false
