package popsub

import (
	"testing"
	"testing/synctest"
	"time"
)

// A topic with no head on disk borrows its first seqs on the store's
// reserve, which is on disk already: its first message is delivered, to
// an exact subscription and to a wildcard beside it, before any sync of
// its own, and a crash then reuses no seq, as the topic made again
// starts past the reserve.
func TestBroker_ANewTopicIsLentSeqsOnTheReserveAndACrashReusesNone(
	t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A sync takes two seconds: what is delivered before one waited for
		// none.
		d := &disk{memoryStore: newMemoryStore(), delay: 2 * time.Second}
		ps := startPipeBroker(t, Options{Store: d})
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		// The first new topic waits for its block, and the reserve
		// beside it.
		pub.publish("first", "first", 1, "first")

		wild := ps.dialAs("wild")
		sub.subscribe("fresh", nil)
		wild.subscribe("+", nil)
		pub.send(map[string]any{"type": "publish", "topic": "fresh",
			"payload": "lent", "qos": 0})
		seen, beside := sub.expect("message"), wild.expect("message")
		if heads, _ := d.Topics(); heads["fresh"] != 0 {
			t.Fatalf("fresh's head %d was on disk before its first "+
				"delivery, want none: the reserve covers it",
				heads["fresh"])
		}
		if beside.Topic != "fresh" || beside.Seq != seen.Seq {
			t.Fatalf("the wildcard got %s seq %d, the exact subscription "+
				"fresh seq %d", beside.Topic, beside.Seq, seen.Seq)
		}

		// Killed, then started and stopped cleanly, then started again:
		// the clean stop keeps what the crashed start lent reserved.
		d = ps.crash(d)
		ps = startPipeBroker(t, Options{Store: d})
		ps.stop()
		d = &disk{memoryStore: d.memoryStore.Copy(), delay: d.delay}
		ps = startPipeBroker(t, Options{Store: d})
		defer ps.stop()
		pub = ps.dialAs("pub")
		next := pub.publish("fresh", "next", 1, "next")
		if next.Seq <= seen.Seq {
			t.Fatalf("after a crash and a clean restart fresh went on at "+
				"seq %d; a subscriber saw seq %d", next.Seq, seen.Seq)
		}
	})
}

// A name whose head is on disk at 0 (stored by a clean stop before the
// topic gave a seq) is lent nothing: after a crash it would start at
// that head, and seq 1 would name two messages.
func TestBroker_ANameWithAHeadOnDiskIsLentNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &disk{memoryStore: newMemoryStore(), delay: 2 * time.Second}
		err := d.memoryStore.Commit(&Batch{
			Heads: map[string]uint64{"zero": 0}})
		if err != nil {
			t.Fatal(err)
		}
		ps := startPipeBroker(t, Options{Store: d})
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		pub.publish("first", "first", 1, "first") // the reserve on disk

		sub.subscribe("zero", nil)
		pub.send(map[string]any{"type": "publish", "topic": "zero",
			"payload": "seen", "qos": 0})
		seen := sub.expect("message")
		if heads, _ := d.Topics(); heads["zero"] < seen.Seq {
			t.Fatalf("zero delivered seq %d with its head %d on disk",
				seen.Seq, heads["zero"])
		}
		crashAndGoOn(t, ps, d, "zero", seen.Seq).stop()
	})
}

// A clean stop gives the reserve back, with the seqs each topic was
// lent: the next start's new topics begin at seq 1, and a topic that
// was lent seqs goes on after its last.
func TestBroker_ACleanStopGivesTheReserveBack(t *testing.T) {
	path := t.TempDir() + "/popsub.db"
	ts := startBroker(t, Options{Store: openBolt(t, path)})
	pub := ts.dial("pub")
	pub.publish("first", "first", 1, "first")
	sub := ts.dial("sub")
	sub.subscribe("lent", nil)
	for i := range 3 {
		pub.send(map[string]any{"type": "publish", "topic": "lent",
			"payload": i, "qos": 0})
	}
	wantSeqs(t, sub.messages(3), span(1, 3))
	ts.stop()

	again := startBroker(t, Options{Store: openBolt(t, path)})
	pub = again.dial("pub")
	if g := pub.publish("new", "new", 1, "new"); g.Seq != 1 {
		t.Errorf("a new topic after a clean stop began at seq %d, want 1",
			g.Seq)
	}
	if g := pub.publish("lent", "next", 1, "next"); g.Seq != 4 {
		t.Errorf("lent went on at seq %d after a clean stop, want 4",
			g.Seq)
	}
}
