package extproc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/internal/endpoint"
	"github.com/kvroute/kvroute/internal/proxy"
)

// HTTP/2 frame types and flags (RFC 9113, 6) that idleConn reads and writes.
const (
	frameSettings = 0x4
	framePing     = 0x6
	frameGoAway   = 0x7
	flagAck       = 0x1
)

// idleConn opens an HTTP/2 connection to addr, as a gRPC client does, and never opens a stream:
// it answers the server's SETTINGS, and its PINGs when answerPings (a client gone without a
// word answers none), and reads until the server closes the connection.
// It reports whether a GOAWAY came before the close, and the read error that ended it (io.EOF
// for a close; a timeout when the server kept the connection past deadline).
func idleConn(t *testing.T, addr string, deadline time.Duration, answerPings bool) (goAway bool, err error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(deadline))
	frame := func(typ, flags byte, payload []byte) []byte {
		h := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags, 0, 0, 0, 0}
		return append(h, payload...)
	}
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(frameSettings, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	var head [9]byte
	for range 1000 {
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return goAway, err
		}
		n := int(head[0])<<16 | int(head[1])<<8 | int(head[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			return goAway, err
		}
		typ, flags := head[3], head[4]
		var reply []byte
		switch {
		case typ == frameSettings && flags&flagAck == 0:
			reply = frame(frameSettings, flagAck, nil)
		case typ == framePing && flags&flagAck == 0 && answerPings:
			reply = frame(framePing, flagAck, payload)
		case typ == frameGoAway:
			goAway = true
			if len(payload) >= 8 && binary.BigEndian.Uint32(payload[4:8]) != 0 {
				t.Errorf("GOAWAY with error code %d, want NO_ERROR", binary.BigEndian.Uint32(payload[4:8]))
			}
		}
		if reply != nil {
			if _, err := c.Write(reply); err != nil {
				return goAway, err // the server may have closed already
			}
		}
	}
	t.Fatal("too many frames")
	return false, nil
}

// TestServeClosesIdleConnections: a client that connects (HTTP/2 preface and settings, as a
// gRPC client does) and never opens a stream is sent a GOAWAY and disconnected once the
// connection has been idle for IdleTimeout, on the picker's listener and on the health one;
// a stream open for longer than that is not disturbed.
func TestServeClosesIdleConnections(t *testing.T) {
	f := newFixture(t, []string{ep1})
	ln, hln := loopback(t), loopback(t)
	const idle = 200 * time.Millisecond
	serveUntilEnd(t, &Server{Handler: func() *proxy.Handler { return f.h }, Logger: slog.New(slog.DiscardHandler), IdleTimeout: idle}, f, ln, hln)

	for _, l := range []net.Listener{ln, hln} {
		start := time.Now()
		goAway, err := idleConn(t, l.Addr().String(), 5*time.Second, true)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: a connection without a stream was still open after %v (idle timeout %v)", l.Addr(), time.Since(start), idle)
		}
		if !goAway {
			t.Errorf("%s: the connection ended (%v) without a GOAWAY", l.Addr(), err)
		}
		t.Logf("%s: closed after %v: %v", l.Addr(), time.Since(start), err)
		if took := time.Since(start); took < idle {
			t.Errorf("%s: closed after %v, before the idle timeout %v", l.Addr(), took, idle)
		}
	}

	// A stream (an HTTP request through Envoy) open for several idle timeouts goes on.
	e := &envoy{t: t, cfg: &extprocv3.ProtocolConfiguration{RequestBodyMode: fullDuplex, ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	var err error
	e.c, err = extprocv3.NewExternalProcessorClient(dial(t, ln.Addr().String())).Process(sctx)
	if err != nil {
		t.Fatal(err)
	}
	e.send(reqHeaders("/v1/chat/completions", false))
	wait := time.NewTimer(3 * idle) // the request's body is slow to come
	<-wait.C
	e.send(reqBody(plainChat, true))
	if got := destination(e.recv()); got != "10.0.0.1:8000" {
		t.Fatalf("destination = %q after a pause of %v", got, 3*idle)
	}
	e.streamedBody(false)
	e.send(respHeaders(200, "", false, "content-type", "application/json"))
	e.recv()
	e.send(respBody(jsonAnswer, true))
	e.streamedBody(true)
	e.close()
}

// TestServeDropsSilentClients: a client that stops answering pings (gone without closing its
// connection) is dropped once a ping goes unanswered; one that answers is kept.
func TestServeDropsSilentClients(t *testing.T) {
	f := newFixture(t, []string{ep1})
	ln := loopback(t)
	serveUntilEnd(t, &Server{Handler: func() *proxy.Handler { return f.h }, Logger: slog.New(slog.DiscardHandler), IdleTimeout: time.Hour,
		pingEvery: time.Second, pingWait: 200 * time.Millisecond}, f, ln, nil) // gRPC pings no sooner than a second
	start := time.Now()
	_, err := idleConn(t, ln.Addr().String(), 5*time.Second, false)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a client that answers no ping was still connected after %v", time.Since(start))
	}
	t.Logf("silent client dropped after %v: %v", time.Since(start), err)
	_, err = idleConn(t, ln.Addr().String(), 3*time.Second, true)
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("a client that answers pings was dropped: %v", err)
	}
}

// serveUntilEnd runs s.Serve on ln and hln (nil: none) for f's pool until the test ends, and
// then checks that it returns.
func serveUntilEnd(t *testing.T, s *Server, f *fixture, ln, hln net.Listener) {
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, hln, func() *endpoint.Pool { return f.pool }, time.Second) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
	})
}
