package kvevents

import (
	"context"
	"fmt"

	"github.com/go-zeromq/zmq4"
)

// Subscriber receives published batches from one engine's PUB socket.
type Subscriber struct {
	cancel context.CancelFunc
	sub    zmq4.Socket
}

// NewSubscriber connects to endpoint and subscribes to messages whose topic starts with topic
// ("" for all). Close releases it.
func NewSubscriber(endpoint, topic string) (*Subscriber, error) {
	if err := checkEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("kv events subscriber: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	if err := sub.Dial(guarded(endpoint)); err != nil {
		cancel()
		_ = sub.Close()
		return nil, fmt.Errorf("kv events subscriber: %w", err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		cancel()
		_ = sub.Close()
		return nil, fmt.Errorf("kv events subscriber: subscribe %q: %w", topic, err)
	}
	return &Subscriber{cancel: cancel, sub: sub}, nil
}

// Recv blocks until the next message arrives or the subscriber is closed.
func (s *Subscriber) Recv() (Message, error) {
	msg, err := s.sub.Recv()
	if err != nil {
		return Message{}, fmt.Errorf("kv events subscriber: %w", err)
	}
	return DecodeMessage(msg.Frames)
}

// Close disconnects; a blocked Recv returns an error.
func (s *Subscriber) Close() error {
	s.cancel()
	return s.sub.Close()
}

// MaxReplayBytes bounds the payloads one Replay takes: a replay socket that never sends its end
// marker would otherwise grow the answer without end.
const MaxReplayBytes = 256 << 20

// replayLimit is MaxReplayBytes (tests lower it).
var replayLimit = MaxReplayBytes

// Replay asks a replay socket for every buffered message from seq from on and returns them in
// order (the end marker is not included), at most MaxReplayBytes of payloads. Topics are not
// part of replies: Topic is "".
func Replay(ctx context.Context, endpoint string, from int64) ([]Message, error) {
	if err := checkEndpoint(endpoint); err != nil {
		return nil, fmt.Errorf("kv events replay: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(guarded(endpoint)); err != nil {
		return nil, fmt.Errorf("kv events replay: %w", err)
	}
	if err := d.Send(zmq4.NewMsgFrom(nil, SeqBytes(from))); err != nil {
		return nil, fmt.Errorf("kv events replay: send request: %w", err)
	}
	var out []Message
	taken := 0
	for {
		msg, err := d.Recv()
		if err != nil {
			return out, fmt.Errorf("kv events replay: receive: %w", err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 && len(f) != 2 {
			f = f[1:] // the empty delimiter frame
		}
		if len(f) != 2 {
			return out, fmt.Errorf("kv events replay: want [seq, payload] frames, got %d", len(f))
		}
		seq, err := ParseSeq(f[0])
		if err != nil {
			return out, fmt.Errorf("kv events replay: %w", err)
		}
		if seq == EndOfReplay {
			return out, nil
		}
		if taken += len(f[1]); taken > replayLimit {
			return out, fmt.Errorf("kv events replay: over %d bytes of messages without the end marker", replayLimit)
		}
		b, err := DecodeBatch(f[1])
		if err != nil {
			return out, fmt.Errorf("kv events replay %d: %w", seq, err)
		}
		out = append(out, Message{Seq: seq, Batch: b})
	}
}
