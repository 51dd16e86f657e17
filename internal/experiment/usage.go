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
