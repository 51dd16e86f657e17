package policy

import "io"

// Snapshotter is implemented by policies whose learned picture of the fleet a new router
// replica can take from a running one, so that it starts warm instead of empty (prefix-aware:
// its index of which endpoint holds which blocks). Endpoints are named in a snapshot, as IDs
// are local to a replica.
type Snapshotter interface {
	// WriteSnapshot writes the policy's state, the endpoints named by name ("" leaves an
	// endpoint out), at most maxEntries entries (0: all), the newest first to stay; it
	// returns the entries written.
	WriteSnapshot(w io.Writer, name func(id int) string, maxEntries int) (int, error)
	// ReadSnapshot adds a snapshot's state to the policy's, the endpoints found by id (-1
	// for a name this replica does not have), reading at most maxEntries entries (0: no
	// limit); it returns the entries taken. A bad snapshot is an error; what was taken before
	// the fault stays.
	ReadSnapshot(r io.Reader, id func(name string) int, maxEntries int) (int, error)
}
