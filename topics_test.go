package popsub

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/popsub/popsub/wire"
)

// topicsNamed counts the topics b holds whose names start with prefix.
func topicsNamed(b *Broker, prefix string) int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	n := 0
	for name := range b.topics {
		if strings.HasPrefix(name, prefix) {
			n++
		}
	}
	return n
}

// unsubscribe unsubscribes c from topic and waits for the reply.
func (c *client) unsubscribe(topic string) {
	c.t.Helper()
	c.send(map[string]any{"type": "unsubscribe", "topic": topic})
	c.expect("unsubscribed")
}

// A topic nobody published to is forgotten when its last subscription
// ends, however it ends: unsubscribed, replaced, taken over by a durable
// name's next owner, or gone with its connection. Found from outside:
// 200,000 subscriptions to new names, each unsubscribed, held 112 to 140
// MB until a restart.
func TestTopics_OneNeverPublishedToIsForgottenWhenItsLastSubscriptionEnds(
	t *testing.T) {
	ts := startBroker(t, Options{})
	c := ts.dial("asker")
	for i := range 50 {
		name := fmt.Sprint("reply/", i)
		c.subscribe(name, nil)
		c.unsubscribe(name)
	}
	c.subscribe("reply/d", map[string]any{"durable": "d"})
	c.subscribe("reply/d", nil) // replaces the durable one
	other := ts.dial("asker")
	other.subscribe("reply/taken", map[string]any{"durable": "t"})
	c.subscribe("reply/taken", map[string]any{"durable": "t"}) // takes over
	c.unsubscribe("reply/d")
	c.unsubscribe("reply/taken")
	if n := topicsNamed(ts.broker, "reply/"); n != 0 {
		t.Fatalf("%d topics left after every subscription ended, want 0", n)
	}

	// Two subscriptions to one topic: it stays until the second ends.
	leaver := ts.dial("leaver")
	leaver.subscribe("reply/shared", nil)
	c.subscribe("reply/shared", nil)
	c.unsubscribe("reply/shared")
	if n := topicsNamed(ts.broker, "reply/"); n != 1 {
		t.Fatalf("%d topics while a subscriber stays, want 1", n)
	}
	leaver.ws.CloseNow()
	for end := time.Now().Add(10 * time.Second); topicsNamed(ts.broker,
		"reply/") > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the topic of a connection that left stayed 10 s")
		}
	}
}

// A topic that had a message stays, and its seqs go on through a
// restart; one forgotten begins again at seq 1, and a wildcard beside
// it, which holds no topic, hears it as before. A publisher that found
// the topic before it was forgotten publishes to the one that replaces
// it, never to the forgotten one.
func TestTopics_AForgottenTopicBeginsAgainAndOneWithAMessageGoesOn(
	t *testing.T) {
	ts := startBroker(t, Options{})
	watch := ts.dial("watch")
	watch.subscribe("reply/+", nil)
	c, p := ts.dial("c"), ts.dial("p")
	stale := ts.broker.topic("reply/x") // found before the forget
	c.subscribe("reply/x", nil)
	c.unsubscribe("reply/x")
	if n := topicsNamed(ts.broker, "reply/"); n != 0 {
		t.Fatalf("%d topics after the only subscription ended, want 0", n)
	}

	if g := p.publish("reply/x", 1, 1, "x-1"); g.Seq != 1 {
		t.Fatalf("the first publish got seq %d, want 1", g.Seq)
	}
	if m := watch.expect("message"); m.MessageID != "x-1" || m.Seq != 1 {
		t.Fatalf("the wildcard got %+v, want x-1 at seq 1", m)
	}
	stale.mu.Lock()
	gone, head := stale.gone, stale.head
	stale.mu.Unlock()
	if !gone || head != 0 {
		t.Fatalf("the forgotten topic: gone %v, head %d; want gone, 0",
			gone, head)
	}
	c.subscribe("reply/x", map[string]any{"after": 0})
	if m := c.expect("message"); m.MessageID != "x-1" {
		t.Fatalf("replay after 0 got %+v, want x-1", m)
	}
	c.unsubscribe("reply/x")
	if n := topicsNamed(ts.broker, "reply/"); n != 1 {
		t.Fatalf("%d topics, want the one with a message kept", n)
	}

	ts = ts.restart()
	p = ts.dial("p")
	if g := p.publish("reply/x", 2, 1, "x-2"); g.Seq != 2 {
		t.Fatalf("after a restart the next publish got seq %d, want 2",
			g.Seq)
	}
	reader := ts.dial("reader")
	reader.subscribe("reply/x", map[string]any{"after": 0})
	for i, m := range reader.messages(2) {
		if m.Seq != uint64(i+1) || m.MessageID != fmt.Sprint("x-", i+1) {
			t.Fatalf("replay %d: %+v, want x-%d at seq %d", i, m, i+1, i+1)
		}
	}
}

// A topic whose log the TTL emptied is forgotten once nothing holds it,
// in memory and in the store, and its seqs go on past the floor, the
// highest head forgotten, also after a restart. A subscriber that
// resumes with all the topic had hears nothing of a loss; one that had
// less hears recovered:false, as the broker no longer knows what it
// missed. A topic a subscriber holds stays. Found from outside: 50,000
// names a wave, each published to once, grew the heap from 214 to 738
// MB over four waves of the TTL, and the file with it.
func TestTopics_AnEmptiedTopicIsForgottenAndItsSeqsGoOnPastTheFloor(
	t *testing.T) {
	ts := startBroker(t, Options{})
	p, holder := ts.dial("p"), ts.dial("holder")
	for i := range 3 {
		p.publish("gone/a", i, 1, fmt.Sprint("a-", i+1))
	}
	p.publish("gone/b", 0, 1, "b-1")
	holder.subscribe("kept/c", nil)
	p.publish("kept/c", 0, 1, "c-1")
	holder.expect("message")

	ts.broker.trimExpired(time.Now().Add(2 * time.Hour))
	if n := topicsNamed(ts.broker, "gone/"); n != 0 {
		t.Fatalf("%d emptied topics kept, want none", n)
	}
	if n := topicsNamed(ts.broker, "kept/"); n != 1 {
		t.Fatalf("%d held topics kept, want 1", n)
	}
	<-ts.broker.log.Barrier().Done()
	heads, err := ts.broker.store.Topics()
	if _, ok := heads["gone/a"]; ok || err != nil || heads["kept/c"] == 0 {
		t.Fatalf("the store's topics: %v, %v; want kept/c alone", heads, err)
	}

	if g := p.publish("gone/b", 1, 1, "b-2"); g.Seq != 4 {
		t.Fatalf("gone/b made again gave seq %d, want 4, past the floor 3",
			g.Seq)
	}
	r := ts.dial("r")
	if g := r.subscribe("gone/a", map[string]any{"after": 3}); g.Seq != 3 ||
		g.Recovered != nil {
		t.Fatalf("resumed after all it had: %+v, want head 3, no loss", g)
	}
	r.unsubscribe("gone/a")
	if g := r.subscribe("gone/a", map[string]any{"after": 1}); g.Recovered ==
		nil || *g.Recovered {
		t.Fatalf("resumed after less: %+v, want recovered:false", g)
	}
	r.unsubscribe("gone/a")

	ts = ts.restart()
	p = ts.dial("p")
	if g := p.publish("gone/new", 0, 1, "n-1"); g.Seq != 4 {
		t.Fatalf("a new topic after a restart gave seq %d, want 4", g.Seq)
	}
	if g := p.publish("gone/b", 2, 1, "b-3"); g.Seq != 5 {
		t.Fatalf("gone/b after a restart gave seq %d, want 5", g.Seq)
	}
	reader := ts.dial("reader")
	reader.subscribe("gone/b", map[string]any{"after": 0})
	for i, m := range reader.messages(2) {
		if m.Seq != uint64(i+4) || m.MessageID != fmt.Sprint("b-", i+2) {
			t.Fatalf("replay %d: %+v, want b-%d at seq %d", i, m, i+2, i+4)
		}
	}
}

// A topic a durable name or a group has a cursor on is never forgotten,
// also after a restart: its subscriber, back after the TTL emptied the
// log, resumes after all it had and hears of no loss.
func TestTopics_ATopicWithACursorIsNeverForgotten(t *testing.T) {
	ts := startBroker(t, Options{})
	p, d := ts.dial("p"), ts.dial("d")
	d.subscribe("cursor/d", map[string]any{"durable": "d"})
	d.subscribe("cursor/g", map[string]any{"group": "g"})
	p.publish("cursor/d", 1, 1, "d-1")
	p.publish("cursor/g", 1, 1, "g-1")
	p.publish("cursor/plain", 1, 1, "p-1")
	for range 2 {
		d.ack(d.expect("message"))
	}
	d.quiet()
	d.ws.CloseNow()

	for round := range 2 {
		ts.broker.trimExpired(time.Now().Add(2 * time.Hour))
		if n := topicsNamed(ts.broker, "cursor/"); n != 2 {
			t.Fatalf("round %d: %d topics kept, want the durable's and the "+
				"group's", round, n)
		}
		ts = ts.restart()
	}
	d = ts.dial("d")
	if g := d.subscribe("cursor/d", map[string]any{"durable": "d"}); g.Seq !=
		1 || g.Recovered != nil {
		t.Fatalf("the durable name resumed with %+v, want head 1, no loss", g)
	}
	if g := d.subscribe("cursor/g", map[string]any{"group": "g"}); g.Seq !=
		1 || g.Recovered != nil {
		t.Fatalf("the group resumed with %+v, want head 1, no loss", g)
	}
}

// A publisher waiting for a new topic's reservation holds the topic: the
// TTL's trim, run the moment the reservation is stored and before the
// publisher takes the topic again, forgets nothing. Forgotten there, the
// publish would have taken a seq in a topic nobody finds any more, and
// the topic made again would give the same seq to the next message.
func TestTopics_APublisherWaitingForItsSeqsHoldsItsTopic(t *testing.T) {
	var broker atomic.Pointer[Broker]
	var armed atomic.Bool
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{
		OnEvent: func(e wire.Event) {
			// A commit of no message: the new topic's reservation, stored.
			if e.Kind == "commit" && e.Messages == 0 && armed.Swap(false) {
				broker.Load().trimExpired(time.Now().Add(2 * time.Hour))
			}
		}}})
	broker.Store(ts.broker)
	p := ts.dial("p")
	armed.Store(true)
	first := p.publish("held", 1, 1, "first")
	if armed.Load() {
		t.Fatal("the reservation's commit was never seen")
	}
	second := p.publish("held", 2, 1, "second")
	if first.Seq != 1 || second.Seq != 2 {
		t.Fatalf("seqs %d and %d, want 1 and 2", first.Seq, second.Seq)
	}
	reader := ts.dial("reader")
	reader.subscribe("held", map[string]any{"after": 0})
	for i, m := range reader.messages(2) {
		if m.Seq != uint64(i+1) {
			t.Fatalf("replay %d: %+v, want seq %d", i, m, i+1)
		}
	}
}

// Publishes racing the TTL's forgets, to topics a wildcard covers, one
// of them held by an exact subscription beside it on the same
// connection: each topic's seqs only grow, forgotten or not, and the
// subscriber hears every confirmed message at its seq, once through the
// wildcard and once more through the exact topic.
func TestTopics_PublishesRacingTheTTLsForgetsGiveNoSeqTwice(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	sub, p := ts.dial("sub"), ts.dial("p")
	sub.subscribe("race/#", nil)
	sub.subscribe("race/0", nil)
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
				ts.broker.trimExpired(time.Now().Add(2 * time.Hour))
			}
		}
	}()
	const topics, rounds = 8, 40
	for round := range rounds {
		for i := range topics {
			p.send(map[string]any{"type": "publish", "qos": 1,
				"topic": fmt.Sprint("race/", i), "payload": round,
				"message_id": fmt.Sprint(i, "-", round)})
		}
	}
	last, seqOf, jumps := map[string]uint64{}, map[string]uint64{}, 0
	for range topics * rounds {
		g := p.expect("published")
		if g.Seq <= last[g.Topic] {
			t.Fatalf("%s confirmed at seq %d after seq %d", g.MessageID,
				g.Seq, last[g.Topic])
		}
		if last[g.Topic] != 0 && g.Seq > last[g.Topic]+1 {
			jumps++
		}
		last[g.Topic], seqOf[g.MessageID] = g.Seq, g.Seq
	}
	close(stop)
	<-stopped
	t.Logf("%d seqs past a floor, of %d", jumps, topics*rounds)

	heard := map[string]int{}
	for range topics*rounds + rounds {
		m := sub.expect("message")
		if m.Seq != seqOf[m.MessageID] {
			t.Fatalf("%s delivered at seq %d, confirmed at %d", m.MessageID,
				m.Seq, seqOf[m.MessageID])
		}
		heard[m.MessageID]++
	}
	for id := range seqOf {
		want := 1
		if strings.HasPrefix(id, "0-") {
			want = 2 // the wildcard's, and the exact topic's
		}
		if heard[id] != want {
			t.Fatalf("%s heard %d times, want %d", id, heard[id], want)
		}
	}
	ts.broker.trimExpired(time.Now().Add(2 * time.Hour))
	if n := topicsNamed(ts.broker, "race/"); n != 1 {
		t.Fatalf("%d topics kept once idle, want race/0 alone", n)
	}
}

// First publishes racing subscriptions that come and go on the same
// names, on two connections the broker serves side by side: every
// confirmed message is in its topic's log, at the seq its confirm gave,
// and no seq is given twice.
func TestTopics_FirstPublishesRacingForgetsLoseNothing(t *testing.T) {
	ts := startBroker(t, Options{})
	churn, p := ts.dial("churn"), ts.dial("p")
	const topics, rounds = 40, 12
	for round := range rounds {
		for i := range topics {
			name := fmt.Sprint("race/", i)
			churn.send(map[string]any{"type": "subscribe", "topic": name})
			if round == rounds/2 {
				p.send(map[string]any{"type": "publish", "topic": name,
					"payload": i, "qos": 1, "message_id": name})
			}
			churn.send(map[string]any{"type": "unsubscribe", "topic": name})
		}
	}
	// The churning subscriber hears a message when it is subscribed as
	// one lands.
	for replies := 0; replies < 2*topics*rounds; {
		switch f := churn.next(); f.Type {
		case "subscribed", "unsubscribed":
			replies++
		case "message":
		default:
			t.Fatalf("the churning subscriber got %+v", f)
		}
	}
	for range topics {
		if g := p.expect("published"); g.Seq != 1 {
			t.Fatalf("%s confirmed at seq %d, want 1", g.MessageID, g.Seq)
		}
	}
	reader := ts.dial("reader")
	for i := range topics {
		name := fmt.Sprint("race/", i)
		reader.subscribe(name, map[string]any{"after": 0})
		if m := reader.expect("message"); m.MessageID != name || m.Seq != 1 {
			t.Fatalf("%s replayed %+v, want its message at seq 1", name, m)
		}
		reader.unsubscribe(name)
	}
	if n := topicsNamed(ts.broker, "race/"); n != topics {
		t.Fatalf("%d topics kept, want the %d with a message", n, topics)
	}
}

// A publisher that looked its topic up just before the topic was
// forgotten looks it up again: a publish into the forgotten one would
// give out a seq the next topic of that name gives out again.
func TestTopics_LockTopicNeverReturnsAForgottenTopic(t *testing.T) {
	b, err := New(Options{Secret: testSecret, Store: newMemoryStore(),
		Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20000 {
			b.unpin(&subscription{topic: b.pinTopic("flap")})
		}
	}()
	for looked := 0; ; looked++ {
		select {
		case <-done:
			t.Logf("%d look-ups while the topic came and went", looked)
			return
		default:
		}
		tp := b.lockTopic("flap")
		gone := tp.gone
		tp.mu.Unlock()
		if gone {
			t.Fatal("lockTopic returned a forgotten topic")
		}
	}
}

// A connection holds at most MaxSubscriptions at once: past it a
// subscribe is refused, and makes no topic; one that replaces a
// subscription it holds passes, and an unsubscribe makes room. Found from
// outside: 200,000 subscriptions on one connection held 160 MB.
func TestTopics_AConnectionHoldsAtMostMaxSubscriptions(t *testing.T) {
	ts := startBroker(t, Options{
		FeatureOptions: FeatureOptions{MaxSubscriptions: 3}})
	c := ts.dial("many")
	c.subscribe("cap/a", nil)
	c.subscribe("cap/+", nil)
	c.subscribe("cap/b", map[string]any{"durable": "b"})
	c.send(map[string]any{"type": "subscribe", "topic": "cap/c"})
	if g := c.expectError("subscription_limit"); g.Topic != "cap/c" ||
		!strings.Contains(g.Message, "3 subscriptions") {
		t.Fatalf("a fourth subscribe got %+v, want subscription_limit "+
			"naming cap/c and the 3", g)
	}
	if n := topicsNamed(ts.broker, "cap/c"); n != 0 {
		t.Fatalf("the refused subscribe made %d topics, want none", n)
	}
	c.subscribe("cap/a", map[string]any{"last": 0}) // replaces, passes
	c.unsubscribe("cap/+")
	c.subscribe("cap/c", nil)
	p := ts.dial("p")
	p.publish("cap/c", 1, 1, "c-1")
	if m := c.expect("message"); m.MessageID != "c-1" {
		t.Fatalf("the subscription made after room was made got %+v", m)
	}
}

// The broker holds at most MaxTopics topics: past it a client's publish
// or subscribe to a name it does not hold is refused with topic_limit,
// naming the topic (and a publish's message_id), and stores nothing; one
// to a topic it holds, a wildcard, and a subscribe to a "$" name pass,
// but not a client's publish to one. A wildcard beside the exact
// subscriptions hears every publish that passed and none refused. A
// forget makes room. A restart with a lower cap loads every topic it
// held, which go on taking publishes, and refuses a new one. Found from
// outside: one connection publishing to new names, one a frame, grew the
// file by 1.6 GB in 10 s, and the clean stop of its 400,000 topics ran
// past the 20 s serve waits (docs/compare names --publish --keep).
func TestTopics_TheBrokerHoldsAtMostMaxTopics(t *testing.T) {
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{MaxTopics: 3}})
	w, s, p := ts.dial("w"), ts.dial("s"), ts.dial("p")
	w.subscribe("cap/#", nil)
	s.subscribe("cap/a", nil) // a topic with no message: its forget is free
	p.publish("cap/b", "b-1", 1, "b-1")
	p.publish("cap/c", "c-1", 1, "c-1")

	p.send(map[string]any{"type": "publish", "topic": "cap/d",
		"payload": 1, "qos": 1, "message_id": "d-1"})
	if g := p.expectError("topic_limit"); g.Topic != "cap/d" ||
		g.MessageID != "d-1" || !strings.Contains(g.Message, "3 topics") {
		t.Fatalf("a publish to a fourth topic got %+v, want topic_limit "+
			"naming cap/d, d-1 and the 3", g)
	}
	s.send(map[string]any{"type": "subscribe", "topic": "cap/e"})
	if g := s.expectError("topic_limit"); g.Topic != "cap/e" {
		t.Fatalf("a subscribe to a fourth topic got %+v", g)
	}
	if n := topicsNamed(ts.broker, "cap/"); n != 3 {
		t.Fatalf("the broker holds %d topics, want 3", n)
	}
	s.subscribe("elsewhere/+", nil) // a wildcard holds no topic
	// A "$" name: a subscribe waits for the broker's own, and passes; a
	// client's publish there, by a grant, is held to the cap.
	admin := ts.dialWith("admin", Claims{Publish: []string{"$mine/#"},
		Subscribe: []string{"$dead/#"}})
	admin.subscribe("$dead/cap/z", nil)
	admin.send(map[string]any{"type": "publish", "topic": "$mine/x",
		"payload": 1, "qos": 1, "message_id": "x-1"})
	if g := admin.expectError("topic_limit"); g.Topic != "$mine/x" {
		t.Fatalf("a client's publish to a new $ name got %+v", g)
	}
	admin.unsubscribe("$dead/cap/z") // it made a topic past the cap
	p.publish("cap/b", "b-2", 1, "b-2")

	// Room: the topic with no message is forgotten with its subscription.
	s.unsubscribe("cap/a")
	p.publish("cap/d", "d-2", 1, "d-2")
	var ids []string
	for _, m := range w.messages(4) {
		ids = append(ids, m.MessageID)
	}
	if got := strings.Join(ids, " "); got != "b-1 c-1 b-2 d-2" {
		t.Fatalf("the wildcard heard %s, want b-1 c-1 b-2 d-2", got)
	}
	w.quiet()

	// Past the cap at a restart: the held topics load and take publishes.
	ts.opts.MaxTopics = 2
	ts = ts.restart()
	p = ts.dial("p")
	for _, name := range []string{"cap/b", "cap/c", "cap/d"} {
		p.publish(name, 3, 1, name+"-3")
	}
	p.send(map[string]any{"type": "publish", "topic": "cap/f",
		"payload": 1, "qos": 1, "message_id": "f-1"})
	if g := p.expectError("topic_limit"); g.Topic != "cap/f" ||
		!strings.Contains(g.Message, "2 topics") {
		t.Fatalf("a new topic after a restart past the cap got %+v", g)
	}
	s = ts.dial("s")
	if g := s.subscribe("cap/b", map[string]any{"after": 0}); g.Seq != 3 {
		t.Fatalf("cap/b's head after the restart is %d, want 3", g.Seq)
	}
	if ms := s.messages(3); ms[0].MessageID != "b-1" ||
		ms[2].MessageID != "cap/b-3" {
		t.Fatalf("cap/b replayed %+v", ms)
	}
}

// A $delayed log whose messages were all sent is forgotten as any
// emptied topic is, also when a restart loads it; one with a message
// waiting stays, though its index is empty on a DueIndex. Found by the
// simulation with a cap on topics: each name that once had a delayed
// message held its place under MaxTopics for good, and once they filled
// it no client could make a topic again, through restarts too.
func TestTopics_AnEmptiedDelayedLogIsForgotten(t *testing.T) {
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{MaxTopics: 2}})
	s, p := ts.dial("s"), ts.dial("p")
	s.subscribe("later/#", nil) // a wildcard holds no topic
	p.send(map[string]any{"type": "publish", "topic": "later/a",
		"payload": 1, "qos": 1, "message_id": "a-1", "delay_ms": 10})
	p.expect("published")
	p.send(map[string]any{"type": "publish", "topic": "later/b",
		"payload": 1, "qos": 1, "message_id": "b-1",
		"delay_ms": (30 * time.Minute).Milliseconds()})
	p.expect("published")
	if m := s.expect("message"); m.MessageID != "a-1" {
		t.Fatalf("the wildcard got %+v, want a-1 when due", m)
	}
	waitFor(t, func() bool {
		ts.broker.delays.mu.Lock()
		defer ts.broker.delays.mu.Unlock()
		return len(ts.broker.delays.logs) == 1
	}, "a-1 sent, its record gone")

	// Loaded by a restart, emptied by the sending, and then forgotten
	// with the topic a-1 went to, which the TTL empties.
	ts = ts.restart()
	ts.broker.trimExpired(time.Now().Add(2 * time.Hour))
	if n := topicsNamed(ts.broker, "$delayed/"); n != 1 {
		t.Fatalf("%d $delayed logs kept, want later/b's, which waits", n)
	}
	if n := topicsNamed(ts.broker, "later/"); n != 0 {
		t.Fatalf("%d later/ topics kept, want none", n)
	}
	p = ts.dial("p")
	if g := p.publish("other/x", 1, 1, "x-1"); g.Seq == 0 {
		t.Fatalf("a new name after the forgets got %+v", g)
	}
	ts = ts.restart()
	if n := topicsNamed(ts.broker, "$delayed/"); n != 1 {
		t.Fatalf("after a restart %d $delayed logs, want later/b's", n)
	}
}
