//go:build !unix

package app

// openFileLimit is unknown here (0).
func openFileLimit() uint64 { return 0 }
