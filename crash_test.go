package popsub

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// This file crashes brokers in fake time: a broker runs on a disk whose
// commits take a millisecond, and is killed, as kill -9 would, at a
// chosen moment; the next broker starts on what the disk kept.

// disk is a memoryStore behind a disk whose commits take delay, and
// whose power can go: a commit still under way when it does never
// happened.
type disk struct {
	*memoryStore
	delay time.Duration // each commit's time, fake inside a bubble
	mu    sync.Mutex    // orders commits and the crash
	lost  bool          // the power went: every commit fails
}

// newDisk returns an empty disk whose commits take a millisecond.
func newDisk() *disk {
	return &disk{memoryStore: newMemoryStore(), delay: time.Millisecond}
}

// Commit takes the disk's time, then commits unless the power went
// meanwhile.
func (d *disk) Commit(batch *Batch) error {
	time.Sleep(d.delay)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lost {
		return errors.New("power lost")
	}
	return d.memoryStore.Commit(batch)
}

// crash cuts the power: commits under way are lost. It returns the disk
// as it was, for the next broker to start on.
func (d *disk) crash() *disk {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lost = true
	return &disk{memoryStore: d.memoryStore.Copy(), delay: d.delay}
}

// crash kills ps's broker, which runs on d, as kill -9 would: its
// clients' sockets are cut and what its disk had not committed is gone.
// It returns the disk as it was, for the next broker.
func (ps *pipeServer) crash(d *disk) *disk {
	kept := d.crash()
	ps.stop()
	return kept
}

// dialAs connects over a pipe and authenticates as sub.
func (ps *pipeServer) dialAs(sub string) *client {
	ps.t.Helper()
	c := ps.dial(sub)
	c.authenticate(tokenUntil(ps.t, sub, time.Now().Add(time.Hour)))
	return c
}

func TestBroker_ACrashBeforeANewTopicsFirstSyncReusesNoSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDisk()
		ps := startPipeBroker(t, Options{Store: d})
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		sub.subscribe("fresh", nil)
		pub.send(map[string]any{"type": "publish", "topic": "fresh",
			"payload": "first", "qos": 1, "message_id": "first"})
		seen := sub.expect("message")

		// Killed the moment the subscriber has it: its commit is still
		// under way, and the disk never learns of the topic's message.
		d = ps.crash(d)
		ps = startPipeBroker(t, Options{Store: d})
		defer ps.stop()
		sub, pub = ps.dialAs("sub"), ps.dialAs("pub")
		sub.subscribe("fresh", map[string]any{"after": seen.Seq})
		confirm := pub.publish("fresh", "second", 1, "second")
		if confirm.Seq <= seen.Seq {
			t.Fatalf("after the crash %q got seq %d; the subscriber saw "+
				"seq %d as %q", "second", confirm.Seq, seen.Seq,
				seen.MessageID)
		}
		if g := sub.expect("message"); g.MessageID != "second" {
			t.Fatalf("resumed after %d with %+v, want second", seen.Seq, g)
		}
	})
}

// A topic the TTL emptied is forgotten, and the broker killed around the
// forget: before it reached the disk, the topic comes back with its head;
// once a subscriber has the first message of the topic made again, the
// forget and the new topic's reservation are both on disk, in that
// order, and seqs go on past what it saw.
func TestBroker_ACrashAroundAForgetReusesNoSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDisk()
		ps := startPipeBroker(t, Options{Store: d})
		pub := ps.dialAs("pub")
		for i := range 3 {
			pub.publish("gone", i, 1, fmt.Sprint("m", i))
		}
		ps.broker.trimExpired(time.Now().Add(2 * time.Hour))
		d = ps.crash(d) // the forget still under way
		if heads, _ := d.Topics(); heads["gone"] < 3 {
			t.Fatalf("the disk kept heads %v, want gone's", heads)
		}
		ps = startPipeBroker(t, Options{Store: d})
		pub = ps.dialAs("pub")
		before := pub.publish("gone", "before", 1, "before")
		if before.Seq <= 3 {
			t.Fatalf("after the crash the next seq was %d, want past 3",
				before.Seq)
		}

		ps.broker.trimExpired(time.Now().Add(2 * time.Hour))
		sub := ps.dialAs("sub")
		sub.subscribe("gone", nil)
		pub.send(map[string]any{"type": "publish", "topic": "gone",
			"payload": "seen", "qos": 1, "message_id": "seen"})
		seen := sub.expect("message")
		if seen.Seq <= before.Seq {
			t.Fatalf("the topic made again gave seq %d, want past %d",
				seen.Seq, before.Seq)
		}
		crashAndGoOn(t, ps, d, "gone", seen.Seq).stop()
	})
}

// crashAndGoOn kills ps's broker, which runs on d, starts another on what
// d kept, and fails t unless topic's next seq there is past seen, the
// last one a subscriber saw. It returns the new server.
func crashAndGoOn(t *testing.T, ps *pipeServer, d *disk, topic string,
	seen uint64) *pipeServer {
	t.Helper()
	ps = startPipeBroker(t, Options{Store: ps.crash(d)})
	next := ps.dialAs("pub").publish(topic, "next", 1, "next")
	if next.Seq <= seen {
		t.Fatalf("after the crash %s went on at seq %d; a subscriber saw "+
			"seq %d", topic, next.Seq, seen)
	}
	return ps
}

func TestBroker_TwoCrashesBeforeASyncReuseNoSeq(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDisk()
		ps := startPipeBroker(t, Options{Store: d})
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		sub.subscribe("busy", nil)
		pub.publish("busy", "kept", 1, "kept")
		sub.expect("message")

		// Each round a message reaches the subscriber and the broker
		// dies before its commit; the next broker starts on the disk.
		seen := map[uint64]string{}
		var last uint64
		for round, id := range []string{"lost-1", "lost-2"} {
			pub.send(map[string]any{"type": "publish", "topic": "busy",
				"payload": id, "qos": 1, "message_id": id})
			g := sub.expect("message")
			seen[g.Seq], last = g.MessageID, g.Seq
			d = ps.crash(d)
			ps = startPipeBroker(t, Options{Store: d})
			if round == 0 {
				sub, pub = ps.dialAs("sub"), ps.dialAs("pub")
				sub.subscribe("busy", map[string]any{"after": last})
			}
		}
		defer ps.stop()
		sub, pub = ps.dialAs("sub"), ps.dialAs("pub")
		sub.subscribe("busy", map[string]any{"after": last})
		confirm := pub.publish("busy", "third", 1, "third")
		if id, ok := seen[confirm.Seq]; ok || confirm.Seq <= last {
			t.Fatalf("after two crashes %q got seq %d, which the "+
				"subscriber saw as %q (the last seq it saw: %d)", "third",
				confirm.Seq, id, last)
		}
		if g := sub.expect("message"); g.MessageID != "third" {
			t.Fatalf("resumed after %d with %+v, want third", last, g)
		}
	})
}

// A confirmed delayed message is on disk: killed before it is due, the
// broker starts again on what the disk kept (nothing it had not synced)
// and sends it when due, or at once if it fell due while the broker was
// down, where it takes its seq on its topic: the first past the reserve
// the crash left, as the topic is new.
func TestBroker_ADelayedMessageSurvivesACrash(t *testing.T) {
	for _, down := range []time.Duration{0, 7 * time.Second} {
		t.Run(fmt.Sprint("down ", down), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newDisk()
				ps := startPipeBroker(t, Options{Store: d})
				pub := ps.dialAs("pub")
				pub.send(map[string]any{"type": "publish", "topic": "jobs",
					"payload": "later", "qos": 1, "message_id": "later",
					"delay_ms": 5000})
				if g := pub.expect("published"); g.Topic != "$delayed/jobs" {
					t.Fatalf("confirmed on %s, want $delayed/jobs", g.Topic)
				}
				d = ps.crash(d)
				time.Sleep(down)

				ps = startPipeBroker(t, Options{Store: d})
				defer ps.stop()
				up := time.Now()
				sub := ps.dialAs("sub")
				sub.subscribe("jobs", map[string]any{"after": 0})
				// Within a sync, the one a topic's first seq after a
				// restart waits for, of its time or of the restart.
				g := sub.expect("message")
				from := time.UnixMilli(g.DeliverAt)
				if from.Before(up) {
					from = up
				}
				late := time.Since(from)
				if g.MessageID != "later" || g.Seq != reserveBlock+1 ||
					g.DeliverAt == 0 || late < 0 || late > 2*d.delay {
					t.Fatalf("got %+v %v after it was due and the broker up, "+
						"want later at seq %d, with its deliver_at, within a "+
						"sync", g, late, reserveBlock+1)
				}
			})
		})
	}
}

// QoS 0's crash window: a QoS 0 message nobody waits for lingers up to
// commitLinger for company before its sync. A crash within the window may
// lose it, as at most once allows; one after the window may not. The
// topic's first message is a confirmed one, so that the QoS 0 message
// is not carried to disk by the topic's reserved seqs, which are waited
// for.
func TestBroker_AQoS0MessageIsOnDiskOnceItsCrashWindowPasses(t *testing.T) {
	for _, c := range []struct {
		name  string
		crash time.Duration // after the QoS 0 publish
		kept  bool
	}{
		{"a crash within the window loses it", commitLinger / 2, false},
		// The disk takes a millisecond to commit.
		{"a crash after the window keeps it", commitLinger +
			2*time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := newDisk()
				ps := startPipeBroker(t, Options{Store: d})
				pub := ps.dialAs("pub")
				pub.publish("window", "confirmed", 1, "confirmed")
				pub.publish("window", "trickle", 0, "trickle")
				pub.quiet()
				time.Sleep(c.crash)
				synctest.Wait()
				d = ps.crash(d)

				// The first message after the confirmed one is the QoS
				// 0 one if the disk kept it, else the next publish.
				ps = startPipeBroker(t, Options{Store: d})
				defer ps.stop()
				sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
				sub.subscribe("window", map[string]any{"after": 1})
				pub.publish("window", "marker", 1, "marker")
				want := map[bool]string{true: "trickle", false: "marker"}
				if g := sub.expect("message"); g.MessageID != want[c.kept] {
					t.Fatalf("crashed %v after a QoS 0 publish, then "+
						"replayed %q (seq %d), want %q", c.crash,
						g.MessageID, g.Seq, want[c.kept])
				}
			})
		})
	}
}
