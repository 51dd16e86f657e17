package simserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/internal/h1"
)

// Fleet is n instances served on consecutive ports of one host, in one process.
type Fleet struct {
	instances []*Instance
	servers   []server
	urls      []string
	serving   sync.WaitGroup
	once      sync.Once
}

// StartFleet starts n instances with opts on host, instance i on port firstPort+i (firstPort 0:
// free ports). When opts.KVEvents (and KVEventsReplay) name a port P, instance i publishes on
// P+i (port 0: free ports); each instance's KV topic is "kv@<host:port>@<model>" unless
// opts.KVTopic is set. ctx bounds the start only; Close (or Shutdown) stops the fleet.
func StartFleet(ctx context.Context, opts Options, n int, host string, firstPort int) (*Fleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("simserver: fleet of %d instances: want at least 1", n)
	}
	if firstPort < 0 || firstPort+n-1 > 65535 {
		return nil, fmt.Errorf("simserver: ports %d..%d: want ports in 1..65535 (0 for free ports)", firstPort, firstPort+n-1)
	}
	// What every instance would refuse is said once, without an instance's number.
	def := opts.withDefaults()
	err := def.validate()
	if n > 1 {
		// Instance i publishes on the port after instance i-1's: a port is needed.
		for _, ep := range []struct{ field, name, v string }{
			{"KVEvents", "kv events endpoint", opts.KVEvents},
			{"KVEventsReplay", "kv events replay endpoint", opts.KVEventsReplay},
		} {
			if _, serr := shiftPort(ep.v, 1); serr != nil && publisherScheme(ep.v) { // another scheme: validate said so
				err = errors.Join(err, optionErr(ep.field, ep.name, strconv.Quote(ep.v), "want tcp://HOST:PORT for a fleet of more than one instance"))
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("simserver: %w", err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	f := &Fleet{}
	var lc net.ListenConfig
	for i := range n {
		if err := ctx.Err(); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("simserver: start fleet: %w", err)
		}
		port := 0
		if firstPort != 0 {
			port = firstPort + i
		}
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("simserver: instance %d: %w", i, err)
		}
		addr := ln.Addr().String()
		o := opts
		o.Name = addr
		if o.KVEvents, err = shiftPort(opts.KVEvents, i); err == nil {
			o.KVEventsReplay, err = shiftPort(opts.KVEventsReplay, i)
		}
		if err != nil {
			_ = ln.Close()
			_ = f.Close()
			return nil, fmt.Errorf("simserver: instance %d: %w", i, err)
		}
		in, err := newInstance(o)
		if err != nil {
			_ = ln.Close()
			_ = f.Close()
			return nil, fmt.Errorf("simserver: instance %d: %w", i, err)
		}
		// HTTP/1.1 as vLLM serves it, on kvroute's own server (internal/h1: cheaper per request
		// than net/http's), plus HTTP/2 without TLS (prior knowledge) for clients that multiplex
		// hundreds of streams over one connection: those connections go to net/http's server.
		h2 := &http.Server{Handler: in.Handler(), Protocols: new(http.Protocols)}
		h2.Protocols.SetUnencryptedHTTP2(true)
		handed := newConnListener(ln.Addr())
		srv := &h1.Server{Handler: in.Handler(), ReadHeaderTimeout: 10 * time.Second, HTTP2: handed.hand}
		f.instances = append(f.instances, in)
		f.servers = append(f.servers, srv, h2)
		f.urls = append(f.urls, "http://"+addr)
		f.serving.Add(2)
		go func() {
			defer f.serving.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				in.log.Error("serve", "err", err)
			}
		}()
		go func() {
			defer f.serving.Done()
			if err := h2.Serve(handed); err != nil && !errors.Is(err, http.ErrServerClosed) {
				in.log.Error("serve HTTP/2", "err", err)
			}
		}()
	}
	return f, nil
}

// shiftPort adds i to the port of a tcp://host:port endpoint (port 0 stays 0).
func shiftPort(endpoint string, i int) (string, error) {
	if endpoint == "" || i == 0 {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://HOST:PORT for a fleet", endpoint)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		return "", fmt.Errorf("kv events endpoint %q: bad port: %w", endpoint, err)
	}
	if p == 0 {
		return endpoint, nil
	}
	return "tcp://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(p+i)), nil
}

// URLs returns each instance's base URL, "http://host:port", in port order.
func (f *Fleet) URLs() []string { return append([]string(nil), f.urls...) }

// Instances returns the instances, in port order.
func (f *Fleet) Instances() []*Instance { return append([]*Instance(nil), f.instances...) }

// Shutdown stops accepting requests and lets in-flight ones (streams included) finish until
// ctx ends, then closes everything as Close does.
func (f *Fleet) Shutdown(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(f.servers))
	for i, s := range f.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Shutdown(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errors.Join(errs...), f.Close())
}

// Close stops the servers at once (open streams are cut) and the instances, and waits for
// every goroutine the fleet started.
func (f *Fleet) Close() error {
	var errs []error
	f.once.Do(func() {
		for _, s := range f.servers {
			if err := s.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		for _, in := range f.instances {
			if err := in.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		f.serving.Wait()
	})
	return errors.Join(errs...)
}

// server is what serves an instance: h1's server, and net/http's for HTTP/2.
type server interface {
	Shutdown(context.Context) error
	Close() error
}

// connListener is the listener of the HTTP/2 server: the connections h1's server hands over.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// hand gives c to the HTTP/2 server (or closes it when that server has stopped).
func (l *connListener) hand(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
