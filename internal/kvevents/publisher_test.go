package kvevents

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

// zmq4 v0.17.0 never stops a PUB socket's writer goroutine (socket.Close does not close it):
// one parked goroutine per publisher, ignored here.
var zmqPubWriter = goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run")

func TestPublishSubscribeReplay(t *testing.T) {
	defer goleak.VerifyNone(t, zmqPubWriter)
	p, err := NewPublisher(PublisherOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@test", Buffer: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub, err := NewSubscriber(p.Addr(), "kv@")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()

	batch := func(i int) Batch {
		return Batch{TS: float64(i), DPRank: -1, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{uint64(i)}, LoraID: -1}}}
	}
	// A PUB socket drops messages until the subscription reaches it: publish until one
	// arrives, bounded in count and time.
	got := make(chan Message, 64)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				errc <- err
				return
			}
			got <- m
		}
	}()
	var first Message
	deadline := time.After(5 * time.Second)
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatal("no message arrived after 200 publishes")
		}
		p.Publish(batch(i))
		select {
		case first = <-got:
		case <-time.After(20 * time.Millisecond):
			continue
		case <-deadline:
			t.Fatal("no message arrived in 5s")
		}
		break
	}
	if first.Topic != "kv@test" {
		t.Errorf("topic = %q, want kv@test", first.Topic)
	}
	if diff := cmp.Diff(batch(int(first.Seq)), first.Batch); diff != "" {
		t.Errorf("batch %d (-want +got):\n%s", first.Seq, diff)
	}

	// Replay from the start: only the last 4 (Buffer) are kept.
	next := p.NextSeq()
	for next < first.Seq+1 { // the sender may not have numbered everything yet
		next = p.NextSeq()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := Replay(ctx, p.ReplayAddr(), 0)
	if err != nil {
		t.Fatal(err)
	}
	last := p.NextSeq() - 1
	var seqs []int64
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
		if diff := cmp.Diff(batch(int(m.Seq)), m.Batch); diff != "" {
			t.Errorf("replayed batch %d (-want +got):\n%s", m.Seq, diff)
		}
	}
	var want []int64
	for s := max(0, last-3); s <= last; s++ {
		want = append(want, s)
	}
	if diff := cmp.Diff(want, seqs); diff != "" {
		t.Errorf("replayed seqs (-want +got):\n%s", diff)
	}
	// A replay over its bound of bytes ends with an error (one that never ends would grow
	// without end).
	replayLimit = 1
	_, err = Replay(ctx, p.ReplayAddr(), 0)
	replayLimit = MaxReplayBytes
	if err == nil || !strings.Contains(err.Error(), "without the end marker") {
		t.Errorf("a replay over its bound: %v, want an error", err)
	}
	// From beyond the end: only the end marker.
	msgs, err = Replay(ctx, p.ReplayAddr(), last+1)
	if err != nil || len(msgs) != 0 {
		t.Errorf("Replay(from %d) = %d messages, %v; want none", last+1, len(msgs), err)
	}
	sub.Close()
	<-errc
}

func TestNewPublisherBadEndpoint(t *testing.T) {
	if _, err := NewPublisher(PublisherOptions{Endpoint: "127.0.0.1:5557"}); err == nil {
		t.Error("NewPublisher without a scheme succeeded")
	}
}
