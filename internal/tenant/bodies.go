package tenant

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
)

// A tenant's request bodies being received hold a connection each, before any of the
// tenant's limits apply (those need the body: its model, its tokens). With one valid key, 300
// connections sending their bodies slowly held the API server's every connection
// (server.max_connections), and every other client was refused 503; a tenant whose
// max_concurrent is 2 held 100 of them. TakeBody bounds them per tenant (bodyLimit).

// ReasonBodies is the reason of kvroute_tenant_rejections_total for a request refused because
// its tenant already had as many request bodies being received as it may (TakeBody). It
// answers concurrency_limit_exceeded, as max_concurrent does, and is counted apart from it.
const ReasonBodies = "request_bodies"

// minBodies is the least bound on a tenant's bodies being received: a client's retry, or
// its next requests sent while the first is still uploading, fit under it whatever the
// tenant's max_concurrent.
const minBodies = 4

// bodyLimit is how many request bodies a tenant may have being received at once: twice its
// max_concurrent (maxConc), so that its next requests' bodies may arrive while its requests in
// flight run; at most a quarter of the API server's connection cap (conns), so that one tenant
// leaves three quarters of the connections to the others whatever its limits; at least
// minBodies. 0 (no bound) where neither is known: no max_concurrent, no connection cap known.
// The reason for each bound, for the refusal's message, is why.
func bodyLimit(maxConc, conns int) (limit int, why string) {
	if maxConc > 0 {
		limit, why = 2*maxConc, "twice limits.max_concurrent"
	}
	if share := conns / 4; conns > 0 && (limit == 0 || share < limit) {
		limit, why = share, "a quarter of server.max_connections"
	}
	if limit > 0 && limit < minBodies {
		limit = minBodies
	}
	return limit, why
}

// bodyWait is how long a request body waits for one of its tenant's places (TakeBody) before
// it is refused: as long as a body beyond server.max_pending_body_bytes waits for room. A
// client's burst of requests whose bodies arrive slowly (a slow network, a large prompt) waits
// for the ones before it rather than being refused; each waiter holds only the connection it
// already had, for this long at most.
const bodyWait = time.Second

// TakeBody holds one of id's places for a request body being received, before its body is
// read; BodyDone gives it back once the body is read (or the request ends without it). conns
// is the API server's connection cap (0: unknown). A tenant that has as many bodies being
// received as bodyLimit allows waits for a place up to bodyWait, then is refused: 429
// concurrency_limit_exceeded with Retry-After (set in h), counted under ReasonBodies. A client
// that goes away while it waits (ctx ends) gets 499 client_gone. id nil (authentication off)
// takes nothing.
func (g *Gate) TakeBody(ctx context.Context, id *Identity, conns int, h http.Header) *openai.Error {
	if id == nil || id.state == nil {
		return nil
	}
	s := id.state
	var timer *time.Timer
	for {
		s.mu.Lock()
		limit, why := bodyLimit(s.maxConc, conns)
		if limit <= 0 || s.bodies < limit {
			s.bodies++
			s.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		if s.bodyFreed == nil {
			s.bodyFreed = make(chan struct{})
		}
		freed := s.bodyFreed
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(bodyWait)
		}
		select {
		case <-freed:
			continue
		case <-ctx.Done():
			timer.Stop()
			return openai.NewError(499, "client_gone", "", "client_gone", "the client went away while its request body waited for a place")
		case <-timer.C:
		}
		setRetryAfter(h, time.Second)
		g.logger.LogAttrs(context.Background(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
			slog.String("code", "concurrency_limit_exceeded"), slog.String("reason", ReasonBodies))
		g.m.Rejection(s.name, ReasonBodies)
		g.m.Request(s.name, http.StatusTooManyRequests)
		return openai.NewError(http.StatusTooManyRequests, "requests", "", "concurrency_limit_exceeded",
			fmt.Sprintf("too many request bodies being received at once for this API key: at most %d at a time (%s), and none ended within %v; send each request's body at once, or retry when one has arrived", limit, why, bodyWait))
	}
}

// BodyDone gives back the place TakeBody held for a request body. id nil does nothing.
func (g *Gate) BodyDone(id *Identity) {
	if id == nil || id.state == nil {
		return
	}
	s := id.state
	s.mu.Lock()
	s.bodies--
	if s.bodyFreed != nil { // wake the bodies waiting for a place (TakeBody)
		close(s.bodyFreed)
		s.bodyFreed = nil
	}
	s.mu.Unlock()
}
