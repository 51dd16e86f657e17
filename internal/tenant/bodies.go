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

// TakeBody holds one of id's places for a request body being received, before its body is
// read; BodyDone gives it back once the body is read (or the request ends without it). conns
// is the API server's connection cap (0: unknown). A tenant that has as many bodies being
// received as bodyLimit allows is refused: 429 concurrency_limit_exceeded with Retry-After
// (set in h), counted under ReasonBodies. id nil (authentication off) takes nothing.
func (g *Gate) TakeBody(id *Identity, conns int, h http.Header) *openai.Error {
	if id == nil || id.state == nil {
		return nil
	}
	s := id.state
	s.mu.Lock()
	limit, why := bodyLimit(s.maxConc, conns)
	ok := limit <= 0 || s.bodies < limit
	if ok {
		s.bodies++
	}
	s.mu.Unlock()
	if ok {
		return nil
	}
	setRetryAfter(h, time.Second)
	g.logger.LogAttrs(context.Background(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
		slog.String("code", "concurrency_limit_exceeded"), slog.String("reason", ReasonBodies))
	g.m.Rejection(s.name, ReasonBodies)
	g.m.Request(s.name, http.StatusTooManyRequests)
	return openai.NewError(http.StatusTooManyRequests, "requests", "", "concurrency_limit_exceeded",
		fmt.Sprintf("too many request bodies being received at once for this API key: at most %d at a time (%s); send each request's body at once, or retry when one has arrived", limit, why))
}

// BodyDone gives back the place TakeBody held for a request body. id nil does nothing.
func (g *Gate) BodyDone(id *Identity) {
	if id == nil || id.state == nil {
		return
	}
	s := id.state
	s.mu.Lock()
	s.bodies--
	s.mu.Unlock()
}
