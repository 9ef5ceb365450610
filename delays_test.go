package popsub

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/popsub/popsub/internal/logbuf"
)

func TestDelay_DeliveredWhenDueWithTheSeqThen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, worker, wake := fakeBroker(t, Options{})
		publisher, publisherWake := fakeConnection(b, "publisher")
		defer b.unregister(publisher)

		// Confirmed once stored: in $delayed/jobs, where it waits.
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":"later","qos":1,"message_id":"later",` +
			`"delay_ms":3000}`))
		confirm := nextFrame(t, publisher, publisherWake)
		if confirm.Type != "published" || confirm.Topic != "$delayed/jobs" ||
			confirm.Seq != 1 {
			t.Fatalf("confirm %+v, want published on $delayed/jobs, seq 1",
				confirm)
		}
		due := time.Now().Add(3 * time.Second)

		// A message published meanwhile comes first, with seq 1: the
		// delayed one takes its seq when due, after it.
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":"now","message_id":"now"}`))
		if g := nextFrame(t, worker, wake); g.MessageID != "now" ||
			g.Seq != 1 {
			t.Fatalf("got %+v, want now at seq 1", g)
		}
		g := nextFrame(t, worker, wake)
		late := time.Since(due)
		if g.MessageID != "later" || g.Seq != 2 || g.Attempt != 1 ||
			late < 0 || late > 10*time.Millisecond {
			t.Fatalf("got %+v %v after it was due, want later at seq 2 "+
				"within 10 ms", g, late)
		}

		// Sent, it leaves $delayed/jobs, and is not sent again.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		b.delays.mu.Lock()
		waits := b.delays.logs[b.topic("$delayed/jobs")]
		b.delays.mu.Unlock()
		if waits.messages != 0 || waits.bytes != 0 {
			t.Fatalf("$delayed/jobs still has %+v waiting", waits)
		}
		if head := b.topic("jobs").headNow(); head != 2 {
			t.Fatalf("jobs head = %d, want 2: sent once", head)
		}
		worker.handle([]byte(`{"type":"ack","topic":"jobs","seq":2}`))
	})
}

// Killed (the disk keeping only what it had committed) while a chain
// of delayed messages falls due, the broker sends after its restart
// exactly what the disk still held in $delayed/jobs: a message whose
// send reached the disk left the $delayed log in the same commit, so it
// is never sent again, however far the topic's cap has moved and its
// dedup forgotten the id.
func TestDelay_AKillMidChainSendsNothingTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newDisk()
		opts := Options{Store: d, MaxMessages: 10}
		ps := startPipeBroker(t, opts)
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		sub.subscribe("jobs", nil)
		const n = 200
		for i := range n {
			pub.send(map[string]any{"type": "publish", "topic": "jobs",
				"payload": i, "qos": 1, "message_id": fmt.Sprint("m", i),
				"delay_ms": 1000 + 5*i})
		}
		for range n {
			pub.expect("published")
		}
		before := map[string]bool{}
		for range n / 2 {
			before[sub.expect("message").MessageID] = true
		}

		// Killed mid-chain: what the disk kept of $delayed/jobs is what
		// the next broker must send, no more.
		d = ps.crash(d)
		kept, _ := d.Read("$delayed/jobs", 0, n, 1<<30)
		waiting := map[string]bool{}
		for _, m := range kept {
			waiting[m.ID] = true
		}
		stored, _ := d.Read("jobs", 0, n, 1<<30)
		var after uint64
		if len(stored) > 0 {
			after = stored[len(stored)-1].Seq
		}
		opts.Store = d
		ps = startPipeBroker(t, opts)
		defer ps.stop()
		sub = ps.dialAs("sub")
		sub.subscribe("jobs", map[string]any{"after": after})
		for range len(waiting) {
			g := sub.expect("message")
			if !waiting[g.MessageID] {
				t.Fatalf("after the restart %s came again, which left "+
					"$delayed/jobs before the kill", g.MessageID)
			}
			delete(waiting, g.MessageID)
			before[g.MessageID] = true
		}
		time.Sleep(time.Second) // the last send's commit
		synctest.Wait()
		if len(before) != n {
			t.Fatalf("%d of %d messages came, want all", len(before), n)
		}
		if left, _ := d.Read("$delayed/jobs", 0, n, 1<<30); len(left) != 0 {
			t.Fatalf("$delayed/jobs holds %d records once all were sent",
				len(left))
		}
	})
}

// 3,000 delayed messages behind one due later, all sent, were all sent
// again after a restart once the topic's cap (1,000 by default) had
// forgotten their ids: the $delayed log was trimmed only up to the first
// message not sent yet. Here three times a cap of 100.
func TestDelay_ARestartSendsNothingAgainPastTheTopicsCap(t *testing.T) {
	const limit = 100
	ts := startBroker(t, Options{MaxMessages: limit})
	pub := ts.dial("pub")
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "later", "qos": 1, "message_id": "later",
		"delay_ms": (30 * time.Minute).Milliseconds()})
	pub.expect("published")
	const n = 3 * limit
	for i := range n {
		pub.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1, "message_id": fmt.Sprint("m", i),
			"delay_ms": 10})
	}
	for range n {
		pub.expect("published")
	}
	waitFor(t, func() bool {
		left, _ := ts.broker.store.Read("$delayed/jobs", 0, n, 1<<30)
		return len(left) == 1 && ts.broker.topic("jobs").headNow() == n
	}, "every delayed message due sent, and gone from $delayed/jobs")

	// Stopped as SIGTERM stops it, and started again: none is sent
	// again, though the topic forgot all but a hundred ids. The marker
	// is a delayed message too, sent after any that fell due before it.
	ts = ts.restart()
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("jobs", map[string]any{"after": n})
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "end", "qos": 1, "message_id": "end", "delay_ms": 10})
	pub.expect("published")
	if g := sub.expect("message"); g.MessageID != "end" {
		t.Fatalf("after the restart got %s (seq %d), want only end: a "+
			"delayed message was sent again", g.MessageID, g.Seq)
	}
}

func TestDelay_WhatWaitsIsBoundedForATopicAndAToken(t *testing.T) {
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{MaxDelayed: 3,
		MaxDelayedBytes: 2000}})
	alice, bob := ts.dial("alice"), ts.dial("bob")
	later := func(c *client, topic string, payload any, id string) {
		c.send(map[string]any{"type": "publish", "topic": topic,
			"payload": payload, "qos": 1, "message_id": id,
			"delay_ms": time.Hour.Milliseconds() / 2})
	}
	for i := range 3 {
		later(alice, "jobs", i, fmt.Sprint("a", i))
		alice.expect("published")
	}

	// The topic holds three: the fourth is refused, whoever sends it,
	// and names the limit.
	later(bob, "jobs", 3, "b3")
	g := bob.expectError("delayed_limit")
	if g.MessageID != "b3" || g.Topic != "jobs" ||
		!strings.Contains(g.Message, "max-delayed") {
		t.Fatalf("refusal %+v, want one naming b3, jobs and --max-delayed",
			g)
	}
	// A repeat of one waiting is answered as the repeat it is, at the
	// bound as below it: it takes no room.
	later(alice, "jobs", 1, "a1")
	if g := alice.expect("published"); !g.Duplicate || g.Seq != 2 {
		t.Fatalf("a1 again: %+v, want a duplicate of seq 2", g)
	}
	// The token holds three too, on any topic; another token does not.
	later(alice, "mail", 4, "a4")
	alice.expectError("delayed_limit")
	later(bob, "mail", 5, "b5")
	bob.expect("published")
	// Bytes: one message larger than what is left.
	later(bob, "mail", strings.Repeat("x", 1000), "b6")
	if g := bob.expectError("delayed_limit"); !strings.Contains(g.Message,
		"max-delayed-bytes") {
		t.Fatalf("refusal %+v, want one naming --max-delayed-bytes", g)
	}
	// A publish that is not delayed is never refused for it.
	alice.publish("jobs", "now", 1, "now")
}

// A burst of delayed publishes on one connection, none waiting for its
// confirm, is held to the bound as exactly as one publish at a time: on
// a shared log too, where each is counted only once the log has fed it
// back, long after the next was let in.
func TestDelay_ABurstIsBoundedAsOnePublishIs(t *testing.T) {
	const limit, burst = 10, 40
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{
		MaxDelayed: limit}})
	pub := ts.dial("pub")
	for i := range burst {
		pub.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1, "message_id": fmt.Sprint("b", i),
			"delay_ms": time.Hour.Milliseconds() / 2})
	}
	confirmed := 0
	for range burst {
		switch g := pub.next(); {
		case g.Type == "published":
			confirmed++
		case g.Code != "delayed_limit":
			t.Fatalf("got %+v, want published or delayed_limit", g)
		}
	}
	if confirmed != limit {
		t.Fatalf("%d of a burst of %d confirmed, want the bound, %d",
			confirmed, burst, limit)
	}
}

func TestDelay_AWaitThatEndsMakesRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps := startPipeBroker(t, Options{
			FeatureOptions: FeatureOptions{MaxDelayed: 1}})
		defer ps.stop()
		pub := ps.dialAs("pub")
		publish := func(id string) got {
			pub.send(map[string]any{"type": "publish", "topic": "jobs",
				"payload": 1, "qos": 1, "message_id": id, "delay_ms": 1000})
			return pub.next()
		}
		if g := publish("first"); g.Type != "published" {
			t.Fatalf("first: %+v", g)
		}
		if g := publish("second"); g.Code != "delayed_limit" {
			t.Fatalf("second, with the first waiting: %+v", g)
		}
		time.Sleep(2 * time.Second)
		if g := publish("third"); g.Type != "published" {
			t.Fatalf("third, once the first was sent: %+v", g)
		}
	})
}

// A deliver_at keeps its milliseconds, and the message comes within a
// few of them, not at the next second.
func TestDelay_ADeliverAtKeepsItsMilliseconds(t *testing.T) {
	ts := startBroker(t, Options{})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("jobs", nil)
	at := time.Now().Add(300 * time.Millisecond).UnixMilli()
	at += 7 - at%10 // ends in 7
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": 1, "qos": 1, "deliver_at": at})
	pub.expect("published")
	if g := sub.expect("message"); g.DeliverAt != at ||
		time.Now().UnixMilli() < at {
		t.Fatalf("got deliver_at %d at %d, want %d, and not before it",
			g.DeliverAt, time.Now().UnixMilli(), at)
	}
}

func TestDelay_RefusesWhatItCannotDo(t *testing.T) {
	ts := startBroker(t, Options{TTL: time.Hour})
	c := ts.dial("publisher")
	for _, f := range []map[string]any{
		{"delay_ms": -1},
		{"delay_ms": 2 * time.Hour.Milliseconds()},
		{"delay_ms": int64(1) << 62},
		{"delay_ms": 10, "deliver_at": 1},
		{"delay_ms": 10, "qos": 0},
	} {
		frame := map[string]any{"type": "publish", "topic": "jobs",
			"payload": 1, "qos": 1, "message_id": "m"}
		for k, v := range f {
			frame[k] = v
		}
		c.send(frame)
		if g := c.expectError("invalid_delay"); g.MessageID != "m" {
			t.Fatalf("%v: the error names %q, want m", f, g.MessageID)
		}
	}
	c.sendUndescribed(map[string]any{"type": "publish", "topic": "jobs",
		"payload": 1, "qos": 1, "delay_ms": "soon"})
	c.expectError("bad_frame")

	// A time already past is no delay.
	c.send(map[string]any{"type": "publish", "topic": "jobs", "payload": 1,
		"qos": 1, "deliver_at": 1})
	if g := c.expect("published"); g.Topic != "jobs" {
		t.Fatalf("deliver_at in the past: confirmed on %s, want jobs",
			g.Topic)
	}
}

// A $delayed log is the broker's own: a token granted one may read it,
// but a message put there by hand would wait with no due time, so a
// publish to one is refused, with a delay or without.
func TestDelay_OnlyTheBrokerPublishesToADelayedLog(t *testing.T) {
	ts := startBroker(t, Options{})
	c := ts.dialWith("admin", Claims{Publish: []string{"#", "$delayed/#"}})
	for _, delayed := range []bool{false, true} {
		f := map[string]any{"type": "publish", "topic": "$delayed/jobs",
			"payload": 1, "qos": 1, "message_id": "m"}
		if delayed {
			f["delay_ms"] = 100
		}
		c.send(f)
		if g := c.expectError("invalid_topic"); g.Topic != "$delayed/jobs" ||
			g.MessageID != "m" {
			t.Fatalf("%v: got %+v, want it to name the topic and m", f, g)
		}
	}
	c.send(map[string]any{"type": "publish", "topic": "jobs", "payload": 1,
		"qos": 1, "delay_ms": 100})
	if g := c.expect("published"); g.Topic != "$delayed/jobs" || g.Seq != 1 {
		t.Fatalf("got %+v, want the first message of $delayed/jobs", g)
	}
}

func TestDelay_ARefusalNamesTheFirstRuleItBreaks(t *testing.T) {
	// The rules are asked in turn: the token's grants, then the times,
	// then the bound on what waits; the publish rate comes last.
	ts := startBroker(t, Options{FeatureOptions: FeatureOptions{MaxDelayed: 1,
		PublishRate: 0.01}})
	c := ts.dialWith("sensor", Claims{Publish: []string{"sensors/#"}})
	publish := func(topic string, delay int) {
		c.send(map[string]any{"type": "publish", "topic": topic,
			"payload": 1, "qos": 1, "delay_ms": delay})
	}
	publish("jobs", -1)
	c.expectError("forbidden")
	publish("sensors/a", -1)
	c.expectError("invalid_delay")
	publish("sensors/a", 60000) // the bucket holds one publish, for 100 s
	c.expect("published")
	publish("sensors/a", 60000)
	c.expectError("delayed_limit")
	publish("sensors/b", 0)
	c.expectError("rate_limited")
}

func TestDelay_SentWhenDueWithItsTimeOnEitherEngine(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 500 * time.Millisecond})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("jobs", nil)
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "soon", "qos": 1, "message_id": "soon", "delay_ms": 300})
	if g := pub.expect("published"); g.Topic != "$delayed/jobs" {
		t.Fatalf("confirmed on %s, want $delayed/jobs", g.Topic)
	}
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "now", "qos": 1, "message_id": "now"})
	pub.expect("published")

	// The one published after it comes first, and takes seq 1.
	if g := sub.expect("message"); g.MessageID != "now" || g.Seq != 1 {
		t.Fatalf("got %+v, want now at seq 1", g)
	}
	g := sub.expect("message")
	if g.MessageID != "soon" || g.Seq != 2 || g.DeliverAt == 0 ||
		time.Now().UnixMilli() < g.DeliverAt {
		t.Fatalf("got %+v, want soon at seq 2, once its deliver_at passed",
			g)
	}
}

// refusingOnce is a memoryStore that refuses the first batch holding a
// message to topic, as a disk that is full a moment would.
type refusingOnce struct {
	*memoryStore
	topic   string
	refused atomic.Bool
}

// Commit refuses the first batch with a message to s.topic.
func (s *refusingOnce) Commit(batch *Batch) error {
	for _, m := range batch.Messages {
		if m.Topic == s.topic && s.refused.CompareAndSwap(false, true) {
			return errors.New("disk full")
		}
	}
	return s.memoryStore.Commit(batch)
}

// A delayed message whose send the log refuses is sent again a second
// later, alone in the schedule or not: the release loop wakes for it.
// Due the same millisecond beside it may be a record another broker sent
// first, gone from the log, which is forgotten.
func TestDelay_ASendTheLogRefusesIsTriedAgain(t *testing.T) {
	for _, ids := range [][]string{{"kept"}, {"gone", "kept"}} {
		t.Run(strings.Join(ids, " and "), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &refusingOnce{memoryStore: newMemoryStore(),
					topic: "jobs"}
				ps := startPipeBroker(t, Options{Store: store})
				defer ps.stop()
				pub := ps.dialAs("pub")
				at := time.Now().Add(time.Second).UnixMilli()
				for _, id := range ids {
					pub.send(map[string]any{"type": "publish",
						"topic": "jobs", "payload": 1, "qos": 1,
						"message_id": id, "deliver_at": at})
					pub.expect("published")
				}
				if ids[0] == "gone" { // at seq 1 of $delayed/jobs
					store.Commit(&Batch{Deletes: map[string][]uint64{
						DelayedPrefix + "jobs": {1}}})
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				msgs, _ := store.Read("jobs", 0, 10, 1<<20)
				if len(msgs) != 1 || msgs[0].ID != "kept" {
					t.Fatalf("jobs holds %d messages, want kept once, sent "+
						"again after the refusal", len(msgs))
				}
			})
		})
	}
}

// lookingAhead sets how far ahead, and how many at a time, the release
// loop reads the DueIndex, until the test ends.
func lookingAhead(t *testing.T, ahead time.Duration, most int) {
	oldAhead, oldMost := lookAhead, lookAheadMax
	lookAhead, lookAheadMax = ahead, most
	t.Cleanup(func() { lookAhead, lookAheadMax = oldAhead, oldMost })
}

// On a store with a DueIndex (the tests' store in memory keeps one as
// boltstore does), what waits past the horizon costs the broker no
// memory: the $delayed log's index and ids hold nothing once its
// records are on disk, and the release loop holds only what falls due
// within a second, eight at a time. Each of 200 messages, published out
// of due order, is still sent once, when due, in due order.
func TestDelay_OnlyWhatIsNearDueIsHeldInMemory(t *testing.T) {
	lookingAhead(t, time.Second, 8)
	synctest.Test(t, func(t *testing.T) {
		b, worker, _ := fakeBroker(t, Options{})
		publisher, _ := fakeConnection(b, "publisher")
		t.Cleanup(func() { b.unregister(publisher) })
		const n = 200 // due over 20 s, a tenth of a second apart
		for i := range n {
			publisher.handle(fmt.Appendf(nil, `{"type":"publish",`+
				`"topic":"jobs","qos":1,"payload":%d,"message_id":"m%d",`+
				`"delay_ms":%d}`, i, i, 100+(i*73%n)*100))
		}
		synctest.Wait()
		publisher.outbox.Take(nil)
		held := func() int {
			b.delays.mu.Lock()
			defer b.delays.mu.Unlock()
			return len(b.delays.held)
		}
		waiting := b.topic("$delayed/jobs")
		waiting.mu.Lock()
		indexed, ids := len(waiting.index.Live()), len(waiting.ids)
		waiting.mu.Unlock()
		b.delays.mu.Lock()
		counted := b.delays.logs[waiting]
		b.delays.mu.Unlock()
		if indexed != 0 || ids != 0 || held() > 10 || counted.messages != n {
			t.Fatalf("%d indexed, %d ids, %d held, %d counted; want 0, "+
				"0, at most the 10 due within a second, %d", indexed, ids,
				held(), counted.messages, n)
		}

		var last int64
		sent := map[string]bool{}
		sentWhenDueFor(t, 21*time.Second, worker, func(g got) {
			if sent[g.MessageID] || g.DeliverAt < last {
				t.Fatalf("%s (due %d) sent twice or out of due order, "+
					"after one due %d", g.MessageID, g.DeliverAt, last)
			}
			sent[g.MessageID], last = true, g.DeliverAt
			if h := held(); h > 10 {
				t.Fatalf("%d held in memory, want at most 10", h)
			}
			worker.handle(fmt.Appendf(nil, `{"type":"ack","topic":"jobs",`+
				`"seq":%d}`, g.Seq))
		})
		if len(sent) != n {
			t.Fatalf("%d sent, want %d", len(sent), n)
		}
	})
}

// What waits is kept through a restart, and a publisher's repeat of a
// waiting message, before the restart and after, is answered as a
// repeat, with the first copy's seq, taking no more room; each message
// is sent once. On bbolt, a DueIndex, none of it is in the $delayed
// log's index, and the release loop reads four at a time from disk.
// They fall due three seconds on, from the test's start: past the
// restart and the checks after it, on a loaded machine too (a second was
// too little for JetStream under -race beside two busy cores).
func TestDelay_WhatWaitsStaysOnDiskThroughARestart(t *testing.T) {
	lookingAhead(t, 100*time.Millisecond, 4)
	ts := startBroker(t, Options{})
	pub := ts.dial("pub")
	due := time.Now().Add(3 * time.Second).UnixMilli()
	publish := func(i int) got {
		pub.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1, "message_id": fmt.Sprint("m", i),
			"deliver_at": due + int64(i)})
		return pub.expect("published")
	}
	const n = 20
	seqs := map[int]uint64{}
	for i := range n {
		seqs[i] = publish(i).Seq
	}
	repeated := func(when string) {
		t.Helper()
		if g := publish(3); !g.Duplicate || g.Seq != seqs[3] {
			t.Fatalf("%s, m3 again: %+v, want a duplicate with seq %d",
				when, g, seqs[3])
		}
		waiting := ts.broker.topic("$delayed/jobs")
		ts.broker.delays.mu.Lock()
		counted := ts.broker.delays.logs[waiting]
		ts.broker.delays.mu.Unlock()
		waiting.mu.Lock()
		indexed := len(waiting.index.Live())
		waiting.mu.Unlock()
		wantIndexed := 0
		if ts.broker.delays.disk == nil { // a shared log: all in memory
			wantIndexed = n
		}
		if counted.messages != n || indexed != wantIndexed {
			t.Fatalf("%s: %d counted, %d indexed; want %d and %d", when,
				counted.messages, indexed, n, wantIndexed)
		}
	}
	repeated("before the restart")

	ts = ts.restart()
	pub = ts.dial("pub")
	repeated("after the restart")
	// From the log's start: one sent before this subscribes is replayed.
	sub := ts.dial("sub")
	sub.subscribe("jobs", map[string]any{"after": 0})
	sent := map[string]bool{}
	for range n {
		g := sub.expect("message")
		if sent[g.MessageID] {
			t.Fatalf("%s sent twice", g.MessageID)
		}
		sent[g.MessageID] = true
		sub.send(map[string]any{"type": "ack", "topic": "jobs",
			"seq": g.Seq})
	}
	pub.send(map[string]any{"type": "publish", "topic": "jobs",
		"payload": "end", "qos": 1, "message_id": "end", "delay_ms": 10})
	pub.expect("published")
	if g := sub.expect("message"); g.MessageID != "end" {
		t.Fatalf("got %s after all %d, want end: one was sent twice",
			g.MessageID, n)
	}
	// Each leaves the DueIndex as it leaves its log: with the commit
	// that stores it in its topic, which its delivery does not wait for.
	if disk := ts.broker.delays.disk; disk != nil {
		waitFor(t, func() bool {
			left := 0
			disk.Due(math.MaxInt64, n, func(string, uint64, int64) { left++ })
			_, repeat, _ := disk.Waiting("$delayed/jobs", "pub", "m3")
			return left == 0 && !repeat
		}, "nothing left in the DueIndex once all were sent")
	}
}

// sentWhileRead is the tests' store in memory with a hook that runs in
// the middle of a DueIndex's Waiting, after the read, before it returns.
type sentWhileRead struct {
	*memoryStore
	during func()
}

// Waiting reads as the store does, then runs during, once.
func (s *sentWhileRead) Waiting(log, publisher, id string) (uint64, bool,
	error) {
	seq, ok, err := s.memoryStore.Waiting(log, publisher, id)
	if during := s.during; during != nil {
		s.during = nil
		during()
	}
	return seq, ok, err
}

// A repeat of a waiting delayed message whose read of the DueIndex finds
// it just as it is sent leaves no id behind in its $delayed log, which
// nothing would ever forget: the repeat is stored as a new message, and
// dropped when due as a repeat in its topic is. The message is delivered
// once.
func TestDelay_ARepeatReadAsItsFirstIsSentLeavesNoID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &sentWhileRead{memoryStore: newMemoryStore()}
		b, worker, wake := fakeBroker(t, Options{Store: store})
		publisher, publisherWake := fakeConnection(b, "publisher")
		defer b.unregister(publisher)
		publish := []byte(`{"type":"publish","topic":"jobs","payload":1,` +
			`"qos":1,"message_id":"m","delay_ms":1000}`)
		publisher.handle(publish)
		if g := nextFrame(t, publisher, publisherWake); g.Type != "published" {
			t.Fatalf("got %+v, want published", g)
		}
		synctest.Wait() // on disk: the log forgot its id

		// The repeat reads m on disk; before the read returns, m falls
		// due and is sent.
		store.during = func() {
			time.Sleep(time.Second)
			synctest.Wait()
		}
		publisher.handle(publish)
		if g := nextFrame(t, publisher, publisherWake); g.Type != "published" ||
			g.Duplicate {
			t.Fatalf("got %+v, want published, stored again", g)
		}
		g := nextFrame(t, worker, wake)
		if g.MessageID != "m" {
			t.Fatalf("got %+v, want m", g)
		}
		worker.handle(fmt.Appendf(nil,
			`{"type":"ack","topic":"jobs","seq":%d}`, g.Seq))
		time.Sleep(2 * time.Second) // the repeat falls due, and is dropped
		synctest.Wait()

		waiting := b.topic("$delayed/jobs")
		waiting.mu.Lock()
		ids := len(waiting.ids)
		waiting.mu.Unlock()
		b.delays.mu.Lock()
		counted := b.delays.logs[waiting]
		b.delays.mu.Unlock()
		if ids != 0 || counted.messages != 0 {
			t.Fatalf("$delayed/jobs remembers %d ids and counts %d waiting, "+
				"want none", ids, counted.messages)
		}
		worker.handle([]byte(`{"type":"ping"}`))
		if g := nextFrame(t, worker, wake); g.Type != "pong" {
			t.Fatalf("got %+v after m, want only a pong: m sent twice", g)
		}
	})
}

// Messages due at the same millisecond, none of whose sends fails, take
// their seqs in the order they were stored: an exact subscriber and a
// wildcard one beside it see them so, and so does a replay after a
// restart that came before they were due. One due later sits among them
// in the log: the release reads past it, and it waits.
func TestDelay_DueTogetherTheyGoInTheOrderStored(t *testing.T) {
	ts := startBroker(t, Options{})
	exact, wild, pub := ts.dial("exact"), ts.dial("wild"), ts.dial("pub")
	exact.subscribe("jobs/a", nil)
	wild.subscribe("jobs/#", nil)
	const n = 100
	// batch publishes n messages due together, from m<first> on, the
	// middle one due half an hour later, and returns the ids in order due.
	// A second ahead: one the broker got past its time would be sent at
	// once, before those stored earlier.
	batch := func(first int, due time.Time) []string {
		var ids []string
		for i := first; i < first+n; i++ {
			at, id := due, fmt.Sprint("m", i)
			if i == first+n/2 {
				at = due.Add(30 * time.Minute)
			} else {
				ids = append(ids, id)
			}
			pub.send(map[string]any{"type": "publish", "topic": "jobs/a",
				"payload": i, "qos": 1, "message_id": id,
				"deliver_at": at.UnixMilli()})
		}
		for range n {
			pub.expect("published")
		}
		return ids
	}
	inOrder := func(c *client, want []string) {
		t.Helper()
		for _, id := range want {
			if g := c.expect("message"); g.MessageID != id {
				t.Fatalf("%s got %s (seq %d), want %s: due together, they "+
					"go in the order stored", c.name, g.MessageID, g.Seq, id)
			}
		}
	}
	first := batch(0, time.Now().Add(time.Second))
	inOrder(exact, first)
	inOrder(wild, first)

	second := batch(n, time.Now().Add(time.Second))
	ts = ts.restart()
	sub := ts.dial("sub")
	sub.subscribe("jobs/a", map[string]any{"after": len(first)})
	inOrder(sub, second)
}

// readsOfOne is a memoryStore that counts the reads of one log, and
// fails the first fail of them.
type readsOfOne struct {
	*memoryStore
	log   string
	fail  int64
	reads atomic.Int64
}

// Read counts a read of s.log, and fails it if it is among the first
// s.fail.
func (s *readsOfOne) Read(log string, after uint64, limit,
	maxBytes int) ([]*Message, error) {
	if log == s.log && s.reads.Add(1) <= s.fail {
		return nil, errors.New("disk read error")
	}
	return s.memoryStore.Read(log, after, limit, maxBytes)
}

// A release reads the records it sends from their log a span of seqs at
// a time, not one by one: on a log shared through NATS each read is a
// round trip, and a release of 600 would wait for 600 of them. Each
// record is still sent once, in publish order, as records it reads
// beside them that are not due yet wait.
func TestDelay_AReleaseReadsItsRecordsASpanAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &readsOfOne{memoryStore: newMemoryStore(),
			log: DelayedPrefix + "jobs"}
		ps := startPipeBroker(t, Options{Store: store})
		defer ps.stop()
		pub := ps.dialAs("pub")
		now := time.Now()
		const n = 600
		for i := range n + 1 {
			at := now.Add(time.Second)
			if i == n/2 { // beside the others in the log, due later
				at = now.Add(time.Hour)
			}
			pub.send(map[string]any{"type": "publish", "topic": "jobs",
				"payload": i, "qos": 1, "message_id": fmt.Sprint("m", i),
				"deliver_at": at.UnixMilli()})
			pub.expect("published")
		}
		store.reads.Store(0)
		time.Sleep(2 * time.Second)
		synctest.Wait()

		if reads := store.reads.Load(); reads > n/readSpan+1 {
			t.Errorf("the release read %s %d times, want at most %d",
				store.log, reads, n/readSpan+1)
		}
		msgs, _ := store.Read("jobs", 0, 2*n, 1<<30)
		var want []string
		for i := range n + 1 {
			if i != n/2 {
				want = append(want, fmt.Sprint("m", i))
			}
		}
		var got []string
		for _, m := range msgs {
			got = append(got, m.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("jobs holds %d messages (%q…), want the %d due, "+
				"once each, in publish order", len(got), got[:min(3,
				len(got))], len(want))
		}
	})
}

// A record the store fails to read is not taken for gone: the failure
// is logged, and the message sent a second later.
func TestDelay_ARecordTheStoreFailedToReadIsSentASecondLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs logbuf.Buffer
		store := &readsOfOne{memoryStore: newMemoryStore(),
			log: DelayedPrefix + "jobs", fail: 1}
		ps := startPipeBroker(t, Options{Store: store,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		defer ps.stop()
		pub := ps.dialAs("pub")
		due := time.Now().Add(time.Second)
		pub.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": 1, "qos": 1, "message_id": "late",
			"deliver_at": due.UnixMilli()})
		pub.expect("published")
		store.reads.Store(0)

		time.Sleep(time.Until(due) + 100*time.Millisecond)
		synctest.Wait()
		if msgs, _ := store.Read("jobs", 0, 10, 1<<20); len(msgs) != 0 {
			t.Fatalf("jobs holds %d messages after the failed read, want 0",
				len(msgs))
		}
		if !strings.Contains(logs.String(), "read delayed messages due") {
			t.Errorf("the failed read was not logged; logs:\n%s", logs.String())
		}
		time.Sleep(time.Second)
		synctest.Wait()
		msgs, _ := store.Read("jobs", 0, 10, 1<<20)
		if len(msgs) != 1 || msgs[0].ID != "late" {
			t.Fatalf("jobs holds %d messages a second later, want late once",
				len(msgs))
		}
	})
}
