package popsub

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/popsub/popsub/wire"
)

// fakeBroker starts a broker on a memory store for a fake-time test,
// with a subscriber to jobs on a fake connection, and returns both and
// the subscriber's wake.
func fakeBroker(t *testing.T, opts Options) (*Broker, *connection,
	chan struct{}) {
	t.Helper()
	opts.Secret, opts.Logger = testSecret, quietLogger
	if opts.Store == nil {
		opts.Store = newMemoryStore()
	}
	opts.PingInterval = time.Hour // a fake connection has no socket to ping
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	worker, wake := fakeConnection(b, "worker")
	worker.handle([]byte(`{"type":"subscribe","topic":"jobs"}`))
	nextFrame(t, worker, wake)
	synctest.Wait()
	t.Cleanup(func() {
		b.unregister(worker)
		b.Shutdown(context.Background())
	})
	return b, worker, wake
}

// within fails the test unless g is attempt, and came between least and
// most after since.
func within(t *testing.T, g got, attempt int, since time.Time,
	least, most time.Duration) {
	t.Helper()
	gap := time.Since(since)
	if g.Type != "message" || g.Attempt != attempt || gap < least ||
		gap > most {
		t.Fatalf("got %s attempt %d %v later, want attempt %d %v to %v "+
			"later", g.Type, g.Attempt, gap, attempt, least, most)
	}
}

func TestNak_RetriesAfterItsDelayOrTheBackoffAndCountsAnAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A five-second ack timeout, and the connection's retry timer set
		// for each deadline: a retry comes within RetryWindow of it.
		b, worker, wake := fakeBroker(t, Options{MaxRetries: 2})
		b.publish(&Message{Topic: "jobs", ID: "j", QoS: 1,
			Payload: json.RawMessage(`1`)}, nil, nil)
		nextFrame(t, worker, wake)

		// A nak with a delay: the retry comes after it, well before the
		// ack timeout would have sent it.
		time.Sleep(time.Second)
		worker.handle([]byte(`{"type":"nak","message_id":"j","delay_ms":500}`))
		naked := time.Now()
		within(t, nextFrame(t, worker, wake), 2, naked, 500*time.Millisecond,
			500*time.Millisecond+RetryWindow)

		// A nak without one waits the backoff for the attempt it names:
		// ten seconds at attempt 2, less up to a fifth. Never zero.
		worker.handle([]byte(`{"type":"nak","topic":"jobs","seq":1}`))
		naked = time.Now()
		within(t, nextFrame(t, worker, wake), 3, naked, 8*time.Second,
			10*time.Second+RetryWindow)

		// Each nak's retry was an attempt: past the last of them (two
		// retries) the next nak's retry is a dead letter instead.
		worker.handle([]byte(`{"type":"nak","message_id":"j","delay_ms":0}`))
		time.Sleep(time.Second)
		synctest.Wait()
		if head := b.topic("$dead/jobs").headNow(); head != 1 {
			t.Fatalf("$dead/jobs head = %d, want 1", head)
		}
		if n := pendingCount(b); n != 0 {
			t.Fatalf("pending = %d after the dead letter, want 0", n)
		}
	})
}

func TestNak_DeadSendsItToDeadLettersWithItsReason(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	worker := ts.dial("worker")
	operator := ts.dialWith("operator", Claims{Subscribe: []string{"$dead/#"}})
	publisher := ts.dial("publisher")
	worker.subscribe("jobs", nil)
	operator.subscribe("$dead/jobs", nil)
	confirm := publisher.publish("jobs", "poison", 1, "job-1")
	worker.expect("message")

	worker.send(map[string]any{"type": "nak", "message_id": "job-1",
		"dead": true, "reason": "cannot parse it"})
	dead := operator.expect("message")
	operator.ack(dead)
	var letter wire.DeadLetter
	if err := json.Unmarshal(dead.Payload, &letter); err != nil {
		t.Fatal(err)
	}
	if letter.Reason != "cannot parse it" || letter.Seq != confirm.Seq ||
		letter.Attempts != 1 || letter.Subscriber != "worker" {
		t.Fatalf("dead letter %+v, want the nak's reason, seq %d, "+
			"attempt 1, subscriber worker", letter, confirm.Seq)
	}

	// It is settled: a second nak, or one of a message never sent here,
	// is an error, and nobody owes anything once the operator's ack, on
	// a connection of its own, has been read.
	worker.send(map[string]any{"type": "nak", "message_id": "job-1"})
	worker.expectError("not_pending")
	worker.quiet()
	operator.quiet()
	if n := pendingCount(ts.broker); n != 0 {
		t.Fatalf("pending = %d, want 0", n)
	}

	// Without a reason, the dead letter says "rejected".
	publisher.publish("jobs", "again", 1, "job-2")
	worker.expect("message")
	worker.send(map[string]any{"type": "nak", "topic": "jobs",
		"seq": confirm.Seq + 1, "dead": true})
	dead = operator.expect("message")
	json.Unmarshal(dead.Payload, &letter)
	if letter.Reason != "rejected" || letter.MessageID != "job-2" {
		t.Fatalf("dead letter %+v, want job-2, rejected", letter)
	}
}

func TestNak_RefusesWhatItCannotDoAndChangesNothing(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	worker := ts.dial("worker")
	publisher := ts.dial("publisher")
	worker.subscribe("jobs", nil)
	publisher.publish("jobs", 1, 1, "job-1")
	publisher.publish("jobs", 2, 1, "job-2")
	worker.expect("message")
	worker.ack(worker.expect("message")) // job-2 is acked, job-1 is not

	for _, c := range []struct {
		frame map[string]any
		code  string
	}{
		{map[string]any{"type": "nak"}, "missing_field"},
		{map[string]any{"type": "nak", "seq": 1}, "missing_field"},
		{map[string]any{"type": "nak", "message_id": "job-1",
			"delay_ms": -1}, "invalid_delay"},
		{map[string]any{"type": "nak", "message_id": "job-1",
			"delay_ms": int64(1) << 50}, "invalid_delay"},
		{map[string]any{"type": "nak", "message_id": "job-1",
			"delay_ms": 10, "dead": true}, "invalid_delay"},
		{map[string]any{"type": "nak", "message_id": "job-2"}, "not_pending"},
		{map[string]any{"type": "nak", "message_id": "nobody's"},
			"not_pending"},
		{map[string]any{"type": "nak", "topic": "other",
			"message_id": "job-1"}, "not_pending"},
	} {
		worker.send(c.frame)
		worker.expectError(c.code)
	}
	// A reason over 256 bytes breaks the schema too: sent undescribed.
	worker.sendUndescribed(map[string]any{"type": "nak",
		"message_id": "job-1", "dead": true,
		"reason": strings.Repeat("x", 257)})
	worker.expectError("invalid_reason")
	// A delay that is not a whole number does not decode.
	for _, delay := range []any{"soon", 1.5, 1e30} {
		worker.sendUndescribed(map[string]any{"type": "nak",
			"message_id": "job-1", "delay_ms": delay})
		if g := worker.expectError("bad_frame"); !strings.Contains(
			g.Message, "delay_ms") {
			t.Fatalf("delay_ms %v: %q does not name the field", delay,
				g.Message)
		}
	}
	// None of them touched job-1, which an ack still settles.
	worker.quiet()
	if n := pendingCount(ts.broker); n != 1 {
		t.Fatalf("pending = %d after refused naks, want job-1's 1", n)
	}
	worker.send(map[string]any{"type": "ack", "message_id": "job-1"})
	worker.quiet()
	if n := pendingCount(ts.broker); n != 0 {
		t.Fatalf("pending = %d, want 0", n)
	}
}

func TestNak_InAGroupGoesToAnotherMember(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 500 * time.Millisecond})
	a, b := ts.dial("a"), ts.dial("b")
	publisher := ts.dial("publisher")
	a.subscribe("jobs", map[string]any{"group": "workers"})
	b.subscribe("jobs", map[string]any{"group": "workers"})
	publisher.publish("jobs", "job", 1, "job-1")

	// Whichever member got it hands it back; the other gets attempt 2.
	got, other := a, b
	g := waitForEither(t, a, b)
	if g.from == b {
		got, other = b, a
	}
	got.send(map[string]any{"type": "nak", "message_id": "job-1",
		"delay_ms": 0})
	if retry := other.expect("message"); retry.Attempt != 2 ||
		retry.MessageID != "job-1" {
		t.Fatalf("the other member got %+v, want job-1 attempt 2", retry)
	}
}

// fromClient is a frame and the client that read it.
type fromClient struct {
	got
	from *client
}

// waitForEither returns the first frame either client reads; the other's
// read is left running until it reads one, which the test then expects.
func waitForEither(t *testing.T, a, b *client) fromClient {
	t.Helper()
	// Each member's next frame is a delivery or a pong; asking both for
	// a pong after the publish's confirm tells which got the job.
	for _, c := range []*client{a, b} {
		c.send(map[string]any{"type": "ping"})
		if g := c.next(); g.Type == "message" {
			c.expect("pong")
			return fromClient{g, c}
		}
	}
	t.Fatal("neither member got the job")
	return fromClient{}
}

func TestExpiry_NotDeliveredReplayedOrRetriedOnceItRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, worker, wake := fakeBroker(t, Options{})
		operator, operatorWake := fakeConnection(b, "operator")
		operator.claims.Subscribe = []string{"$dead/#"}
		operator.handle([]byte(`{"type":"subscribe","topic":"$dead/jobs"}`))
		nextFrame(t, operator, operatorWake)
		publisher, _ := fakeConnection(b, "publisher")
		defer b.unregister(operator)
		defer b.unregister(publisher)

		// Within its three seconds it is delivered, saying when it ends.
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":1,"qos":1,"message_id":"brief","ttl_ms":3000}`))
		g := nextFrame(t, worker, wake)
		if want := time.Now().UnixMilli() + 3000; g.ExpiresAt != want {
			t.Fatalf("expires_at = %d, want %d", g.ExpiresAt, want)
		}

		// Unacked, its retry falls due at five seconds, after it ended:
		// it is not retried, and goes to $dead as expired, once.
		time.Sleep(6 * time.Second)
		synctest.Wait()
		dead := nextFrame(t, operator, operatorWake)
		var letter wire.DeadLetter
		json.Unmarshal(dead.Payload, &letter)
		if letter.MessageID != "brief" || letter.Reason != "expired" ||
			letter.Attempts != 1 {
			t.Fatalf("dead letter %+v, want brief, expired, attempt 1",
				letter)
		}
		operator.handle([]byte(`{"type":"ack","topic":"$dead/jobs","seq":1}`))
		if n := pendingCount(b); n != 0 {
			t.Fatalf("pending = %d, want 0", n)
		}

		// A subscriber that asks for the log from the start is not
		// given it, and gets what came after it.
		late, lateWake := fakeConnection(b, "late")
		defer b.unregister(late)
		late.handle([]byte(`{"type":"subscribe","topic":"jobs","after":0}`))
		nextFrame(t, late, lateWake) // subscribed
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":2,"message_id":"lasting"}`))
		if g := nextFrame(t, late, lateWake); g.MessageID != "lasting" {
			t.Fatalf("the late subscriber got %+v, want lasting", g)
		}
		if g := nextFrame(t, worker, wake); g.MessageID != "lasting" {
			t.Fatalf("the worker got %+v, want lasting, and no retry", g)
		}
	})
}

func TestExpiry_TravelsWithTheMessageAndRefusesATTLThatPassed(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	publisher := ts.dial("publisher")
	for _, ttl := range []any{0, -5, int64(1) << 50} {
		publisher.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": 1, "message_id": "m", "ttl_ms": ttl})
		if g := publisher.expectError("invalid_ttl"); g.MessageID != "m" {
			t.Fatalf("ttl_ms %v: the error names %q, want m", ttl,
				g.MessageID)
		}
	}
	publisher.sendUndescribed(map[string]any{"type": "publish",
		"topic": "jobs", "payload": 1, "ttl_ms": "soon"})
	publisher.expectError("bad_frame")

	// A subscriber that arrives later replays it from the log, with the
	// same end: expires_at is stored with it, on either engine.
	confirm := publisher.send
	confirm(map[string]any{"type": "publish", "topic": "jobs", "qos": 1,
		"payload": 1, "message_id": "hour", "ttl_ms": 3_600_000})
	published := publisher.expect("published")
	reader := ts.dial("reader")
	reader.subscribe("jobs", map[string]any{"after": 0})
	g := reader.expect("message")
	if g.MessageID != "hour" || g.Seq != published.Seq ||
		g.ExpiresAt < g.Timestamp+3_600_000-1000 ||
		g.ExpiresAt > g.Timestamp+3_600_000+1000 {
		t.Fatalf("replayed %+v, want hour with expires_at an hour after "+
			"its timestamp", g)
	}
}

func TestExpiry_SurvivesARestart(t *testing.T) {
	path := t.TempDir() + "/popsub.db"
	ts := startBroker(t, Options{Store: openBolt(t, path)})
	publisher := ts.dial("publisher")
	publisher.send(map[string]any{"type": "publish", "topic": "jobs",
		"qos": 1, "payload": 1, "ttl_ms": 3_600_000})
	publisher.expect("published")
	reader := ts.dial("reader")
	reader.subscribe("jobs", map[string]any{"after": 0})
	before := reader.expect("message")
	ts.stop()

	restarted := startBroker(t, Options{Store: openBolt(t, path)})
	reader = restarted.dial("reader")
	reader.subscribe("jobs", map[string]any{"after": 0})
	if after := reader.expect("message"); after.ExpiresAt == 0 ||
		after.ExpiresAt != before.ExpiresAt {
		t.Fatalf("after a restart expires_at = %d, want %d",
			after.ExpiresAt, before.ExpiresAt)
	}
}

func TestOptions_RefuseABackoffThatShrinks(t *testing.T) {
	_, err := New(Options{Secret: testSecret, Store: newMemoryStore(),
		FeatureOptions: FeatureOptions{RetryBackoff: 0.5},
	})
	if err == nil || !strings.Contains(err.Error(), "RetryBackoff") {
		t.Fatalf("New with RetryBackoff 0.5: %v, want it refused", err)
	}
}

func TestRetryDelay_SpreadsRetriesThatFellDueTogether(t *testing.T) {
	b := &Broker{opts: Options{AckTimeout: time.Second,
		FeatureOptions: FeatureOptions{RetryBackoff: 2,
			MaxRetryDelay: time.Minute},
	}}
	least, most := time.Hour, time.Duration(0)
	for seq := range uint64(100) {
		p := &pending{message: &Message{Seq: seq + 1}, attempt: 3}
		d := b.retryDelay(p)
		least, most = min(least, d), max(most, d)
	}
	// Attempt 3 waits four seconds less up to a fifth: the hundred are
	// spread over most of that fifth, not bunched.
	if least < 3200*time.Millisecond || most > 4*time.Second ||
		most-least < 600*time.Millisecond {
		t.Fatalf("100 retries at attempt 3 wait %v to %v, want spread "+
			"over 3.2s to 4s", least, most)
	}
	// The cap holds, and a cap below the ack timeout is the ack timeout.
	p := &pending{message: &Message{Seq: 1}, attempt: 30}
	if d := b.retryDelay(p); d > time.Minute || d < 48*time.Second {
		t.Fatalf("attempt 30 waits %v, want at most the minute's cap", d)
	}
	b.opts.MaxRetryDelay = time.Millisecond
	if d := b.retryDelay(p); d > time.Second || d < 800*time.Millisecond {
		t.Fatalf("with a 1ms cap attempt 30 waits %v, want about the "+
			"ack timeout", d)
	}
}

// drain takes every frame a fake connection has been sent, without
// waiting, and returns the deliveries among them.
func drain(t *testing.T, c *connection) []got {
	t.Helper()
	var deliveries []got
	v, _ := taken.LoadAndDelete(c)
	frames, _ := v.([][]byte)
	for _, data := range append(frames, c.outbox.Take(nil)...) {
		var g got
		if err := json.Unmarshal(data, &g); err != nil {
			t.Fatal(err)
		}
		if g.Type == "message" {
			deliveries = append(deliveries, g)
		}
	}
	return deliveries
}

// joinWorkers joins the work queue workers on jobs, on a fake connection.
func joinWorkers(t *testing.T, b *Broker, name string) *connection {
	t.Helper()
	c, wake := fakeConnection(b, name)
	c.handle([]byte(`{"type":"subscribe","topic":"jobs","group":"workers"}`))
	if g := nextFrame(t, c, wake); g.Type != "subscribed" {
		t.Fatalf("%s joined with %+v", name, g)
	}
	return c
}

// deadHead is how many dead letters $dead/jobs holds.
func deadHead(b *Broker) uint64 { return b.topic("$dead/jobs").headNow() }

func TestDeadLetters_AGroupJobReachesDeadOnce(t *testing.T) {
	t.Run("moved from member to member, the last leaving with it",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := New(Options{Secret: testSecret, Logger: quietLogger,
					Store:          newMemoryStore(),
					MaxRetries:     3,
					FeatureOptions: FeatureOptions{PingInterval: time.Hour},
				})
				if err != nil {
					t.Fatal(err)
				}
				a, c := joinWorkers(t, b, "a"), joinWorkers(t, b, "c")
				b.publish(&Message{Topic: "jobs", ID: "j", QoS: 1,
					Payload: json.RawMessage(`1`)}, nil, nil)

				// Neither acks: the job goes back and forth, an attempt
				// each time. The member holding its last attempt leaves;
				// the other is handed it, and never acks it either.
				attempts := 0
				for attempts < 4 {
					time.Sleep(time.Second)
					synctest.Wait()
					attempts += len(drain(t, a)) + len(drain(t, c))
				}
				holder := a
				if pendingOf(b, c) > 0 {
					holder = c
				}
				b.unregister(holder)
				time.Sleep(10 * time.Minute)
				synctest.Wait()
				if n := deadHead(b); n != 1 {
					t.Fatalf("$dead/jobs holds %d letters, want 1", n)
				}
				if n := pendingCount(b); n != 0 {
					t.Fatalf("pending = %d, want 0", n)
				}
				if holder == a {
					b.unregister(c)
				} else {
					b.unregister(a)
				}
				b.Shutdown(context.Background())
			})
		})

	t.Run("through a restart whose crash lost the cursor's move",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := &crashingStore{memoryStore: newMemoryStore()}
				opts := Options{Secret: testSecret, Logger: quietLogger,
					Store: store, MaxRetries: 1,
					FeatureOptions: FeatureOptions{PingInterval: time.Hour},
				}
				b, err := New(opts)
				if err != nil {
					t.Fatal(err)
				}
				w := joinWorkers(t, b, "w")
				b.publish(&Message{Topic: "jobs", ID: "first", QoS: 1,
					Payload: json.RawMessage(`1`)}, nil, nil)
				time.Sleep(time.Second)
				synctest.Wait()
				w.handle([]byte(`{"type":"ack","topic":"jobs","seq":1}`))
				time.Sleep(time.Second)
				synctest.Wait()

				// The second job runs out of tries; its dead letter is
				// stored, the group's cursor move past it is lost.
				store.lose.Store(true)
				b.publish(&Message{Topic: "jobs", ID: "second", QoS: 1,
					Payload: json.RawMessage(`2`)}, nil, nil)
				time.Sleep(time.Minute)
				synctest.Wait()
				if n := deadHead(b); n != 1 {
					t.Fatalf("before the restart $dead/jobs holds %d, want 1",
						n)
				}
				b.unregister(w)
				b.Shutdown(context.Background())

				// After the restart the group resumes from its cursor,
				// before the second job, which runs out of tries again:
				// its dead letter is the same one, stored once.
				store.lose.Store(false)
				b, err = New(opts)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Shutdown(context.Background())
				w = joinWorkers(t, b, "w")
				defer b.unregister(w) // before the Shutdown: no socket
				time.Sleep(time.Second)
				synctest.Wait()
				if got := drain(t, w); len(got) == 0 ||
					got[0].MessageID != "second" {
					t.Fatalf("after the restart the member got %+v, want "+
						"the second job again", got)
				}
				time.Sleep(time.Minute)
				synctest.Wait()
				if n := deadHead(b); n != 1 {
					t.Fatalf("after the restart $dead/jobs holds %d, want 1",
						n)
				}
			})
		})
}

// pendingOf is how many deliveries c owes acks for.
func pendingOf(b *Broker, c *connection) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight
}

// crashingStore is a memoryStore whose cursor moves are lost while lose
// is set, as a crash between a message's commit and theirs would lose
// them, and which a restarted broker opens again.
type crashingStore struct {
	*memoryStore
	lose atomic.Bool
}

// Commit commits batch, without its cursor moves while s is set to lose
// them.
func (s *crashingStore) Commit(batch *Batch) error {
	kept := *batch
	if s.lose.Load() {
		kept.Cursors = nil
	}
	return s.memoryStore.Commit(&kept)
}

// Close leaves the memory for the next broker.
func (s *crashingStore) Close() error { return nil }

func TestDeadLetters_TwoPlainSubscriptionsGiveUpEachItsOwn(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 100 * time.Millisecond,
		MaxRetries: -1})
	operator := ts.dialWith("operator", Claims{Subscribe: []string{"$dead/#"}})
	operator.subscribe("$dead/jobs", nil)
	// Two connections of one subject: two obligations, two letters.
	first, second := ts.dial("worker"), ts.dial("worker")
	first.subscribe("jobs", nil)
	second.subscribe("jobs", nil)
	ts.dial("publisher").publish("jobs", "job", 1, "job-1")
	for range 2 {
		dead := operator.expect("message")
		operator.ack(dead)
		var letter wire.DeadLetter
		json.Unmarshal(dead.Payload, &letter)
		if letter.MessageID != "job-1" || letter.Subscriber != "worker" {
			t.Fatalf("dead letter %+v, want job-1's, worker's", letter)
		}
	}
	operator.quiet()
}

// A nak names what an ack would clear: one message_id pending on two
// topics of one connection is handed back on both, as an ack by the
// same id clears both (protocol.md, "Naks").
func TestNak_ByIDHandsBackEveryDeliveryOfIt(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	sub, pub := ts.dial("sub"), ts.dial("pub")
	sub.subscribe("jobs", nil)
	sub.subscribe("mail", nil)
	pub.publish("jobs", 1, 1, "twin")
	pub.publish("mail", 2, 1, "twin")
	sub.messages(2)

	sub.send(map[string]any{"type": "nak", "message_id": "twin",
		"delay_ms": 0})
	topics := map[string]int{}
	for _, g := range sub.messages(2) {
		topics[g.Topic] = g.Attempt
	}
	if topics["jobs"] != 2 || topics["mail"] != 2 {
		t.Fatalf("after the nak got attempts %v, want attempt 2 on jobs "+
			"and on mail", topics)
	}
	sub.send(map[string]any{"type": "ack", "message_id": "twin"})
	sub.quiet()
	if left := pendingIDs(ts.broker); len(left) != 0 {
		t.Fatalf("after one ack by id %v are pending, want none", left)
	}
}

// A subscriber that stops reading while a large message fills its
// socket holds messages with a ttl_ms in its outbox; once it reads
// again, those that expired while they waited are not written: nothing
// leaves after its expires_at. The QoS 1 one goes to $dead as expired.
func TestExpiry_KeptAtTheSocketBehindAFullOutbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps := startPipeBroker(t, Options{AckTimeout: time.Second,
			MaxRetries: -1})
		defer ps.stop()
		sub, pub := ps.dialAs("sub"), ps.dialAs("pub")
		operator := ps.dial("operator")
		operator.authenticate(signed(t, "operator", readsDeadLetters))
		operator.subscribe("$dead/offers", nil)
		sub.subscribe("offers", nil)
		sub.ws.SetReadLimit(1 << 20)

		// The pipe takes nothing the subscriber does not read: the
		// writer waits on the large message, and the rest behind it.
		pub.publish("offers", strings.Repeat("x", 64<<10), 0, "large")
		for qos, id := range []string{"short-0", "short-1"} {
			pub.send(map[string]any{"type": "publish", "topic": "offers",
				"payload": id, "qos": qos, "message_id": id, "ttl_ms": 300})
			if qos == 1 {
				pub.expect("published")
			}
		}
		pub.publish("offers", "kept", 0, "kept")
		time.Sleep(2 * time.Second)

		for _, want := range []string{"large", "kept"} {
			if g := sub.expect("message"); g.MessageID != want {
				t.Fatalf("got %s, want %s: a message was written after "+
					"its expires_at", g.MessageID, want)
			}
		}
		dead := operator.expect("message")
		var letter wire.DeadLetter
		json.Unmarshal(dead.Payload, &letter)
		if letter.MessageID != "short-1" || letter.Reason != "expired" {
			t.Fatalf("dead letter %+v, want short-1's, expired", letter)
		}
	})
}
