package h1

import (
	"crypto/tls"
	"net"
	"sync/atomic"
)

// tlsFlight finds where a TLS client's handshake ends in the bytes of its connection, by
// their record headers (RFC 8446 5.1, RFC 5246 6.2: a type byte, a version, a 16-bit length),
// as crypto/tls reads them through a stallConn: what the client sent beyond it is a request on
// its way (heard). Counting what crypto/tls had read when the handshake returned counts too
// much: crypto/tls reads ahead, and a TLS 1.3 client's request often leaves in the segment of
// its Finished, so a head begun with it counted as nothing sent and its connection could be
// closed to make room (R1: 5 of 5 requests lost so, 3 of 5 with the head sent right after the
// handshake).
//
// It notes the end of the last record of the handshake's types (change_cipher_spec, alert,
// handshake) before the first application_data record, and the end of that first
// application_data record; then it stops reading headers. TLS 1.2 sends its Finished as a
// handshake record: the handshake ends at the first. TLS 1.3 encrypts the client's Finished in
// an application_data record: without a client certificate it is the first; with one, the
// client's Certificate and CertificateVerify may come in records of their own, and the end of
// the first counts the rest of the handshake as a request on its way (heard early: the
// connection is kept, as before, never closed with a request on it).
type tlsFlight struct {
	off     int64 // bytes read so far; the reading goroutine's (crypto/tls reads one at a time)
	hdr     [5]byte
	hdrN    int   // header bytes read of the record under way
	left    int64 // body bytes left of the record under way
	typ     byte  // the record under way's type
	stopped bool  // found what it needs (or the bytes are no TLS records)

	hsEnd    atomic.Int64 // end of the last handshake-type record before application data; 0: none yet
	firstApp atomic.Int64 // end of the first application_data record; 0: not yet
}

const (
	recordChangeCipherSpec = 20
	recordAlert            = 21
	recordHandshake        = 22
	recordApplicationData  = 23
)

// feed follows p, the next bytes read from the client.
func (f *tlsFlight) feed(p []byte) {
	for len(p) > 0 && !f.stopped {
		if f.left > 0 {
			n := min(int64(len(p)), f.left)
			f.left -= n
			f.off += n
			p = p[n:]
			if f.left == 0 {
				f.recordEnd()
			}
			continue
		}
		f.hdr[f.hdrN] = p[0]
		f.hdrN++
		f.off++
		p = p[1:]
		if f.hdrN < len(f.hdr) {
			continue
		}
		f.hdrN = 0
		f.typ = f.hdr[0]
		f.left = int64(f.hdr[3])<<8 | int64(f.hdr[4])
		if f.typ < recordChangeCipherSpec || f.typ > recordApplicationData {
			f.stopped = true // no TLS record: crypto/tls fails the handshake
			return
		}
		if f.left == 0 {
			f.recordEnd()
		}
	}
	f.off += int64(len(p)) // after stopping: only the count
}

// recordEnd notes the record that ended at f.off.
func (f *tlsFlight) recordEnd() {
	if f.typ == recordApplicationData {
		f.firstApp.Store(f.off)
		f.stopped = true
		return
	}
	f.hsEnd.Store(f.off)
}

// handshakeEnd returns the offset, in the client's bytes, where the handshake of tc ended,
// as far as its records tell (tlsFlight), for heard's from; ok false where they do not tell:
// no stallConn under tc, or the records not yet read.
func handshakeEnd(tc *tls.Conn) (end int64, ok bool) {
	sc, isStall := tc.NetConn().(*stallConn)
	if !isStall {
		return 0, false
	}
	f := &sc.flight
	switch tc.ConnectionState().Version {
	case tls.VersionTLS13:
		end = f.firstApp.Load()
	default: // TLS 1.2 (crypto/tls's least for a server of this package)
		end = f.hsEnd.Load()
	}
	return end, end > 0
}

// Read is the connection's, its bytes followed until the TLS handshake's end is known.
func (c *stallConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.flight.stopped {
		c.flight.feed(p[:n])
	}
	return n, err
}

var _ net.Conn = (*stallConn)(nil)
