// Command bareproxy is the floor that TestOverhead compares kvroute with: a reverse proxy to
// one upstream that does nothing else (no parsing, no routing, no metrics, no logs; it reads
// each request body whole before forwarding it, as kvroute does). With
// -transport h1 or net/http it is an httputil.ReverseProxy on a net/http server, as kvroute
// is, over kvroute's upstream transport (internal/h1) or net/http's; with -transport h1-server
// the server side is internal/h1's Server as well (what kvroute serves with by default), and
// -transport h1-direct is that without httputil.ReverseProxy (request and response copied by
// hand); with -transport fasthttp both sides are valyala/fasthttp (its server and HostClient),
// a Go HTTP stack that allocates next to nothing per request.
//
//	bareproxy -listen 127.0.0.1:0 -upstream http://127.0.0.1:8001 [-transport h1|h1-server|h1-direct|net/http|fasthttp]
//
// It prints "bareproxy: api http://ADDR" when it listens, and stops on SIGINT or SIGTERM.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	serveH1 := false
	switch transport {
	case "h1-server", "h1-direct":
		rp.Transport = h1.New(proxy.DefaultTransport())
		serveH1 = true
	case "h1":
		rp.Transport = h1.New(proxy.DefaultTransport())
	case "net/http":
		rp.Transport = proxy.DefaultTransport()
	default:
		return fmt.Errorf("-transport %q: want h1, h1-server, h1-direct, net/http or fasthttp", transport)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Printf("bareproxy: api http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Read each body whole before forwarding it, as kvroute does (and fasthttp): a body passed
	// on as it arrives may leave in several writes, each waking the upstream.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		}
		rp.ServeHTTP(w, r)
	})
	if transport == "h1-direct" {
		// No ReverseProxy: the request and the response are copied by hand (no hop-by-hop
		// header handling, no X-Forwarded-For), to show what ReverseProxy itself costs.
		tr := h1.New(proxy.DefaultTransport())
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			out := &http.Request{Method: r.Method, URL: &url.URL{Scheme: u.Scheme, Host: u.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery},
				Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: r.Header, Host: u.Host,
				Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b))}
			out = out.WithContext(r.Context())
			resp, err := tr.RoundTrip(out)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
		})
		serveH1 = true
	}
	if serveH1 {
		srv := &h1.Server{Handler: h}
		go func() { <-ctx.Done(); srv.Close() }()
		if err := srv.Serve(ln); !errors.Is(err, h1.ErrServerClosed) {
			return err
		}
		return nil
	}
	srv := &http.Server{Handler: h}
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
