//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package h1

import "net"

// alive cannot peek here; a connection the server closed while it was idle is met by the
// request, which is sent again if the close broke its writing or the connection had been idle
// for ResendAfterIdle, and fails otherwise (the transport cannot tell such a close from one the
// request caused).
func alive(net.Conn) bool { return true }

// pending cannot peek here: it reports that nothing waits, and a request that arrives as an idle
// connection times out may be met by the close.
func pending(net.Conn) bool { return false }
