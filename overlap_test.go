package popsub

import (
	"cmp"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// These tests hold popsub.go's Acknowledgements to protocol.md where
// subscriptions overlap: a connection that gets a message through two
// subscriptions (a wildcard beside an exact topic, a durable name or a
// group) owes one ack for it, and that ack moves every cursor either
// subscription holds back, across a restart.

// ackEach reads n deliveries on c and acks each by its message_id as it
// comes, then proves with a ping that every ack was handled.
func ackEach(c *client, n int) []got {
	c.t.Helper()
	list := make([]got, 0, n)
	for range n {
		g := c.expect("message")
		c.ack(g)
		list = append(list, g)
	}
	c.quiet()
	return list
}

func TestOverlap_AnAckMovesADurableCursorBesideAWildcard(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("q/#", nil)
	sub.subscribe("q/d", map[string]any{"durable": "d"})
	const n = 50
	for i := range n {
		pub.publish("q/d", i, 1, fmt.Sprint("m", i))
	}

	// Each message comes twice, once through each subscription; the
	// client acks both deliveries, the second ack finding nothing.
	if got := ackEach(sub, 2*n); len(got) != 2*n {
		t.Fatalf("got %d deliveries, want %d", len(got), 2*n)
	}
	if left := pendingIDs(ts.broker); len(left) != 0 {
		t.Fatalf("after the acks %d deliveries are pending, want none",
			len(left))
	}

	// Resumed alone, on another connection and after a restart, the
	// durable name gets only what came after.
	sub.ws.CloseNow()
	ts = ts.restart()
	again, pub := ts.dial("sub"), ts.dial("pub")
	again.subscribe("q/d", map[string]any{"durable": "d"})
	pub.publish("q/d", "after", 1, "after")
	if g := again.expect("message"); g.MessageID != "after" {
		t.Fatalf("resumed with %s (seq %d), want only after: the acks "+
			"beside the wildcard did not move the cursor", g.MessageID, g.Seq)
	}
}

func TestOverlap_AGroupBesideAWildcardRedoesNoAckedJobAfterARestart(
	t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	worker, pub := ts.dial("worker"), ts.dial("pub")
	worker.subscribe("jobs/#", nil)
	acking := join(worker, "jobs/a", "workers", true, nil)
	const n = 100
	for i := range n {
		pub.publish("jobs/a", i, 1, fmt.Sprint("j", i))
	}
	// The member's window is 32 jobs: without its acks counting, it
	// would stall there, short of the hundred.
	waitUntil(t, "every job twice, each acked", func() bool {
		return len(acking.deliveries()) == 2*n
	}, acking)
	waitFor(t, func() bool { return len(pendingIDs(ts.broker)) == 0 },
		"every ack handled")

	ts = ts.restart()
	pub = ts.dial("pub")
	pub.publish("jobs/a", "after", 1, "after")
	again := ts.dial("worker")
	again.subscribe("jobs/a", map[string]any{"group": "workers"})
	if g := again.expect("message"); g.MessageID != "after" {
		t.Fatalf("after the restart the group gave %s (seq %d), want "+
			"only after: an acked job was done again", g.MessageID, g.Seq)
	}
}

func TestOverlap_ARevokedMemberHandsOnItsJobsBesideAWildcard(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	leaves := ts.dialWith("leaves", Claims{Subscribe: []string{"jobs/#"}})
	leaves.subscribe("jobs/a", map[string]any{"group": "workers"})
	leaves.subscribe("jobs/#", nil)
	pub := ts.dial("pub")
	const n = 40
	for i := range n {
		pub.publish("jobs/a", i, 1, fmt.Sprint("j", i))
	}

	// The member takes its window of jobs, 32, and the wildcard a copy of
	// every one; it acks none. The member that stays joins for the rest.
	leaves.messages(DefaultGroupWindow + n)
	stays := join(ts.dial("stays"), "jobs/a", "workers", true, nil)
	waitUntil(t, "the jobs the first member had no room for", func() bool {
		return len(stays.deliveries()) == n-DefaultGroupWindow
	}, stays)

	// A refresh to fewer grants ends both of its subscriptions; its jobs
	// reach the member that stays, at once.
	fewer := Claims{Subscribe: []string{"mail"}}
	fewer.Subject, fewer.ExpiresAt = "leaves",
		jwtTime(time.Now().Add(time.Hour))
	token, err := fewer.Sign(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	leaves.send(map[string]any{"type": "auth", "token": token})
	waitUntil(t, "every job at the member that stays", func() bool {
		ids := map[string]bool{}
		for _, g := range stays.deliveries() {
			ids[g.MessageID] = true
		}
		return len(ids) == n
	}, stays)
}

// A wildcard subscription's reply comes before any message of it, as an
// exact topic's does, while publishes to the topics it covers race the
// subscribe: a client tells a subscription's messages from those of the
// one it replaced, or unsubscribed a moment ago, by that order.
func TestOverlap_AWildcardSaysSubscribedBeforeItsFirstMessage(t *testing.T) {
	ts := startBroker(t, Options{})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	publish := []byte(`{"type":"publish","topic":"w/x","qos":0,"payload":1}`)
	for range 200 {
		burst := make(chan error, 1)
		go func() {
			var err error
			for range 20 {
				err = cmp.Or(err, pub.ws.Write(context.Background(),
					websocket.MessageText, publish))
			}
			burst <- err
		}()
		sub.send(map[string]any{"type": "subscribe", "topic": "w/+"})
		sub.expect("subscribed")
		if err := <-burst; err != nil {
			t.Fatal(err)
		}
		// Whatever of the burst came through it, then the end of it.
		sub.send(map[string]any{"type": "unsubscribe", "topic": "w/+"})
		for sub.next().Type != "unsubscribed" {
		}
	}
}

// A burst larger than a topic's log keeps, published faster than a shared
// log feeds it back to the broker, leaves seqs the broker never had
// (A log shared by several brokers): on JetStream the stream deletes
// them before its consumer reads them. A connection with the topic and
// a wildcard over it must hear of every such seq through each
// subscription, and keep its connection: the wildcard, which has no
// log to read on from, is told in a skipped frame naming it as filter.
// On bbolt nothing is missed, and every seq comes through both. The
// same holds after a restart, on the seqs the log goes on with.
func TestOverlap_ABurstPastTheCapIsSaidToTheTopicAndTheWildcard(
	t *testing.T) {
	ts := startBroker(t, Options{MaxMessages: 5})
	burstPastTheCap(t, ts)
	ts = ts.restart()
	burstPastTheCap(t, ts)
}

// burstPastTheCap subscribes a connection to b/x and b/+, publishes a
// burst of QoS 0 messages to b/x from another, and a QoS 1 one last, and
// checks that every seq of the burst came through each subscription or
// was said to be gone through it.
func burstPastTheCap(t *testing.T, ts *testServer) {
	t.Helper()
	const burst = 400
	sub, pub := ts.dial("sub"), ts.dial("pub")
	head := sub.subscribe("b/x", map[string]any{"last": 0}).Seq
	sub.subscribe("b/+", nil)
	for i := range burst {
		pub.send(map[string]any{"type": "publish", "topic": "b/x",
			"payload": i})
	}
	pub.publish("b/x", "last", 1, fmt.Sprint("last", head))

	// Each seq comes twice, once through each subscription, unless a
	// skipped frame said it was gone: through the topic (no filter) or
	// through the wildcard (filter b/+).
	comes, told := map[uint64]int{}, map[uint64]int{}
	var said []string
	for ends := 0; ends < 2; {
		switch g := sub.next(); g.Type {
		case "message":
			comes[g.Seq]++
			if g.QoS == 1 {
				ends++
			}
		case "skipped":
			if g.Topic != "b/x" || g.Filter != "" && g.Filter != "b/+" {
				t.Fatalf("skipped %+v: want b/x, for b/x or b/+", g)
			}
			for seq := g.Seq - g.Missed + 1; seq <= g.Seq; seq++ {
				told[seq]++
			}
			said = append(said, fmt.Sprintf("%d-%d for %q",
				g.Seq-g.Missed+1, g.Seq, g.Filter))
		default:
			t.Fatalf("sub got %+v", g)
		}
	}
	for seq := head + 1; seq <= head+burst+1; seq++ {
		if comes[seq]+told[seq] != 2 {
			t.Fatalf("seq %d came %d times, and was said to be gone %d "+
				"times, want 2 in all (said gone: %v)", seq, comes[seq],
				told[seq], said)
		}
	}
	t.Logf("after seq %d, said gone: %v", head, said)
	sub.quiet()
}
