//go:build unix

package app

import "syscall"

// openFileLimit is the process's limit on open files (RLIMIT_NOFILE, its soft value, which Go
// raises to the hard one at start); 0: unknown.
func openFileLimit() uint64 {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 0
	}
	return uint64(r.Cur) // unlimited is the largest value, which maxConnsFor bounds
}
