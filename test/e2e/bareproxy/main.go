// Command bareproxy is the floor that TestOverhead compares kvroute with: a reverse proxy to
// one upstream that does nothing else (no parsing, no routing, no metrics, no logs). With
// -transport h1 or net/http it is an httputil.ReverseProxy on a net/http server, as kvroute
// is, over kvroute's upstream transport (internal/h1) or net/http's; with -transport fasthttp
// both sides are valyala/fasthttp (its server and HostClient), to show what a Go HTTP stack
// without net/http's per-request goroutines costs.
//
//	bareproxy -listen 127.0.0.1:0 -upstream http://127.0.0.1:8001 [-transport h1|net/http|fasthttp]
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

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/internal/h1"
	"github.com/kvroute/kvroute/internal/proxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "the one upstream URL")
	transport := flag.String("transport", "h1", "h1 (kvroute's), net/http or fasthttp")
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
	if transport == "fasthttp" {
		return runFast(listen, u.Host)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	switch transport {
	case "h1":
		rp.Transport = h1.New(proxy.DefaultTransport())
	case "net/http":
		rp.Transport = proxy.DefaultTransport()
	default:
		return fmt.Errorf("-transport %q: want h1, net/http or fasthttp", transport)
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

// runFast serves the same proxy with fasthttp on both sides.
func runFast(listen, upstream string) error {
	hc := &fasthttp.HostClient{Addr: upstream, MaxConns: 4096}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Printf("bareproxy: api http://%s\n", ln.Addr())
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.Request.Header.Del("Connection")
		if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); _ = srv.Shutdown() }()
	return srv.Serve(ln)
}
