package tenant

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
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
// for the ones before it rather than being refused. Each waiter holds the connection it came
// on, for this long at most, and no more bodies wait than the tenant has places (bodyLimit):
// the rest are refused at once, so that a tenant's waiting bodies hold at most as many
// connections again as its places do (a client that reconnected at each refusal held one
// waiting connection per attempt).
const bodyWait = time.Second

// bodyWaiter is a body waiting for one of its tenant's places, in the order it came: a place
// given back (BodyDone) is handed to the first, which then holds it (granted), closing ready.
type bodyWaiter struct {
	ready   chan struct{}
	granted bool
}

// TakeBody holds one of id's places for a request body being received, before its body is
// read; BodyDone gives it back once the body is read (or the request ends without it). conns
// is the API server's connection cap (0: unknown). A tenant that has as many bodies being
// received as bodyLimit allows waits for a place up to bodyWait, first come first served,
// then is refused: 429 concurrency_limit_exceeded with Retry-After (set in h), counted under
// ReasonBodies; so is one that finds as many bodies waiting as the tenant has places. A client
// that goes away while it waits (ctx ends) gets 499 client_gone. id nil (authentication off)
// takes nothing.
func (g *Gate) TakeBody(ctx context.Context, id *Identity, conns int, h http.Header) *openai.Error {
	if id == nil || id.state == nil {
		return nil
	}
	s := id.state
	s.mu.Lock()
	limit, why := bodyLimit(s.maxConc, conns)
	s.bodyLimit, s.bodyConns = limit, conns
	s.admitBodies() // those waiting first, should the bound have risen since they came
	if limit <= 0 || s.bodies < limit && len(s.bodyWaiters) == 0 {
		s.bodies++
		s.mu.Unlock()
		return nil
	}
	if len(s.bodyWaiters) >= limit {
		s.mu.Unlock()
		return g.refuseBody(s, limit, why, h, "and as many wait for one")
	}
	w := &bodyWaiter{ready: make(chan struct{})}
	s.bodyWaiters = append(s.bodyWaiters, w)
	s.mu.Unlock()
	timer := time.NewTimer(bodyWait)
	defer timer.Stop()
	var gone bool
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		gone = true
	case <-timer.C:
	}
	s.mu.Lock()
	if w.granted { // handed a place as the wait ended: it is this body's
		s.mu.Unlock()
		if gone {
			g.BodyDone(id)
			return openai.NewError(499, "client_gone", "", "client_gone", "the client went away while its request body waited for a place")
		}
		return nil
	}
	if i := slices.Index(s.bodyWaiters, w); i >= 0 {
		s.bodyWaiters = slices.Delete(s.bodyWaiters, i, i+1)
	}
	// The refusal names the bound in force now: a reload or a replica count may have moved
	// it while the body waited (one that raised it would have let the body in).
	limit, why = bodyLimit(s.maxConc, conns)
	s.mu.Unlock()
	if gone {
		return openai.NewError(499, "client_gone", "", "client_gone", "the client went away while its request body waited for a place")
	}
	return g.refuseBody(s, limit, why, h, fmt.Sprintf("and none ended within %v", bodyWait))
}

// refuseBody is TakeBody's refusal of a body of s, whose tenant may have limit bodies being
// received (why: the bound's reason), and what it found (had).
func (g *Gate) refuseBody(s *tenantState, limit int, why string, h http.Header, had string) *openai.Error {
	setRetryAfter(h, time.Second)
	g.logger.LogAttrs(context.Background(), slog.LevelDebug, "tenant limit", slog.String("tenant", s.name),
		slog.String("code", "concurrency_limit_exceeded"), slog.String("reason", ReasonBodies))
	g.m.Rejection(s.name, ReasonBodies)
	g.m.Request(s.name, http.StatusTooManyRequests)
	return openai.NewError(http.StatusTooManyRequests, "requests", "", "concurrency_limit_exceeded",
		fmt.Sprintf("too many request bodies being received at once for this API key: at most %d at a time (%s), %s; send each request's body at once, or retry when one has arrived", limit, why, had))
}

// BodyDone gives back the place TakeBody held for a request body: to the first body waiting
// for one, if any (and to as many more as a raised bound lets in). id nil does nothing.
func (g *Gate) BodyDone(id *Identity) {
	if id == nil || id.state == nil {
		return
	}
	s := id.state
	s.mu.Lock()
	s.bodies--
	s.admitBodies()
	s.mu.Unlock()
}

// admitBodies hands the places free under the bound (bodyLimit; none: every place) to the
// bodies waiting, first come first: at a body's end, at a new body (the bound it finds may
// have risen), and when max_concurrent changes (a reload, the replica count: setLimits). The
// caller holds l.mu.
func (l *limiter) admitBodies() {
	for len(l.bodyWaiters) > 0 && (l.bodyLimit <= 0 || l.bodies < l.bodyLimit) {
		w := l.bodyWaiters[0]
		l.bodyWaiters[0] = nil
		l.bodyWaiters = l.bodyWaiters[1:]
		l.bodies++
		w.granted = true
		close(w.ready)
	}
}
