package experiment

import "fmt"

// UsageError marks a problem with the options of a run, as opposed to one met while running:
// the command line was wrong, and nothing ran.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the problem.
func (e *UsageError) Unwrap() error { return e.Err }

// usageErr is a UsageError with a formatted message.
func usageErr(format string, args ...any) error {
	return &UsageError{fmt.Errorf(format, args...)}
}

// MaxInstances bounds --instances and --max-instances: far above any fleet one router fronts,
// and low enough that a simulated fleet (an engine's block pool per instance) fits in memory
// and its KV capacity in an int.
const MaxInstances = 10_000

// CheckInstances checks a fleet-size flag's value n: 1 to MaxInstances.
func CheckInstances(flag string, n int) error {
	if n < 1 || n > MaxInstances {
		return fmt.Errorf("%s %d: want 1 to %d (%d is far above any fleet one router fronts)", flag, n, MaxInstances, MaxInstances)
	}
	return nil
}
