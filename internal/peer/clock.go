package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// A replica's periodic work runs on one ticker (Node.tick), so that an idle replica wakes
// once a period for all of it rather than once for each timer: expiring remote attempts,
// giving up silent streams, the heartbeats of idle feeds, the manager's check of the members
// and the sources' rejoin when it is due. A wake-up of an idle process costs more than the
// work (an idle syncing pair measured in docs/sync-cost.md).

// clock is the state Node.tick shares with the goroutines it wakes.
type clock struct {
	period time.Duration
	beat   atomic.Pointer[chan struct{}] // closed at each tick, then replaced

	mu      sync.Mutex
	streams map[*watched]struct{} // streams read here, checked for silence at each tick

	rejoinAt atomic.Int64 // unix nanoseconds when rejoin is due; 0: not waiting
	rejoin   chan struct{}
}

// watched is a stream under the silence watchdog: cancel ends it once last is older than the
// node's silence.
type watched struct {
	last   atomic.Int64 // unix nanoseconds of the stream's last message, or of its start
	cancel context.CancelFunc
	key    []byte // the key its messages are signed with
}

func newClock(beat, silence time.Duration) *clock {
	c := &clock{period: min(beat, silence/4), streams: map[*watched]struct{}{}, rejoin: make(chan struct{}, 1)}
	ch := make(chan struct{})
	c.beat.Store(&ch)
	return c
}

// beats returns the channel closed at the next tick.
func (c *clock) beats() <-chan struct{} { return *c.beat.Load() }

// watchStream puts a stream under the watchdog until the returned function is called.
func (c *clock) watchStream(cancel context.CancelFunc, key []byte) (*watched, func()) {
	w := &watched{cancel: cancel, key: key}
	w.last.Store(time.Now().UnixNano())
	c.mu.Lock()
	c.streams[w] = struct{}{}
	c.mu.Unlock()
	return w, func() {
		c.mu.Lock()
		delete(c.streams, w)
		c.mu.Unlock()
	}
}

// tick does the node's periodic work every clock period until ctx ends.
func (n *Node) tick(ctx context.Context) {
	c := n.clock
	t := time.NewTicker(c.period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n.share.Load().Expire() // Apply does too, but no event may come
			c.mu.Lock()
			for w := range c.streams {
				if now.Sub(time.Unix(0, w.last.Load())) >= n.silence {
					w.cancel()
					delete(c.streams, w)
				}
			}
			c.mu.Unlock()
			next := make(chan struct{})
			close(*c.beat.Swap(&next))
			n.changed() // the manager checks the members, in case an event was missed
			if at := c.rejoinAt.Load(); at != 0 && now.UnixNano() >= at-int64(c.period/2) {
				c.rejoinAt.Store(0)
				select {
				case c.rejoin <- struct{}{}:
				default:
				}
			}
		}
	}
}

// cutStreams ends the streams read here whose key keep refuses.
func (c *clock) cutStreams(keep func(key []byte) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.streams {
		if !keep(w.key) {
			w.cancel()
			delete(c.streams, w)
		}
	}
}

// waitRejoin waits until d has passed (to the tick nearest to it) or ctx ends.
func (n *Node) waitRejoin(ctx context.Context, d time.Duration) {
	c := n.clock
	c.rejoinAt.Store(time.Now().Add(d).UnixNano())
	select {
	case <-ctx.Done():
	case <-c.rejoin:
	}
}
