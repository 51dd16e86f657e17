package peer

import (
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/internal/testlog"
)

// TestFaultTransportShutdown: the fault-injection transport shuts down while packets and
// connections keep arriving, as they do from peers that still take the replica for alive (a
// replica cut off, then stopped). memberlist reads the transport's channels until its
// Shutdown has returned; the transport's listeners hand each packet and connection over
// without a timeout. Before, the forwarders stopped first, and a packet read in that instant
// held the listener, and Shutdown with it, for good (TestRestartAtNewAddress: "Run did not
// return").
func TestFaultTransportShutdown(t *testing.T) {
	for i := range 20 {
		for _, off := range []bool{false, true} {
			nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"},
				Logger: log.New(io.Discard, "", 0)})
			if err != nil {
				t.Fatal(err)
			}
			var isolated atomic.Bool
			isolated.Store(off)
			ft := newFaultTransport(nt, &isolated)
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort()))
			// memberlist's side: it reads until the transport has shut down.
			shut := make(chan struct{})
			read := make(chan struct{})
			go func() {
				defer close(read)
				for {
					select {
					case <-ft.PacketCh():
					case c := <-ft.StreamCh():
						_ = c.Close()
					case <-shut:
						return
					}
				}
			}()
			// The peers' side: packets and connections, until the shutdown is over.
			sent, flowing := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(sent)
				u, err := net.Dial("udp", addr)
				if err != nil {
					close(flowing)
					return
				}
				defer u.Close()
				for k := 0; k < 100000; k++ {
					select {
					case <-shut:
						return
					default:
					}
					_, _ = u.Write([]byte{1, 2, 3})
					if k == 100 {
						close(flowing)
					}
					if k%50 == 0 {
						if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
							_ = c.Close()
						}
					}
				}
			}()
			select { // packets in flight as it shuts down
			case <-flowing:
			case <-time.After(5 * time.Second):
				t.Fatal("no packets sent")
			}
			done := make(chan struct{})
			go func() {
				_ = ft.Shutdown()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatalf("round %d (isolated %v): Shutdown did not return within 2 s", i, off)
			}
			close(shut)
			for _, ch := range []chan struct{}{read, sent} {
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Fatal("a test goroutine did not end")
				}
			}
		}
	}
}

// TestLeaveTellsPeers: a replica that stops hands its leave to each live peer and returns,
// rather than waiting for memberlist's gossip to have sent it four times; the peers let it go
// at once, not after failure detection. Before, the stop with one live peer always took
// Leave's whole 1 s timeout, and with two, half of the time.
func TestLeaveTellsPeers(t *testing.T) {
	var logs testlog.Buffer
	a := startReplica(t, "a", nil, nil)
	b := startReplica(t, "b", []string{a.node.GossipAddr()}, logTo(&logs))
	c := startReplica(t, "c", []string{a.node.GossipAddr()}, logTo(&logs))
	waitFor(t, 10*time.Second, "all following each other", func() bool {
		return isFollowing(a, "b", "c")() && isFollowing(b, "a", "c")() && isFollowing(c, "a", "b")()
	})
	for _, step := range []struct {
		stop   *replica
		others []*replica
		left   []string // each other's peers after
		line   string
	}{
		{c, []*replica{a, b}, []string{"b", "a"}, "msg=\"left the peers\" replica=c peers=2 told=2"},
		{b, []*replica{a}, []string{""}, "msg=\"left the peers\" replica=b peers=1 told=1"},
	} {
		name := step.stop.node.Name()
		start := time.Now()
		step.stop.stop()
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("%s: Run returned %v after its context ended, want within 0.5 s", name, d)
		}
		// Failure detection takes seconds (a probe's timeout, then the suspicion).
		for i, o := range step.others {
			want := step.left[i]
			waitFor(t, time.Second, o.node.Name()+" letting "+name+" go", func() bool {
				return strings.Join(o.node.Status().Members, ",") == want
			})
		}
		if !strings.Contains(logs.String(), step.line) {
			t.Errorf("logs:\n%s\nwant %s", logs.String(), step.line)
		}
	}
}

// TestKeptResumesBounded: the resume points of peers let go are kept logAge after the peer was
// last heard at most, maxKeptResumes of them at most (the oldest go first), and given back
// only to the same run of the peer, once.
func TestKeptResumesBounded(t *testing.T) {
	n := &Node{kept: map[string]keptResume{}}
	now := time.Now()
	let := func(name string, inc, next uint64, heard time.Time) {
		f := &following{p: peerInfo{name: name, inc: inc}, next: next, dec: &decoder{}}
		f.heard.Store(heard.UnixNano())
		n.keepResume(f)
	}
	let("fresh", 1, 0, now) // nothing to resume from: not kept
	let("old", 1, 5, now.Add(-logAge))
	for i := range maxKeptResumes + 2 {
		let("p"+strconv.Itoa(i), 7, 10, now.Add(-time.Duration(maxKeptResumes+2-i)*time.Millisecond))
	}
	n.pruneKept(now)
	if len(n.kept) != maxKeptResumes {
		t.Errorf("kept %d resume points, want %d", len(n.kept), maxKeptResumes)
	}
	for _, name := range []string{"fresh", "old", "p0", "p1"} {
		if _, ok := n.kept[name]; ok {
			t.Errorf("%s kept", name)
		}
	}
	take := func(name string, inc uint64) (bool, uint64) {
		f := &following{p: peerInfo{name: name, inc: inc}}
		ok := n.takeResume(f)
		return ok, f.next
	}
	if ok, next := take("p2", 8); ok || next != 0 {
		t.Errorf("another run of p2 resumes at %d", next)
	}
	if ok, _ := take("p2", 7); ok {
		t.Error("p2's point given again after another run of it came")
	}
	if ok, next := take("p3", 7); !ok || next != 10 {
		t.Errorf("p3 resumes: %v at %d, want at 10", ok, next)
	}
	if ok, _ := take("p3", 7); ok {
		t.Error("p3's point given twice")
	}
}
