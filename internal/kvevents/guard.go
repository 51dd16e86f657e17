package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// MaxFrameBytes bounds one ZMTP frame a peer may announce on a tcp:// endpoint of this package.
// zmq4 allocates the buffer a frame's header asks for before it reads a byte of the frame: a
// header announcing 2^40 bytes, sent by anyone who can reach the port (the PUB socket, the
// replay socket, or a publisher that a subscriber dials), ended kvroute sim with a fatal out of
// memory, which no recover catches. An engine's batch of KV events is far smaller (2,000,000
// block hashes make 2 MB): 64 MiB leaves room.
const MaxFrameBytes = 64 << 20

// guardedScheme names the zmq4 transport that every tcp:// endpoint of this package goes
// through: TCP whose connections end at a frame header announcing more than MaxFrameBytes, before
// zmq4 reads it.
const guardedScheme = "kvroute-tcp"

func init() {
	if err := zmq4.RegisterTransport(guardedScheme, guardedTCP{}); err != nil {
		panic(err)
	}
}

// guarded is ep with a tcp:// scheme replaced by guardedScheme's.
func guarded(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return guardedScheme + "://" + rest
	}
	return ep
}

// guardedTCP is zmq4's tcp transport with each connection under a frameGuard.
type guardedTCP struct{}

func (guardedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newFrameGuard(c, MaxFrameBytes), nil
}

func (guardedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return guardedListener{ln}, nil
}

func (guardedTCP) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

type guardedListener struct{ net.Listener }

func (l guardedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newFrameGuard(c, MaxFrameBytes), nil
}

// frameGuard follows the ZMTP 3 stream a connection reads (RFC 23/ZMTP: a 64-byte greeting,
// then frames of a flags byte, a size of 1 byte, or of 8 when the flags' LONG bit is set, and
// the body) and ends the connection at a frame whose size is over max. It only counts: the
// bytes reach zmq4 as they came.
type frameGuard struct {
	net.Conn
	max   uint64
	greet int     // greeting bytes still to come
	hdr   [9]byte // the frame header being read
	have  int     // of hdr
	need  int     // hdr's length: 2 or 9 (0: not known yet)
	body  uint64  // body bytes still to come
	err   error
}

// zmtpGreeting is the length of a ZMTP 3 greeting.
const zmtpGreeting = 64

func newFrameGuard(c net.Conn, max uint64) *frameGuard {
	return &frameGuard{Conn: c, max: max, greet: zmtpGreeting}
}

func (g *frameGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.Conn.Read(p)
	if serr := g.scan(p[:n]); serr != nil {
		g.err = serr
		_ = g.Conn.Close()
		return 0, serr
	}
	return n, err
}

// scan follows b, the stream's next bytes.
func (g *frameGuard) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greet > 0:
			k := min(g.greet, len(b))
			g.greet -= k
			b = b[k:]
		case g.body > 0:
			k := min(g.body, uint64(len(b)))
			g.body -= k
			b = b[k:]
		default:
			if g.have == 0 {
				g.need = 2
				if b[0]&0x02 != 0 { // LONG: an 8-byte size
					g.need = 9
				}
			}
			k := copy(g.hdr[g.have:g.need], b)
			g.have += k
			b = b[k:]
			if g.have < g.need {
				continue
			}
			size := uint64(g.hdr[1])
			if g.need == 9 {
				size = binary.BigEndian.Uint64(g.hdr[1:9])
			}
			g.have = 0
			if size > g.max {
				return fmt.Errorf("kv events: a ZMTP frame of %d bytes announced by %v: over the %d allowed", size, g.Conn.RemoteAddr(), g.max)
			}
			g.body = size
		}
	}
	return nil
}
