package proxy

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/tenant"
)

// An engine's usage is taken on trust for the tenant's charge, the metrics, the policy's
// outcome, the peers' events and what the tenant's next requests reserve: an engine that
// miscounts (a bug, a proxy in front of it that rewrites bodies, an engine that is not what it
// says) could otherwise charge a tenant 9e18 tokens, which, settled, overflowed the tenant's
// bucket and locked it out for good, and taught the gate a decode rate of 3e18 tokens a
// second. boundUsage holds each count to what the request can have had.

// boundUsage returns u with its counts within what the request can have had, and logs the
// first clamp of the handler at WARN (the next ones at DEBUG: an engine that miscounts would
// otherwise log a line per request). Prompt and cached counts are at most math.MaxInt32 (the
// router's estimate of the prompt is no bound: an image is a few bytes of URL and hundreds of
// tokens); the completion at most usageCompletionBound; none below 0.
func (c *call) boundUsage(u openai.Usage) openai.Usage {
	bound := c.usageCompletionBound()
	reported := u.Completion()
	clampInt := func(p *int, hi int) bool {
		v := min(max(*p, 0), hi)
		changed := v != *p
		*p = v
		return changed
	}
	clamped := clampInt(&u.CompletionTokens, bound)
	clamped = clampInt(&u.OutputTokens, bound) || clamped
	clamped = clampInt(&u.PromptTokens, math.MaxInt32) || clamped
	clamped = clampInt(&u.InputTokens, math.MaxInt32) || clamped
	clamped = clampInt(&u.TotalTokens, math.MaxInt32) || clamped
	for _, d := range []**openai.TokenDetails{&u.PromptTokensDetails, &u.InputTokensDetails} {
		if *d != nil && ((*d).CachedTokens < 0 || (*d).CachedTokens > math.MaxInt32) {
			v := **d // a copy: the parsed usage may be shared
			clampInt(&v.CachedTokens, math.MaxInt32)
			*d, clamped = &v, true
		}
	}
	if clamped && !c.usageClamped {
		c.usageClamped = true
		level := slog.LevelDebug
		if c.h.usageWarned.CompareAndSwap(false, true) {
			level = slog.LevelWarn
		}
		name := ""
		if c.rc != nil {
			if ep := c.rc.Endpoint(); ep != nil {
				name = ep.Name
			}
		}
		c.h.Logger.LogAttrs(context.Background(), level, "the engine's usage is out of range: counted as the most the request can have had",
			slog.String("request_id", c.rid), slog.String("endpoint", name),
			slog.Int("completion_tokens", reported), slog.Int("completion_bound", bound))
	}
	return u
}

// usageCompletionBound is the most completion tokens an answer to the request can hold: for
// each sequence its engine generates (seqs), max_tokens where the request sets it, and at most
// tenant.MaxDecodeRate a second since it was routed, counting at least a second (a clock that
// stands still, a first answer within the second); at most math.MaxInt32.
func (c *call) usageCompletionBound() int {
	elapsed := time.Duration(0)
	if !c.routed.IsZero() && c.h.Lifecycle != nil {
		elapsed = c.h.Lifecycle.Now().Sub(c.routed)
	}
	per := max(elapsed, time.Second).Seconds() * tenant.MaxDecodeRate
	if c.req != nil && c.req.MaxTokens > 0 {
		per = min(per, float64(c.req.MaxTokens))
	}
	return int(min(per*float64(max(c.seqs, 1)), math.MaxInt32))
}

// clampTokens bounds a count of tokens charged to [0, math.MaxInt32], computed in float64 so
// that no product of counts wraps.
func clampTokens(v float64) int {
	if !(v > 0) {
		return 0 // NaN too
	}
	return int(min(v, math.MaxInt32))
}
