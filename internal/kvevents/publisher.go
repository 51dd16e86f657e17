package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// Endpoint is where the PUB socket binds, for example "tcp://127.0.0.1:5557" (port 0 picks
	// a free port; Addr tells which).
	Endpoint string
	// ReplayEndpoint, when set, is where the ROUTER replay socket binds.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" is vLLM's default).
	Topic string
	// Buffer is how many messages are kept for replay; 0 means 10000.
	Buffer int
	// Logger receives send and replay errors; nil discards them.
	Logger *slog.Logger
}

type stored struct {
	seq     int64
	payload []byte
}

// Publisher sends event batches on a ZMQ PUB socket, numbering them from 0, and answers replay
// requests from its buffer. Publish never blocks: batches are queued and sent by one goroutine.
type Publisher struct {
	topic  string
	log    *slog.Logger
	cancel context.CancelFunc
	pub    zmq4.Socket
	replay zmq4.Socket
	wg     sync.WaitGroup
	notify chan struct{}
	sent   atomic.Int64 // batches handed to pub

	mu      sync.Mutex
	queue   []Batch
	closed  bool
	ring    []stored // the last Buffer messages, oldest first
	max     int
	nextSeq int64
}

// NewPublisher binds the sockets and starts the sending goroutine. Close releases them.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	if err := checkEndpoint(opts.Endpoint); err != nil {
		return nil, fmt.Errorf("kv events endpoint: %w", err)
	}
	if opts.ReplayEndpoint != "" {
		if err := checkEndpoint(opts.ReplayEndpoint); err != nil {
			return nil, fmt.Errorf("kv events replay endpoint: %w", err)
		}
	}
	if opts.Buffer < 0 {
		return nil, fmt.Errorf("kv events buffer: %d is negative (use 0 for the default 10000)", opts.Buffer)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{
		topic:  opts.Topic,
		log:    log,
		cancel: cancel,
		notify: make(chan struct{}, 1),
		max:    opts.Buffer,
	}
	if p.max == 0 {
		p.max = 10000
	}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(guarded(opts.Endpoint)); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("kv events: %w", err)
	}
	if opts.ReplayEndpoint != "" {
		p.replay = zmq4.NewRouter(ctx)
		if err := p.replay.Listen(guarded(opts.ReplayEndpoint)); err != nil {
			cancel()
			_ = p.pub.Close()
			_ = p.replay.Close()
			return nil, fmt.Errorf("kv events replay: %w", err)
		}
		p.wg.Add(1)
		go p.serveReplay(ctx)
	}
	p.wg.Add(1)
	go p.send()
	return p, nil
}

func checkEndpoint(ep string) error {
	if !strings.HasPrefix(ep, "tcp://") && !strings.HasPrefix(ep, "ipc://") && !strings.HasPrefix(ep, "inproc://") {
		return fmt.Errorf("%q: want tcp://HOST:PORT (or ipc://, inproc://)", ep)
	}
	return nil
}

// Addr returns the PUB socket's bound address as tcp://host:port.
func (p *Publisher) Addr() string { return addrString(p.pub.Addr()) }

// ReplayAddr returns the replay socket's bound address, or "" when there is none.
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return addrString(p.replay.Addr())
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.Network() + "://" + a.String()
}

// Publish queues b for sending. It never blocks; after Close it drops b.
func (p *Publisher) Publish(b Batch) {
	p.mu.Lock()
	if !p.closed {
		p.queue = append(p.queue, b)
	}
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// Sent returns how many batches have been handed to the PUB socket: a subscriber that
// connects after that misses them all (NextSeq counts a batch from the moment it has its
// sequence number, a moment before it is sent).
func (p *Publisher) Sent() int64 { return p.sent.Load() }

// NextSeq returns the sequence number the next batch will get (the count of batches numbered
// so far, the last of which may still be on its way to the socket: Sent).
func (p *Publisher) NextSeq() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextSeq
}

// Close sends what is queued, then closes the sockets and waits for the goroutines.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
	// The sender exits once it finds the queue empty and closed.
	p.wg.Wait()
	return nil
}

func (p *Publisher) send() {
	defer p.wg.Done()
	defer func() {
		p.cancel()
		err := p.pub.Close()
		if p.replay != nil {
			err = errors.Join(err, p.replay.Close())
		}
		if err != nil {
			p.log.Debug("kv events: close", "err", err)
		}
	}()
	for range p.notify {
		p.mu.Lock()
		q, closed := p.queue, p.closed
		p.queue = nil
		p.mu.Unlock()
		for _, b := range q {
			p.sendOne(b)
		}
		if closed {
			p.mu.Lock()
			empty := len(p.queue) == 0
			p.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

func (p *Publisher) sendOne(b Batch) {
	payload, err := EncodeBatch(b)
	if err != nil {
		p.log.Error("kv events: encode", "err", err)
		return
	}
	p.mu.Lock()
	seq := p.nextSeq
	p.nextSeq++
	if len(p.ring) == p.max {
		copy(p.ring, p.ring[1:])
		p.ring = p.ring[:len(p.ring)-1]
	}
	p.ring = append(p.ring, stored{seq: seq, payload: payload})
	p.mu.Unlock()
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic), SeqBytes(seq), payload)); err != nil {
		p.log.Warn("kv events: send", "seq", seq, "err", err)
	}
	p.sent.Add(1)
}

// serveReplay answers [identity, "", start_seq] with every buffered message from start_seq
// on, each as [identity, "", seq, payload], then [identity, "", -1, ""].
func (p *Publisher) serveReplay(ctx context.Context) {
	defer p.wg.Done()
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Debug("kv events: replay recv", "err", err)
			// Do not spin on a socket that keeps failing.
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if len(msg.Frames) < 2 {
			continue
		}
		id := msg.Frames[0]
		start, err := ParseSeq(msg.Frames[len(msg.Frames)-1])
		if err != nil {
			p.log.Debug("kv events: bad replay request", "err", err)
			continue
		}
		p.mu.Lock()
		var out []stored
		for _, s := range p.ring {
			if s.seq >= start {
				out = append(out, s)
			}
		}
		p.mu.Unlock()
		for _, s := range out {
			if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, SeqBytes(s.seq), s.payload)); err != nil {
				p.log.Debug("kv events: replay send", "err", err)
				break
			}
		}
		if err := p.replay.Send(zmq4.NewMsgFrom(id, nil, SeqBytes(EndOfReplay), nil)); err != nil {
			p.log.Debug("kv events: replay end", "err", err)
		}
	}
}
