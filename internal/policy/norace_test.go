//go:build !race

package policy

// raceEnabled: built with the race detector (see race_test.go).
const raceEnabled = false
