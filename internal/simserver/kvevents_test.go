package simserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
	"github.com/kvroute/kvroute/internal/prefix"
)

// TestKVEventStream decodes the published KV events into exactly the block hashes the engine
// stored and removed, each stored block with the token ids of its text, and fetches the
// batches a late subscriber missed from the replay socket.
func TestKVEventStream(t *testing.T) {
	const blocks, bs, promptTokens = 40, 16, 320 // 20 blocks a prompt: the third one evicts
	f := startFleet(t, Options{Profile: "instant", KVBlocks: blocks, BlockSize: bs,
		KVEvents: "tcp://127.0.0.1:0", KVEventsReplay: "tcp://127.0.0.1:0"}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	pubAddr, replayAddr := in.KVEventsAddr()

	// The hashes the engine computes for each prompt (an engine of the same shape, used only
	// for BlockHashes).
	ref, err := engine.New(engine.Config{Profile: in.cfg.Profile, BlockSize: bs, NumBlocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	everStored := map[uint64]bool{}
	blockIDs := map[uint64][]int64{} // the token ids of each block
	send := func(i int) {
		prompt := text(fmt.Sprintf("prompt %d:", i), promptTokens)
		var keys []uint64
		for j := 0; j+prefix.BlockBytes(bs) <= len(prompt); j += prefix.BlockBytes(bs) {
			keys = append(keys, xxhash.Sum64String(prompt[j:j+prefix.BlockBytes(bs)]))
		}
		want := ref.BlockHashes(engine.Request{PromptTokens: promptTokens, BlockKeys: keys})
		// The exported helper a precise-mode router uses gives the same hashes.
		if diff := cmp.Diff(want, BlockHashes([]byte(prompt), bs, "")); diff != "" {
			t.Fatalf("BlockHashes differs from the engine's (-engine +helper):\n%s", diff)
		}
		ids := TokenIDs(nil, []byte(prompt), bs)
		for i, h := range want {
			everStored[h] = true
			blockIDs[h] = ids[i*bs : (i+1)*bs]
		}
		resp, _ := post(t, url, "/v1/completions", fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":1}`, DefaultModel, prompt))
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}

	send(0) // published before anyone listens: only the replay has it
	// The driver publishes a step's events after the step, which may be after the response:
	// wait until batch 0 has left, or a subscriber quick to connect could still see it.
	for deadline := time.Now().Add(5 * time.Second); in.kvSent.Load() == 0 || in.pub.Sent() < in.kvSent.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("batch 0 was not published within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	subscribe := func() (stop func(), live chan kvevents.Message) {
		sub, err := kvevents.NewSubscriber(pubAddr, "kv@")
		if err != nil {
			t.Fatal(err)
		}
		live = make(chan kvevents.Message, 1024)
		go func() {
			defer close(live)
			for {
				m, err := sub.Recv()
				if err != nil {
					return
				}
				live <- m
			}
		}()
		return func() {
			sub.Close()
			for range live {
			}
		}, live
	}
	// Keep sending until the subscription is live (bounded), then a few more. The PUB socket
	// queues what is sent and hands it to the subscribers it has when its writer gets to it, so
	// a subscriber quick to connect can still get batch 0 after Sent counts it: then a new
	// subscriber tries again, after more batches (at most three).
	var got map[int64]kvevents.Message
	var live chan kvevents.Message
	var firstLive int64
	next := 1
	var stop func()
	defer func() { stop() }()
	for attempt := 1; ; attempt++ {
		stop, live = subscribe()
		got = map[int64]kvevents.Message{}
		for ; next < 60; next++ {
			send(next)
			drain(live, got)
			if len(got) > 0 && next >= 4 {
				next++
				break
			}
		}
		if len(got) == 0 {
			t.Fatal("the subscriber received nothing")
		}
		if firstLive = slices.Min(slices.Collect(maps.Keys(got))); firstLive > 0 {
			break
		}
		if attempt == 3 {
			t.Fatal("three subscribers in a row saw batch 0, published before any subscribed")
		}
		t.Logf("subscriber %d saw batch 0, still in the PUB socket's queue when it connected; subscribing again", attempt)
		stop()
	}

	// Wait until the driver has published the last request's events (its stats snapshot is
	// stored after it publishes), the publisher has sent them, and they arrived live.
	deadline := time.Now().Add(5 * time.Second)
	sent := int64(len(everStored) / (promptTokens / bs))
	for (in.Stats().Finished < sent || in.pub.Sent() < in.kvSent.Load() ||
		int64(len(got)) < in.pub.NextSeq()-firstLive) && time.Now().Before(deadline) {
		select {
		case m := <-live:
			got[m.Seq] = m
		case <-time.After(10 * time.Millisecond):
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	replayed, err := kvevents.Replay(ctx, replayAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range replayed {
		if l, ok := got[m.Seq]; ok {
			if diff := cmp.Diff(l.Batch, m.Batch); diff != "" {
				t.Errorf("replayed batch %d differs from the live one (-live +replay):\n%s", m.Seq, diff)
			}
			continue
		}
		if m.Seq >= firstLive {
			t.Errorf("replay returned batch %d that was published while subscribed but not received", m.Seq)
		}
		got[m.Seq] = m
	}
	last := in.pub.NextSeq() - 1
	for s := int64(0); s <= last; s++ {
		if _, ok := got[s]; !ok {
			t.Fatalf("batch %d neither received live nor replayed (last %d, first live %d)", s, last, firstLive)
		}
	}

	// Apply the events in order: a removal must name a stored block; what remains must be what
	// the engine still caches.
	cached := map[uint64]bool{}
	stored := map[uint64]bool{}
	removed := 0
	for s := int64(0); s <= last; s++ {
		for _, ev := range got[s].Batch.Events {
			switch ev.Kind {
			case kvevents.BlockStored:
				if ev.BlockSize != bs {
					t.Errorf("BlockStored block_size %d, want %d", ev.BlockSize, bs)
				}
				var want []int64
				for _, h := range ev.BlockHashes {
					want = append(want, blockIDs[h]...)
				}
				if diff := cmp.Diff(want, ev.TokenIDs); diff != "" {
					t.Errorf("batch %d: BlockStored token_ids of %d blocks (-text +event):\n%s", s, len(ev.BlockHashes), diff)
				}
				for _, h := range ev.BlockHashes {
					cached[h], stored[h] = true, true
				}
			case kvevents.BlockRemoved:
				for _, h := range ev.BlockHashes {
					if !cached[h] {
						t.Errorf("batch %d removes block %x that is not cached", s, h)
					}
					delete(cached, h)
					removed++
				}
			}
		}
	}
	if diff := cmp.Diff(everStored, stored); diff != "" {
		t.Errorf("stored block hashes: (-engine +events):\n%s", diff)
	}
	st := in.Stats()
	if removed == 0 || len(cached) != st.CachedFreeBlocks+st.UsedBlocks {
		t.Errorf("events leave %d blocks cached after %d removals; the engine caches %d", len(cached), removed, st.CachedFreeBlocks+st.UsedBlocks)
	}
	t.Logf("%d batches (%d missed and replayed), %d blocks stored, %d removed", last+1, firstLive, len(stored), removed)
}

func drain(ch <-chan kvevents.Message, into map[int64]kvevents.Message) {
	for {
		select {
		case m, ok := <-ch:
			if !ok {
				return
			}
			into[m.Seq] = m
		default:
			return
		}
	}
}

// replayAll waits until the instance has published every batch of its finished requests
// (finished of them) and returns them all from the replay socket.
func replayAll(t *testing.T, in *Instance, finished int64) []kvevents.Message {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for in.Stats().Finished < finished || in.pub.Sent() < in.kvSent.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %d requests finished (want %d), %d batches sent of %d", in.Stats().Finished, finished, in.pub.Sent(), in.kvSent.Load())
		}
		time.Sleep(time.Millisecond)
	}
	_, replayAddr := in.KVEventsAddr()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := kvevents.Replay(ctx, replayAddr, 0)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

// TestKVEventTokenIDs sends prompts that share blocks (in one list, across requests, under
// two salts) on an instance small enough to evict: every BlockStored event carries block_size
// ids a block, and a block's ids are those of its text whichever request stored it.
func TestKVEventTokenIDs(t *testing.T) {
	const bs = 16
	f := startFleet(t, Options{Profile: "instant", BlockSize: bs, KVBlocks: 64,
		KVEvents: "tcp://127.0.0.1:0", KVEventsReplay: "tcp://127.0.0.1:0"}, 1)
	in, url := f.Instances()[0], f.URLs()[0]
	shared := text("shared system prompt", 160) // 10 blocks
	prompts := []struct {
		list []string
		salt string
	}{
		{[]string{shared + text(" q1", 50), shared + text(" q2", 70), shared}, ""},
		{[]string{shared + text(" q3", 90)}, ""},
		{[]string{shared + text(" q1", 50)}, "tenant-a"},
		{[]string{text("other", 600)}, ""}, // 37 blocks: evicts
		{[]string{shared + text(" q1", 50), text("tail", 33)}, ""},
	}
	want := map[uint64][]int64{} // block hash -> ids
	finished := int64(0)
	for i, p := range prompts {
		list, _ := json.Marshal(p.list)
		body := fmt.Sprintf(`{"model":%q,"prompt":%s,"max_tokens":2,"cache_salt":%q}`, DefaultModel, list, p.salt)
		resp, _ := post(t, url, "/v1/completions", body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		finished += int64(len(p.list))
		for _, s := range p.list {
			hashes := BlockHashes([]byte(s), bs, p.salt)
			ids := TokenIDs(nil, []byte(s), bs)
			if len(ids) != len(hashes)*bs {
				t.Fatalf("prompt of %d bytes: %d ids for %d blocks", len(s), len(ids), len(hashes))
			}
			for j, h := range hashes {
				want[h] = ids[j*bs : (j+1)*bs]
			}
		}
	}
	stored, removed := 0, 0
	for _, m := range replayAll(t, in, finished) {
		for _, ev := range m.Batch.Events {
			switch ev.Kind {
			case kvevents.BlockStored:
				var ids []int64
				for _, h := range ev.BlockHashes {
					w, ok := want[h]
					if !ok {
						t.Fatalf("batch %d stores block %x of no prompt", m.Seq, h)
					}
					ids = append(ids, w...)
				}
				if diff := cmp.Diff(ids, ev.TokenIDs); diff != "" {
					t.Errorf("batch %d: token_ids of %d blocks (-text +event):\n%s", m.Seq, len(ev.BlockHashes), diff)
				}
				stored += len(ev.BlockHashes)
			case kvevents.BlockRemoved:
				removed += len(ev.BlockHashes)
			}
		}
	}
	if stored == 0 || removed == 0 {
		t.Errorf("%d blocks stored, %d removed: want both", stored, removed)
	}
	if len(in.blocks) != 0 {
		t.Errorf("%d block texts still tracked with no request in the engine", len(in.blocks))
	}
}
