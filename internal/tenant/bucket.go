package tenant

import (
	"math"
	"time"
)

// bucket is a token bucket holding up to limit units that refills at limit per minute. Unlike
// golang.org/x/time/rate it may go into debt: a request admitted on an estimate is settled
// later with what it really used, which can be more than the estimate (the debt delays the
// tenant's next requests) or less (the difference is given back). rate.Limiter can neither
// give back part of a reservation nor charge more than its burst. Not safe for concurrent use:
// the tenant's mutex guards it.
type bucket struct {
	limit  float64 // units per minute and capacity; 0: unlimited
	tokens float64 // may be negative (debt)
	last   time.Time
}

// maxDebtMinutes bounds a bucket's debt: at most this many minutes of its refill, so that no
// settlement makes a tenant wait more than an hour and a minute. An hour is far beyond what an
// honest request leaves owing where reservations hold it back (the debts measured were 2 to 3
// minutes of refill: docs/security.md), and a debt larger than that says more of an engine's
// miscount than of the tenant's use: unbounded, one usage of 9e18 tokens, settled, wrapped the
// wait past time.Duration's range and locked the tenant out for good. Not a minute of refill:
// a tenant that asks for long answers without max_tokens (n 128, say, which one reservation of
// the whole limit admits) would then pay for one minute whatever its answers had.
const maxDebtMinutes = 60

func newBucket(perMinute int, now time.Time) bucket {
	return bucket{limit: float64(perMinute), tokens: float64(perMinute), last: now}
}

func (b *bucket) unlimited() bool { return b.limit <= 0 }

// perSecond is the refill rate.
func (b *bucket) perSecond() float64 { return b.limit / 60 }

func (b *bucket) refill(now time.Time) {
	if b.unlimited() {
		return
	}
	if dt := now.Sub(b.last); dt > 0 {
		b.tokens = math.Min(b.limit, b.tokens+dt.Seconds()*b.perSecond())
	}
	if now.After(b.last) {
		b.last = now
	}
}

// take removes n units when they are all there; else it returns how long until they are.
func (b *bucket) take(now time.Time, n float64) (ok bool, wait time.Duration) {
	if b.unlimited() {
		return true, 0
	}
	b.refill(now)
	if b.tokens >= n {
		b.tokens -= n
		return true, 0
	}
	return false, b.until(n)
}

// until is how long until the bucket holds n units (from its last refill).
func (b *bucket) until(n float64) time.Duration {
	missing := n - b.tokens
	if missing <= 0 {
		return 0
	}
	// Up to the next nanosecond, forgiving float rounding (20s must not become 20.000000001s).
	ns := math.Ceil(missing/b.perSecond()*float64(time.Second) - 1e-3)
	if !(ns < float64(maxWait)) {
		return maxWait // n more than the bucket holds (callers ask at most its limit), or NaN
	}
	return time.Duration(ns)
}

// maxWait is the longest until says: the time from the deepest debt to a full bucket.
const maxWait = (maxDebtMinutes + 1) * time.Minute

// adjust adds delta units (negative: a charge that may leave a debt), never above the limit
// nor below a debt of maxDebtMinutes of refill.
func (b *bucket) adjust(now time.Time, delta float64) {
	if b.unlimited() || math.IsNaN(delta) {
		return
	}
	b.refill(now)
	b.tokens = min(b.limit, max(b.tokens+delta, -maxDebtMinutes*b.limit))
}

// remaining is the whole units left now (0 while in debt) and how long until the bucket is
// full again (OpenAI's x-ratelimit-reset-*).
func (b *bucket) remaining(now time.Time) (int, time.Duration) {
	b.refill(now)
	return int(math.Max(0, math.Floor(b.tokens))), b.until(b.limit)
}

// full reports whether the bucket holds its whole limit now (an unlimited one always does).
func (b *bucket) full(now time.Time) bool {
	if b.unlimited() {
		return true
	}
	b.refill(now)
	return b.tokens >= b.limit
}

// setLimit changes the limit, keeping the fraction of the bucket in use (config reload).
func (b *bucket) setLimit(now time.Time, perMinute int) {
	b.refill(now)
	nl := float64(perMinute)
	switch {
	case nl == b.limit:
	case b.limit <= 0 || nl <= 0:
		b.tokens = nl
	default:
		b.tokens = b.tokens / b.limit * nl
	}
	b.limit = nl
}
