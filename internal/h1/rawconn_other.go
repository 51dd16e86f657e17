//go:build !linux || (!amd64 && !arm64)

package h1

import "net"

// wrapConn returns nc: raw reads and writes (rawconn_linux.go) are for Linux on amd64 and
// arm64 only (the system calls and iovec layout they use).
func wrapConn(nc net.Conn) net.Conn { return nc }

// setRcvLowat does nothing here: see rawconn_linux.go.
func setRcvLowat(net.Conn, int) bool { return false }
