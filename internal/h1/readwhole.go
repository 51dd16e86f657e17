package h1

// ReadWhole reads the next len(p) bytes of the body into p, which the caller knows the body
// still holds (p no longer than the Content-Length announced, less what was read): it returns
// when p is full (with io.EOF if the body ends there), or at an error, as io.ReadFull would.
// While it waits for more, the connection's socket is asked (SO_RCVLOWAT, on Linux) to wake
// the reader only once all that p still lacks has arrived, or the kernel's buffer is under
// pressure, rather than at every segment: a 400 KB body sent over loopback otherwise woke the
// reading goroutine (a park and a thread hand-off each) a dozen times. The threshold is reset
// before ReadWhole returns, so the next request's head is read as before. A p longer than what
// the client sends waits for the body read timeout, as any read of a body that stalls does.
func (b *reqBody) ReadWhole(p []byte) (int, error) {
	n := 0
	set := 1 // the threshold in force
	defer func() {
		if set != 1 {
			setLowWater(b.c.rwc, 1)
		}
	}()
	for n < len(p) {
		if n > 0 { // the first read takes what is buffered and what the socket holds
			if need := len(p) - n - b.c.br.Buffered(); need != set && (need >= minLowWater || set != 1) {
				// need may be below 1 only while bufio holds the rest: no wait then.
				set = max(need, 1)
				if !setLowWater(b.c.rwc, set) {
					set = 1 // not a socket that has one: read as usual
				}
			}
		}
		m, err := b.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// minLowWater is the least a body must still lack for ReadWhole to set the socket's threshold
// (a system call, and another to reset it): below it, a wait or two cost less.
const minLowWater = 32 << 10
