//go:build !race

package openai

// raceEnabled: built with the race detector (see race_test.go).
const raceEnabled = false
