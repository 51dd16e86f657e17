//go:build !linux

package simserver

import "time"

// preciseSleep is the part of a driver's wait that sleepUntil covers (none: the Go timer
// covers it all where there is no precise sleep).
const preciseSleep = 0

// sleepUntil waits until t with a Go timer.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }
