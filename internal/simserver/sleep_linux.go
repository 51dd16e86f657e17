package simserver

import (
	"syscall"
	"time"
)

// preciseSleep is the part of a driver's wait that sleepUntil covers.
const preciseSleep = time.Millisecond

// sleepUntil blocks the calling goroutine's thread until t with the kernel's precision
// (nanosleep, tens of microseconds), where a Go timer may fire up to a millisecond late. The
// runtime hands the thread's P to other goroutines meanwhile.
func sleepUntil(t time.Time) {
	for range 100 { // an interrupted sleep resumes; bounded all the same
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		if err := syscall.Nanosleep(&ts, nil); err == nil {
			return
		}
	}
}
