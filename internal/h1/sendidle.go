package h1

import (
	"sync"
	"time"
)

// sendState is what the kernel tells of the bytes written to a client (sendIdle).
type sendState struct {
	queued uint32 // written and not yet acknowledged (SIOCOUTQ)
	sentMs uint32 // since the kernel last sent data, ms (tcpi_last_data_sent)
	ackMs  uint32 // since it last received an acknowledgement, ms (tcpi_last_ack_recv)
	acked  uint64 // the bytes the client acknowledged, all told (tcpi_bytes_acked)
}

// sendProgress keeps a connection's acknowledged bytes from one sendIdle to the next, and
// when they were last seen to grow. The zero value has seen none.
type sendProgress struct {
	mu    sync.Mutex
	seen  bool
	acked uint64
	at    int64 // Unix ns
}

// judge returns how long the client has taken none of the bytes written to it, by st, at now
// (Unix ns), and notes st.acked. Bytes acknowledged since the last call, or none held, count
// as taken now: the call may come up to a round of its caller late, and the idle time it
// returns is then short by that much, never long. At the first call, with nothing to compare,
// the acknowledged bytes tell nothing and the time fields alone judge.
func (pr *sendProgress) judge(st sendState, now int64) time.Duration {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	first := !pr.seen
	if first || st.queued == 0 || st.acked != pr.acked {
		pr.seen, pr.acked, pr.at = true, st.acked, now
	}
	if st.queued == 0 {
		return 0
	}
	idle := time.Duration(max(st.sentMs, st.ackMs)) * time.Millisecond
	return max(idle, time.Duration(now-pr.at))
}
