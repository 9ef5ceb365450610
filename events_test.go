package popsub

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/wire"
)

// watch subscribes c to the x-ray feed, live only, and returns the
// snapshot that a new watcher gets first.
func watch(t *testing.T, c *client) wire.Event {
	t.Helper()
	c.subscribe(EventsTopic, map[string]any{"last": 0})
	e := nextEvent(t, c)
	if e.Kind != "snapshot" || e.State == nil {
		t.Fatalf("first event %+v, want a snapshot", e)
	}
	return e
}

// nextEvent reads the next x-ray event from c.
func nextEvent(t *testing.T, c *client) wire.Event {
	t.Helper()
	g := c.expect("message")
	var e wire.Event
	if err := json.Unmarshal(g.Payload, &e); err != nil {
		t.Fatalf("event %s: %v", g.Payload, err)
	}
	return e
}

// eventKey names an event for counting.
func eventKey(kind, topic, id, client string, attempt int) string {
	return fmt.Sprintf("%s|%s|%s|%s|%d", kind, topic, id, client, attempt)
}

// countEvents reads events from c into counts until one matches stop.
func countEvents(t *testing.T, c *client, counts map[string]int,
	stop func(wire.Event) bool) {
	t.Helper()
	for {
		e := nextEvent(t, c)
		counts[eventKey(e.Kind, e.Topic, e.MessageID, e.Client, e.Attempt)]++
		if stop(e) {
			return
		}
	}
}

func TestEvents_EachTransitionEmitsExactlyOneEvent(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 250 * time.Millisecond,
		MaxRetries: 1, MaxInflight: 1, MaxMessages: 1})
	watcher := ts.dialWith("xray", Claims{Subscribe: []string{"$sys/#"}})
	watch(t, watcher)
	counts := map[string]int{}
	is := func(kind, id string) func(wire.Event) bool {
		return func(e wire.Event) bool { return e.Kind == kind && e.MessageID == id }
	}

	alice := dialRaw(t, ts.url, "alice")
	alice.send(map[string]any{"type": "auth", "token": token(t, "alice"),
		"client": "alice"})
	alice.expect("authenticated")
	alice.subscribe("jobs", nil)
	bob := ts.dial("bob")

	// j1 is delivered and acked.
	bob.publish("jobs", 1, 1, "j1")
	alice.ack(alice.expect("message"))
	countEvents(t, watcher, counts, is("acked", "j1"))

	// j2 is never acked: one retry, then the dead-letter queue.
	bob.publish("jobs", 2, 1, "j2")
	alice.messages(2)
	countEvents(t, watcher, counts, is("dead_lettered", "j2"))

	// j3 fills alice's window of one; j4 finds it full and waits in the
	// log, which keeps one message: j6 leaves her without j4 and j5,
	// long before j3's retries are over and she has room. She is told
	// what she missed, and gets j6.
	bob.publish("jobs", 3, 1, "j3")
	alice.expect("message")
	bob.publish("jobs", 4, 1, "j4")
	bob.publish("jobs", 5, 1, "j5")
	bob.publish("jobs", 6, 1, "j6")
	// j3's retry comes when its ack is due; then, once j3 is dead and
	// alice has room, what the log still has. j4 is in it or not,
	// depending on when the replay read it: either way each of j4 to j6
	// comes once, delivered or said to be skipped.
	for retried, next := false, uint64(4); next <= 6; {
		switch g := alice.next(); {
		case g.Type == "message" && g.MessageID == "j3" && g.Attempt == 2:
			retried = true
		case !retried:
			t.Fatalf("alice got %+v before j3's retry", g)
		case g.Type == "message" && g.Seq == next:
			alice.ack(g)
			next++
		case g.Type == "skipped" && g.Seq >= next && g.Seq < 6 &&
			g.Missed == g.Seq-next+1:
			next = g.Seq + 1
		default:
			t.Fatalf("alice got %+v, want seq %d or a skip from it", g, next)
		}
	}
	// j3's dead letter is said once it is on disk, which may be after
	// alice has her room and what came after: wait for it.
	countEvents(t, watcher, counts, is("dead_lettered", "j3"))
	alice.ws.Close(websocket.StatusNormalClosure, "")
	countEvents(t, watcher, counts, func(e wire.Event) bool {
		return e.Kind == "disconnected" && e.Client == "alice"
	})

	for _, want := range []string{
		eventKey("connected", "", "", "alice", 0),
		eventKey("subscribed", "jobs", "", "alice", 0),
		eventKey("published", "jobs", "j1", "", 0),
		eventKey("delivered", "jobs", "j1", "alice", 1),
		eventKey("acked", "jobs", "j1", "alice", 1),
		eventKey("published", "jobs", "j2", "", 0),
		eventKey("delivered", "jobs", "j2", "alice", 1),
		eventKey("redelivered", "jobs", "j2", "alice", 2),
		eventKey("dead_lettered", "jobs", "j2", "alice", 2),
		eventKey("delivered", "jobs", "j3", "alice", 1),
		eventKey("published", "jobs", "j4", "", 0),
		eventKey("published", "jobs", "j5", "", 0),
		eventKey("published", "jobs", "j6", "", 0),
		eventKey("redelivered", "jobs", "j3", "alice", 2),
		eventKey("dead_lettered", "jobs", "j3", "alice", 2),
		eventKey("delivered", "jobs", "j6", "alice", 1),
		eventKey("unsubscribed", "jobs", "", "alice", 0),
		eventKey("disconnected", "", "", "alice", 0),
	} {
		if counts[want] != 1 {
			t.Errorf("event %q seen %d times, want once", want, counts[want])
		}
	}
	if n := counts[eventKey("delivered", "jobs", "j5", "alice", 1)]; n != 0 {
		t.Errorf("j5 was never delivered, but %d events say so", n)
	}
}

func TestEvents_NeedAGrant(t *testing.T) {
	ts := startBroker(t, Options{})
	c := ts.dial("curious")
	c.send(map[string]any{"type": "subscribe", "topic": EventsTopic})
	c.expectError("forbidden")
	c.send(map[string]any{"type": "subscribe", "topic": "#"})
	c.expect("subscribed")
	ts.dial("p").publish("anything", 1, 1, "")
	if g := c.expect("message"); g.Topic != "anything" {
		t.Fatalf("# delivered %q, want only ordinary topics", g.Topic)
	}
	c.quiet()
}

func TestEvents_SnapshotShowsPendingDeliveries(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Hour})
	worker := ts.dial("worker")
	worker.subscribe("jobs", nil)
	ts.dial("p").publish("jobs", 1, 1, "j1")
	worker.expect("message")

	watcher := ts.dialWith("xray", Claims{Subscribe: []string{"$sys/#"}})
	state := watch(t, watcher).State
	if state.Topics["jobs"] != 1 || len(state.Pending) != 1 ||
		state.Pending[0].MessageID != "j1" ||
		state.Pending[0].Sub != "worker" {
		t.Fatalf("snapshot %+v, want jobs at 1 and j1 pending for worker",
			state)
	}
}
