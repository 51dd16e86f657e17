//go:build !linux

package h1

import "net"

// wrapConn returns nc: raw reads and writes (rawconn_linux.go) are Linux's only.
func wrapConn(nc net.Conn) net.Conn { return nc }

// setRcvLowat does nothing here: see rawconn_linux.go.
func setRcvLowat(net.Conn, int) bool { return false }
