package h1

import (
	"crypto/tls"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testcert"
)

// TestTLSHandshakeOnlyGivesWay: at MaxConns, a new TLS connection whose client finished its
// handshake and has sent nothing since (a pre-connected pool, a browser's preconnect) gives way
// to a newcomer once older than freshGrace, as a plain one that sent nothing does: the
// newcomer is served at once. Both servers counted the handshake's bytes as a request on its
// way and kept such a connection for the header timeout, refusing every newcomer meanwhile.
// Likewise with AbortStalled's connections under TLS.
func TestTLSHandshakeOnlyGivesWay(t *testing.T) {
	const header = 2 * time.Second // freshGrace: 500 ms
	certFile, keyFile := testcert.NewCA(t, "tlsheard").Issue("server")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}}
	servers := midHeadServers(t, 1, header, cfg)
	for _, srv := range midHeadServersUnder(t, 1, header, cfg, AbortStalled) {
		srv.name += "/AbortStalled" // the system calls go through its connection
		servers = append(servers, srv)
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			idler := dialMidHead(t, srv.addr, true)
			dialled := time.Now()
			if _, ok := received(idler.raw.Conn); !ok {
				t.Skip("the kernel does not count a socket's bytes received (TCP_INFO): Linux only")
			}
			// The server has read the whole handshake (its client's Finished included).
			eventually(t, "the handshake read by the server", func() bool {
				sc := srv.sock(idler.remote())
				if sc == nil {
					return false
				}
				n, _ := received(sc)
				return n == uint64(idler.raw.written.Load()) && !pending(sc)
			})
			// The age is the point: the connection is old enough to give way if it waits.
			for time.Since(dialled) <= freshGrace(header)+50*time.Millisecond {
				time.Sleep(10 * time.Millisecond)
			}
			newcomer := dialMidHead(t, srv.addr, true)
			if st := newcomer.get("/"); st != http.StatusOK {
				t.Errorf("the newcomer %v after the idler's accept: status %d, want 200 (the idler closed for it)",
					time.Since(dialled).Round(time.Millisecond), st)
			}
			if !idler.closed() {
				t.Error("the connection that sent only its handshake is still open")
			}
			if st := srv.stats(); st.ConnsEvicted != 1 || st.ConnsRefused != 0 {
				t.Errorf("%d evicted, %d refused; want 1 and 0", st.ConnsEvicted, st.ConnsRefused)
			}
		})
	}
}

// TestAbortStalledSystemCalls: under TLS, AbortStalled's connection lets the servers' system
// calls reach the socket: the kernel's count of the bytes received, those waiting, the
// abortive close.
func TestAbortStalledSystemCalls(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wrapped := AbortStalled(ln)
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sc, err := wrapped.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	tc := tls.Server(sc, &tls.Config{}) // no handshake: only the socket is asked
	if _, ok := received(tc); !ok {
		t.Skip("the kernel does not count a socket's bytes received (TCP_INFO): Linux only")
	}
	if _, err := cc.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bytes received", func() bool { n, _ := received(tc); return n == 5 })
	if !pending(tc) {
		t.Error("the bytes received do not wait in the socket")
	}
	if n, ok := taken(tc); !ok || n != 0 {
		t.Errorf("taken: %d, %v; want 0, true (nothing read yet)", n, ok)
	}
	if setAbortive(tc) == nil {
		t.Error("setAbortive found no TCP connection under TLS and AbortStalled's connection")
	}
}
