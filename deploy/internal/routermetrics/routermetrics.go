// Package routermetrics says which metric families a router exports, for the tests of the
// dashboard and the alerting rules: those internal/metrics makes (metrics.Names), and those a
// running router registers besides, such as the API server's connection and body counts, read
// from the /metrics of a router started on loopback.
package routermetrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/metrics"
)

// routerConfig is a router with one endpoint that is never asked: nothing listens on port 9 of
// loopback, and neither scrapes nor the hourly health check reach it before the router stops.
const routerConfig = `
endpoints: [{url: "http://127.0.0.1:9", engine: vllm, models: [m]}]
scrape: {disabled: true}
health: {interval: 1h}
auth: {mode: none}
`

// Names returns every metric family a router exports (histograms under their base name),
// sorted: metrics.Names and what a router started on loopback serves at /metrics.
func Names(ctx context.Context) ([]string, error) {
	names, err := metrics.Names()
	if err != nil {
		return nil, err
	}
	served, err := Served(ctx)
	if err != nil {
		return nil, err
	}
	names = append(names, served...)
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Served starts a router on loopback, reads the families its /metrics has (the "# TYPE"
// lines), and stops it.
func Served(ctx context.Context) (names []string, err error) {
	cfg, err := config.Parse([]byte(routerConfig))
	if err != nil {
		return nil, err
	}
	r, err := app.NewRouter(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	api, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		api.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stop, stopServe := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Serve(stop, api, admin) }()
	defer func() {
		stopServe()
		select {
		case serr := <-done:
			err = errors.Join(err, serr)
		case <-time.After(15 * time.Second):
			err = errors.Join(err, errors.New("the router did not stop within 15 s"))
		}
	}()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin.Addr().String()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "# TYPE "); ok {
			name, _, _ := strings.Cut(rest, " ")
			names = append(names, name)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, errors.New("GET /metrics: no metric family")
	}
	slices.Sort(names)
	return names, nil
}
