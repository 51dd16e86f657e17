package peer

import (
	"fmt"
	"io"
	"log"
	"net"
	"runtime"
	"slices"
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
			ft := newFaultTransport(newStreamTransport(nt), &isolated)
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

// exchangesInFlight counts the goroutines in an outgoing memberlist state exchange (a join's,
// a leave's, a periodic one), and those of them that handState started.
func exchangesInFlight() (all, handState int) {
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "memberlist.(*Memberlist).sendAndReceiveState") {
			all++
			if strings.Contains(g, "peer.(*Node).handState") {
				handState++
			}
		}
	}
	return all, handState
}

// TestStopEndsExchangesToFrozenPeer: a replica stops while a peer it takes for alive is
// frozen (its kernel takes the connection, nothing reads it). The leave's state exchange with
// it is given up after leaveWait, and Run returns with no exchange still running. Before, the
// exchange went on after Run had returned, until memberlist's TCP timeout (2 s), after
// memberlist's shutdown.
func TestStopEndsExchangesToFrozenPeer(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault_injection=%v", fault), func(t *testing.T) {
			a := startReplica(t, "a", nil, func(c *Config) { c.FaultInjection = fault })
			b := startReplica(t, "b", []string{a.node.GossipAddr()}, func(c *Config) { c.FaultInjection = true })
			waitFor(t, 10*time.Second, "following each other", func() bool { return isFollowing(a, "b")() && isFollowing(b, "a")() })
			// b stops unheard (cut off), and its gossip port is taken by a listener that
			// accepts nothing: a still takes b for alive, and its connections to b's port open
			// and are never read.
			bGossip := b.node.GossipAddr()
			b.node.Isolate(true)
			b.stop()
			frozen, err := net.Listen("tcp", bGossip)
			if err != nil {
				t.Fatalf("taking b's gossip port: %v", err)
			}
			defer frozen.Close()
			if !slices.Equal(a.node.Status().Members, []string{"b"}) {
				t.Fatalf("a's members %v, want b still", a.node.Status().Members)
			}
			start := time.Now()
			a.stop()
			took := time.Since(start)
			all, hs := exchangesInFlight()
			t.Logf("a's Run returned after %v; state exchanges still in flight: %d (handState's: %d)", took.Round(time.Millisecond), all, hs)
			if all > 0 {
				t.Errorf("%d state exchanges (%d of them handState's) outlived Run", all, hs)
			}
			if took > leaveWait+500*time.Millisecond {
				t.Errorf("a's Run returned %v after its context ended, want within leaveWait (%v) and 0.5 s", took, leaveWait)
			}
		})
	}
}

// TestStopEndsJoinsInFlight: a replica stops while its join of an address that takes the
// connection and never answers is in flight; Run returns with the join ended. Before, the join
// went on after Run had returned, until memberlist's TCP timeout.
func TestStopEndsJoinsInFlight(t *testing.T) {
	frozen, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	a := startReplica(t, "a", []string{frozen.Addr().String()}, nil)
	waitFor(t, 5*time.Second, "a's join of the frozen address in flight", func() bool {
		all, _ := exchangesInFlight()
		return all > 0
	})
	start := time.Now()
	a.stop()
	took := time.Since(start)
	if all, _ := exchangesInFlight(); all > 0 {
		t.Errorf("%d state exchanges outlived Run", all)
	}
	if took > 500*time.Millisecond {
		t.Errorf("a's Run returned %v after its context ended, want within 0.5 s", took)
	}
}

// TestStreamTransportShutdown: the transport's Shutdown closes its outgoing streams (a read
// waiting on one ends at once) and refuses dials after it.
func TestStreamTransportShutdown(t *testing.T) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"},
		Logger: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	st := newStreamTransport(nt)
	frozen, err := net.Listen("tcp", "127.0.0.1:0") // takes connections, never reads them
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()
	var conns []net.Conn
	for range 2 {
		c, err := st.DialAddressTimeout(memberlist.Address{Addr: frozen.Addr().String()}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	_ = conns[1].Close() // closed before the shutdown: forgotten, not closed twice
	read := make(chan error, 1)
	go func() {
		_, err := conns[0].Read(make([]byte, 1))
		read <- err
	}()
	if err := st.Shutdown(); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case err := <-read:
		if err == nil {
			t.Error("the read of a stream closed by Shutdown returned no error")
		}
	case <-time.After(time.Second):
		t.Fatal("a read of an outgoing stream went on after Shutdown")
	}
	if c, err := st.DialTimeout(frozen.Addr().String(), 2*time.Second); err == nil {
		_ = c.Close()
		t.Error("a dial after Shutdown succeeded")
	}
	if len(st.open) != 0 {
		t.Errorf("%d streams still kept after Shutdown", len(st.open))
	}
}

// TestAdvertisedGossipPort: a replica given an advertise address and a gossip port of its own
// advertises that port. memberlist advertises its AdvertisePort (7946 by default) with an
// address given: a replica at another gossip port was placed at 7946 by its peers.
func TestAdvertisedGossipPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	if port == 7946 {
		t.Skip("the free port found is memberlist's default")
	}
	gossip := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	a := startReplica(t, "a", nil, func(c *Config) { c.Gossip, c.Advertise = gossip, "127.0.0.1" })
	if got := a.node.GossipAddr(); got != gossip {
		t.Fatalf("a advertises %s, want %s", got, gossip)
	}
	b := startReplica(t, "b", []string{gossip}, nil)
	waitFor(t, 10*time.Second, "b placing a at its gossip address", func() bool {
		addr := ""
		b.node.members.each("b", func(name string, m member) {
			if name == "a" {
				addr = m.gossip
			}
		})
		return addr == gossip
	})
}

// inboundHandlers counts the goroutines in memberlist's handler of an inbound stream.
func inboundHandlers() int {
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Count(string(buf), "memberlist.(*Memberlist).handleConn(")
}

// TestStopEndsInboundExchanges: a replica stops while a peer's state exchange with it is in
// flight and stalled (the peer sent the start of an encrypted push/pull and nothing more). Run
// returns promptly with memberlist's handler of it ended. Before, the handler went on after
// Run had returned, until memberlist's TCP timeout (2 s).
func TestStopEndsInboundExchanges(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault_injection=%v", fault), func(t *testing.T) {
			// Another test's, if any, end within memberlist's TCP timeout (2 s).
			waitFor(t, 3*time.Second, "no inbound stream handled before the test", func() bool { return inboundHandlers() == 0 })
			a := startReplica(t, "a", nil, func(c *Config) { c.FaultInjection = fault })
			stalled, err := net.DialTimeout("tcp", a.node.GossipAddr(), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer stalled.Close()
			// An encrypted message (type 10, memberlist's encryptMsg) of 256 bytes, 3 of them sent.
			if _, err := stalled.Write([]byte{10, 0, 0, 1, 0, 1, 2, 3}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "a handling the stalled stream", func() bool { return inboundHandlers() == 1 })
			start := time.Now()
			a.stop()
			took := time.Since(start)
			// The handler's last step, its connection closed, may still be returning.
			deadline := time.Now().Add(100 * time.Millisecond)
			for inboundHandlers() > 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			left := inboundHandlers()
			t.Logf("a's Run returned after %v; inbound handlers left: %d", took.Round(time.Millisecond), left)
			if left > 0 {
				t.Errorf("%d inbound stream handlers outlived Run", left)
			}
			if took > 500*time.Millisecond {
				t.Errorf("a's Run returned %v after its context ended, want within 0.5 s", took)
			}
			_ = stalled.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := io.ReadAll(stalled); err != nil {
				t.Errorf("the stalled peer's connection was not closed: %v", err)
			}
		})
	}
}
