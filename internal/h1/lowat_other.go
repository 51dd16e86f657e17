//go:build !linux

package h1

import "net"

// setLowWater does nothing here: only Linux's SO_RCVLOWAT is known to wake pollers by it.
func setLowWater(net.Conn, int) bool { return false }

// lowWater cannot read the threshold here (tests).
func lowWater(net.Conn) int { return -1 }
