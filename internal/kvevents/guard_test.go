package kvevents

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// zmtpGreetingBytes is a ZMTP 3.0 greeting of the NULL mechanism, as a client sends it.
func zmtpGreetingBytes() []byte {
	g := make([]byte, zmtpGreeting)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0
	copy(g[12:], "NULL")
	return g
}

// TestHugeFrameRefused: a client that sends a greeting, then a frame header announcing 512 MiB
// has its connection ended at once, on the PUB port and the replay port (zmq4 allocated what
// the header asked and waited for it: 2^40 bytes ended kvroute sim with a fatal out of memory);
// the publisher goes on serving a subscriber.
func TestHugeFrameRefused(t *testing.T) {
	p, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@test", Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, addr := range []string{p.Addr(), p.ReplayAddr()} {
		c, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, 9)
		hdr[0] = 0x04 | 0x02 // a command, LONG
		binary.BigEndian.PutUint64(hdr[1:], 512<<20)
		if _, err := c.Write(append(zmtpGreetingBytes(), hdr...)); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, c) // the publisher's greeting, then the end
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s: the connection is still open 5 s after a frame of 512 MiB was announced", addr)
		}
		c.Close()
	}
	// Still serving.
	s, err := NewSubscriber(p.Addr(), "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make(chan error, 1)
	go func() { _, err := s.Recv(); got <- err }()
	deadline := time.After(10 * time.Second)
	for {
		p.Publish(Batch{TS: 1})
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-deadline:
			t.Fatal("no message reached a subscriber after the refusals")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestFrameGuardScan: frames cut anywhere pass; a size over the bound is refused, short or
// long form.
func TestFrameGuardScan(t *testing.T) {
	stream := zmtpGreetingBytes()
	stream = append(stream, 0x04, 5, 'R', 'E', 'A', 'D', 'Y') // a short command
	long := make([]byte, 9)
	long[0] = 0x02
	binary.BigEndian.PutUint64(long[1:], 300)
	stream = append(stream, long...)
	stream = append(stream, make([]byte, 300)...)
	stream = append(stream, 0x00, 0) // an empty frame
	for cut := 1; cut <= len(stream); cut++ {
		g := newFrameGuard(nil, 300)
		for b := stream; len(b) > 0; {
			k := min(cut, len(b))
			if err := g.scan(b[:k]); err != nil {
				t.Fatalf("cut %d: %v", cut, err)
			}
			b = b[k:]
		}
		if g.body != 0 || g.have != 0 {
			t.Fatalf("cut %d: ended inside a frame (body %d, header %d)", cut, g.body, g.have)
		}
	}
	for _, hdr := range [][]byte{{0x00, 255}, append([]byte{0x02}, binary.BigEndian.AppendUint64(nil, 1<<40)...)} {
		g := newFrameGuard(&net.TCPConn{}, 200)
		if err := g.scan(append(zmtpGreetingBytes(), hdr...)); err == nil {
			t.Errorf("header %x: taken", hdr)
		}
	}
}
