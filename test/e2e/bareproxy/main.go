// Command bareproxy is the floor that TestOverhead compares kvroute with: an
// httputil.ReverseProxy to one upstream, doing nothing else (no parsing, no routing, no
// metrics, no logs), over kvroute's upstream transport (internal/h1) or net/http's.
//
//	bareproxy -listen 127.0.0.1:0 -upstream http://127.0.0.1:8001 [-transport h1|net/http]
//
// It prints "bareproxy: api http://ADDR" when it listens, and stops on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/proxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "the one upstream URL")
	transport := flag.String("transport", "h1", "h1 (kvroute's) or net/http")
	flag.Parse()
	if err := run(*listen, *upstream, *transport); err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(1)
	}
}

func run(listen, upstream, transport string) error {
	u, err := url.Parse(upstream)
	if err != nil || u.Host == "" {
		return fmt.Errorf("-upstream %q: want http://HOST:PORT", upstream)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	switch transport {
	case "h1":
		rp.Transport = h1.New(proxy.DefaultTransport())
	case "net/http":
		rp.Transport = proxy.DefaultTransport()
	default:
		return fmt.Errorf("-transport %q: want h1 or net/http", transport)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Printf("bareproxy: api http://%s\n", ln.Addr())
	srv := &http.Server{Handler: rp}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
