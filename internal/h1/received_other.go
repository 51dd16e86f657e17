//go:build !linux || 386

package h1

import (
	"net"
	"syscall"
	"time"
)

// received cannot tell here: see received_linux.go (Linux, but on 386, where getsockopt is
// reached only through socketcall). heard falls back to pending.
func received(net.Conn) (n uint64, ok bool) { return 0, false }

// taken cannot tell either.
func taken(net.Conn) (n uint64, ok bool) { return 0, false }

// receivedOf cannot tell either.
func receivedOf(syscall.RawConn) (n uint64, ok bool) { return 0, false }

// sendIdle cannot tell either: a write that waits past its stall bound is cut (see
// received_linux.go).
func sendIdle(net.Conn, *sendProgress) (d time.Duration, ok bool) { return 0, false }
