package popsub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
)

// These tests are the broker's specification. Each runs a real broker on
// 127.0.0.1 and talks to it over WebSockets, except the few that use
// testing/synctest to run the retry and retention clocks in fake time.
//
// Where each section of popsub.go is tested (TestSections_EachHasItsTests
// holds this table to the file's sections):
//
//	section                              test files
//	What it promises                     sim_test.go behaviour_test.go
//	Options, messages and frames         popsub_test.go schema_test.go
//	The broker and its topics            popsub_test.go engine_test.go
//	The log: seq first, sync second      store_test.go crash_test.go
//	The machine room                     store_test.go budget_test.go
//	Connecting and authenticating        popsub_test.go hardening_test.go
//	Subscribing                          popsub_test.go overlap_test.go
//	Publishing and fan-out               popsub_test.go flow_test.go
//	The outbox and back-pressure         flow_test.go popsub_test.go
//	Acknowledgements                     popsub_test.go overlap_test.go
//	Retries and dead letters             deadletters_test.go timers_test.go
//	Replay                               popsub_test.go store_test.go
//	Shutdown                             popsub_test.go hardening_test.go
//	Defaults and start-up                store_test.go delays_test.go
//	Tokens                               popsub_test.go hardening_test.go
//	Keepalives, limits and batches       hardening_test.go popsub_test.go
//	Logins and passwords                 hardening_test.go
//	Topic rules                          popsub_test.go hardening_test.go
//	Durable subscriptions                popsub_test.go crash_test.go
//	Publishing from Go                   example_test.go
//	Confirms                             popsub_test.go flow_test.go
//	Work queues                          workqueues_test.go
//	Naks, backoff and expiry             naks_test.go
//	Delayed delivery                     delays_test.go timers_test.go
//	The x-ray                            events_test.go
//	Retention                            store_test.go
//	Seqs reserved on disk                crash_test.go store_test.go
//	After a commit                       store_test.go
//	A log shared by several brokers      shared_test.go engine_test.go
//
// The package doc's own sections (Reading path, Goroutines, A session),
// The queues and Messages at rest have no behaviour of their own: their
// code is tested through the sections that use it, and prose_test.go
// holds the numbers the prose quotes to the code.

func TestBroker_Authentication(t *testing.T) {
	ts := startBroker(t, Options{})
	sign := func(method jwt.SigningMethod, key any, claims jwt.Claims) string {
		tok, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	hour := jwt.NewNumericDate(time.Now().Add(time.Hour))
	refused := map[string]string{
		"a token signed with another secret": sign(jwt.SigningMethodHS256,
			[]byte("another-secret-another-secret-!!"),
			jwt.RegisteredClaims{Subject: "eve", ExpiresAt: hour}),
		"an expired token": sign(jwt.SigningMethodHS256, testSecret,
			jwt.RegisteredClaims{Subject: "eve",
				ExpiresAt: jwt.NewNumericDate(time.Now().Add(-time.Hour))}),
		"a token without exp": sign(jwt.SigningMethodHS256, testSecret,
			jwt.RegisteredClaims{Subject: "eve"}),
		"a token without sub": sign(jwt.SigningMethodHS256, testSecret,
			jwt.RegisteredClaims{ExpiresAt: hour}),
		"a token with alg none": sign(jwt.SigningMethodNone,
			jwt.UnsafeAllowNoneSignatureType,
			jwt.RegisteredClaims{Subject: "eve", ExpiresAt: hour}),
		"a token longer than the cap": strings.Repeat("a", 5000),
	}

	t.Run("a valid token is answered with authenticated", func(t *testing.T) {
		c := dialRaw(t, ts.url, "alice")
		c.send(map[string]any{"type": "auth", "token": token(t, "alice")})
		if g := c.expect("authenticated"); g.Sub != "alice" {
			t.Fatalf("sub = %q, want alice", g.Sub)
		}
	})
	for name, tok := range refused {
		t.Run(name+" gets auth_failed and close 4001", func(t *testing.T) {
			c := dialRaw(t, ts.url, "eve")
			c.send(map[string]any{"type": "auth", "token": tok})
			c.expectError("auth_failed")
			c.expectClose(CloseAuthFailed)
		})
	}
	t.Run("a frame before auth gets unauthenticated and 4001",
		func(t *testing.T) {
			c := dialRaw(t, ts.url, "eve")
			c.send(map[string]any{"type": "subscribe", "topic": "chat"})
			if g := c.expectError("unauthenticated"); g.Message !=
				"must authenticate first" {
				t.Fatalf("message = %q", g.Message)
			}
			c.expectClose(CloseAuthFailed)
		})
	t.Run("a silent connection is closed with 4001", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{AuthTimeout: time.Second})
			defer ps.stop()
			c := ps.dial("eve")
			start := time.Now()
			c.expectClose(CloseAuthFailed)
			if waited := time.Since(start); waited != time.Second {
				t.Fatalf("closed after %v, want the auth timeout, 1s",
					waited)
			}
		})
	})
	t.Run("a re-auth with a fresh token keeps the session",
		func(t *testing.T) {
			c := ts.dial("alice")
			c.send(map[string]any{"type": "auth", "token": token(t, "alice")})
			c.expect("authenticated")
			c.quiet()
		})
}

func TestBroker_AcksArePerSubscriber(t *testing.T) {
	// Long enough for alice's ack to arrive on a loaded machine, short
	// enough that bob's retries come at once.
	ts := startBroker(t, Options{AckTimeout: 250 * time.Millisecond})
	alice, bob := ts.dial("alice"), ts.dial("bob")
	publisher := ts.dial("publisher")
	alice.subscribe("jobs", nil)
	bob.subscribe("jobs", nil)

	confirm := publisher.publish("jobs", "build", 1, "job-1")
	first := alice.expect("message")
	alice.ack(first)
	bobFirst := bob.expect("message")
	if first.Attempt != 1 || bobFirst.Attempt != 1 {
		t.Fatalf("attempts %d, %d; want 1, 1", first.Attempt,
			bobFirst.Attempt)
	}

	t.Run("the retry goes only to the subscriber that did not ack",
		func(t *testing.T) {
			retry := bob.expect("message")
			if retry.Attempt != 2 || retry.MessageID != "job-1" ||
				retry.Seq != confirm.Seq {
				t.Fatalf("retry = %+v, want job-1 seq %d attempt 2", retry,
					confirm.Seq)
			}
			alice.quiet()
		})
	t.Run("an ack for someone else's delivery changes nothing",
		func(t *testing.T) {
			publisher.ack(first)
			publisher.quiet()
			if retry := bob.expect("message"); retry.Attempt != 3 {
				t.Fatalf("attempt = %d, want 3", retry.Attempt)
			}
		})
	t.Run("an ack clears the acking subscriber's entry", func(t *testing.T) {
		bob.ack(first)
		bob.quiet()
		if n := pendingCount(ts.broker); n != 0 {
			t.Fatalf("pending entries = %d, want 0", n)
		}
	})
}

func TestBroker_DeadLetters(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 100 * time.Millisecond,
		MaxRetries: 2})
	worker := ts.dial("worker")
	operator := ts.dialWith("operator", Claims{Subscribe: []string{"$dead/#"}})
	publisher := ts.dial("publisher")
	worker.subscribe("jobs", nil)
	operator.subscribe("$dead/jobs", nil)

	confirm := publisher.publish("jobs", map[string]any{"n": 1}, 1, "")
	attempts := []int{}
	for _, g := range worker.messages(3) {
		attempts = append(attempts, g.Attempt)
	}
	if !slices.Equal(attempts, []int{1, 2, 3}) {
		t.Fatalf("attempts = %v, want [1 2 3]", attempts)
	}

	dead := operator.expect("message")
	operator.ack(dead)
	var letter wire.DeadLetter
	if err := json.Unmarshal(dead.Payload, &letter); err != nil {
		t.Fatalf("dead letter payload %s: %v", dead.Payload, err)
	}
	want := wire.DeadLetter{Topic: "jobs", MessageID: confirm.MessageID,
		Seq: confirm.Seq, Payload: json.RawMessage(`{"n":1}`),
		Reason: "not acknowledged", Attempts: 3, Subscriber: "worker"}
	if fmt.Sprint(letter) != fmt.Sprint(want) {
		t.Fatalf("dead letter = %+v, want %+v", letter, want)
	}
	operator.quiet()
	worker.quiet()
	if n := pendingCount(ts.broker); n != 0 {
		t.Fatalf("pending entries = %d, want 0", n)
	}
}

func TestBroker_ReplayKeepsOriginalIdentity(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 250 * time.Millisecond})
	watcher, publisher := ts.dial("watcher"), ts.dial("publisher")
	watcher.subscribe("news", nil)
	publisher.publish("news", "zero", 0, "n-0")
	publisher.publish("news", map[string]any{"one": 1}, 1, "n-1")
	live := watcher.messages(2)
	for _, g := range live {
		watcher.ack(g)
	}

	late := ts.dial("late")
	if g := late.subscribe("news", nil); g.Seq != 2 {
		t.Fatalf("subscribed seq = %d, want 2", g.Seq)
	}
	replayed := late.messages(2)
	for i, g := range replayed {
		want := live[i]
		if g.MessageID != want.MessageID || g.Seq != want.Seq ||
			g.Timestamp != want.Timestamp || g.QoS != want.QoS ||
			string(g.Payload) != string(want.Payload) {
			t.Fatalf("replayed %+v, want the original %+v", g, want)
		}
	}

	t.Run("a QoS 1 replay is retried until acked", func(t *testing.T) {
		retry := late.expect("message")
		if retry.MessageID != "n-1" || retry.Attempt != 2 {
			t.Fatalf("got %+v, want n-1 attempt 2", retry)
		}
		late.ack(retry)
		late.quiet()
	})
}

func TestBroker_SubscribeOptions(t *testing.T) {
	ts := startBroker(t, Options{MaxMessages: 5})
	publisher := ts.dial("publisher")
	for i := range 10 {
		publisher.publish("log", i, 1, "")
	}
	cases := []struct {
		name      string
		extra     map[string]any
		recovered bool
		want      []uint64
	}{
		{"no options replay everything retained", nil, true, span(6, 10)},
		{"after returns only newer messages",
			map[string]any{"after": 7}, true, span(8, 10)},
		{"after the head replays nothing",
			map[string]any{"after": 10}, true, nil},
		{"after what retention removed says recovered false",
			map[string]any{"after": 2}, false, span(6, 10)},
		{"after beyond the head says recovered false",
			map[string]any{"after": 50}, false, span(6, 10)},
		{"last returns the newest messages",
			map[string]any{"last": 3}, true, span(8, 10)},
		{"last larger than the log returns what is retained",
			map[string]any{"last": 50}, true, span(6, 10)},
		{"last 0 is live only", map[string]any{"last": 0}, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial("reader")
			g := c.subscribe("log", tc.extra)
			if g.Seq != 10 || (g.Recovered == nil) != tc.recovered {
				t.Fatalf("subscribed = %+v, want seq 10, recovered %v", g,
					tc.recovered)
			}
			wantSeqs(t, c.messages(len(tc.want)), tc.want)
			c.quiet()
		})
	}
	t.Run("after and last together are refused", func(t *testing.T) {
		c := ts.dial("reader")
		c.send(map[string]any{"type": "subscribe", "topic": "log",
			"after": 1, "last": 1})
		c.expectError("bad_frame")
	})
}

func TestBroker_ReplayHandOverHasNoGap(t *testing.T) {
	const total = 3000
	ts := startBroker(t, Options{MaxMessages: total})
	publisher := ts.dial("publisher")
	subscriber := ts.dial("subscriber")

	// The publisher runs while the subscriber joins: some messages are
	// replayed, the rest arrive live, and the seams must not show.
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range total {
			publisher.publish("ticks", i, 0, "")
		}
		publisher.quiet()
	})
	for {
		if ts.broker.topic("ticks").headNow() > total/10 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	subscriber.subscribe("ticks", nil)
	wantSeqs(t, subscriber.messages(total), span(1, total))
	wg.Wait()
	subscriber.quiet()
}

func TestBroker_ReplayHandsOverTheWholeWindow(t *testing.T) {
	// Replay may use half the window; live traffic, all of it. The
	// newest message is the hand-over: once the subscriber has it, the
	// next one comes live, so a window of two holds both.
	// A read after the first waits until the test ends: replay that
	// read on past the newest message would miss the hand-over.
	store := &gatedStore{memoryStore: newMemoryStore(),
		gate: make(chan struct{})}
	ts := startBroker(t, Options{MaxInflight: 2, Store: store})
	t.Cleanup(func() { close(store.gate) })
	publisher := ts.dial("publisher")
	publisher.publish("jobs", 1, 1, "j-1")
	late := ts.dial("late")
	late.subscribe("jobs", nil)
	wantSeqs(t, late.messages(1), []uint64{1})
	publisher.publish("jobs", 2, 1, "j-2")
	wantSeqs(t, late.messages(1), []uint64{2})
}

// gatedStore is a memoryStore whose reads after the first wait for gate
// to close.
type gatedStore struct {
	*memoryStore
	reads atomic.Int32
	gate  chan struct{}
}

// Read waits for the gate unless it is the first.
func (g *gatedStore) Read(topic string, after uint64, limit,
	maxBytes int) ([]*Message, error) {
	if g.reads.Add(1) > 1 {
		<-g.gate
	}
	return g.memoryStore.Read(topic, after, limit, maxBytes)
}

// headNow reads t.head under its lock (tests only).
func (t *topic) headNow() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.head
}

func TestBroker_DurableSubscriptions(t *testing.T) {
	path := t.TempDir() + "/popsub.db"
	ts := startBroker(t, Options{Store: openBolt(t, path)})
	publisher := ts.dial("publisher")
	durable := map[string]any{"durable": "billing"}

	worker := ts.dial("worker")
	worker.subscribe("orders", durable)
	for i := range 3 {
		publisher.publish("orders", i, 1, fmt.Sprintf("o-%d", i+1))
	}
	got := worker.messages(3)
	worker.ack(got[0])
	worker.ack(got[1])
	worker.quiet()
	worker.ws.Close(websocket.StatusNormalClosure, "")

	t.Run("a new connection resumes after the last acked message",
		func(t *testing.T) {
			publisher.publish("orders", 3, 1, "o-4")
			again := ts.dial("worker")
			again.subscribe("orders", durable)
			list := again.messages(2)
			wantSeqs(t, list, []uint64{3, 4})
			again.ack(list[0])
			again.quiet()
			again.ws.Close(websocket.StatusNormalClosure, "")
		})
	t.Run("the cursor survives a broker restart", func(t *testing.T) {
		ts.stop()
		restarted := startBroker(t, Options{Store: openBolt(t, path)})
		again := restarted.dial("worker")
		again.subscribe("orders", durable)
		wantSeqs(t, again.messages(1), []uint64{4})
		again.quiet()

		other := restarted.dial("worker")
		other.subscribe("orders", map[string]any{"durable": "audit"})
		wantSeqs(t, other.messages(4), span(1, 4))

		thief := restarted.dial("worker")
		thief.subscribe("orders", durable)
		wantSeqs(t, thief.messages(1), []uint64{4})
		if g := again.expect("unsubscribed"); g.Reason == "" {
			t.Fatalf("taken-over subscription got %+v, want a reason", g)
		}
	})
}

// A durable name is kept from its subscribe, not from its first
// delivery: resumed before anything came, it starts where it began, and
// hears what retention removed meanwhile, across a restart too.
func TestBroker_ADurableNameStartsWhereItWasSubscribed(t *testing.T) {
	const limit = 5
	ts := startBroker(t, Options{MaxMessages: limit})
	pub := ts.dial("pub")
	for i := range 3 {
		pub.publish("orders", i, 1, fmt.Sprint("before-", i))
	}
	first := ts.dial("worker")
	first.subscribe("orders", map[string]any{"durable": "new", "last": 0})
	first.subscribe("audit", map[string]any{"durable": "behind"})
	first.quiet()
	first.ws.CloseNow()

	pub.publish("orders", "after", 1, "after")
	again := ts.dial("worker")
	again.subscribe("orders", map[string]any{"durable": "new"})
	if g := again.expect("message"); g.MessageID != "after" {
		t.Fatalf("resumed with %s, want only after: a name asked to "+
			"skip the log replayed it", g.MessageID)
	}
	again.quiet()

	// Past the cap and a restart, the name subscribed to an empty
	// topic hears that its first messages are gone.
	for i := range limit + 3 {
		pub.publish("audit", i, 1, fmt.Sprint("a-", i))
	}
	ts = ts.restart()
	behind := ts.dial("worker")
	r := behind.subscribe("audit", map[string]any{"durable": "behind"})
	if r.Recovered == nil || *r.Recovered {
		t.Fatalf("resumed past the cap with %+v, want recovered:false", r)
	}
	if g := behind.expect("message"); g.MessageID != "a-3" {
		t.Fatalf("resumed with %s, want a-3, the oldest kept", g.MessageID)
	}
}

func TestBroker_IdempotentPublish(t *testing.T) {
	ts := startBroker(t, Options{})
	publisher, reader := ts.dial("publisher"), ts.dial("reader")
	reader.subscribe("pay", nil)
	first := publisher.publish("pay", 10, 1, "pay-1")
	again := publisher.publish("pay", 10, 1, "pay-1")
	if first.Duplicate || !again.Duplicate || again.Seq != first.Seq {
		t.Fatalf("confirms %+v then %+v; want the same seq, second "+
			"marked duplicate", first, again)
	}
	reader.ack(reader.expect("message"))
	reader.quiet()

	t.Run("another publisher's id never suppresses a publish",
		func(t *testing.T) {
			mallory, alice := ts.dial("mallory"), ts.dial("alice")
			squat := mallory.publish("payments", "mallory's", 1, "pay-1")
			mine := alice.publish("payments", "alice's", 1, "pay-1")
			if mine.Duplicate || mine.Seq == squat.Seq {
				t.Fatalf("alice's pay-1 got %+v after mallory's %+v; want "+
					"a message of its own", mine, squat)
			}
			if again := alice.publish("payments", "alice's", 1, "pay-1"); !again.
				Duplicate || again.Seq != mine.Seq {
				t.Fatalf("alice's repeat got %+v, want a duplicate of seq %d",
					again, mine.Seq)
			}
		})
	t.Run("the dedup memory survives a restart, publisher and all",
		func(t *testing.T) {
			path := t.TempDir() + "/popsub.db"
			one := startBroker(t, Options{Store: openBolt(t, path)})
			one.dial("p").publish("pay", 1, 1, "pay-1")
			one.stop()
			two := startBroker(t, Options{Store: openBolt(t, path)})
			if g := two.dial("p").publish("pay", 1, 1, "pay-1"); !g.Duplicate {
				t.Fatalf("after restart got %+v, want duplicate", g)
			}
			if g := two.dial("q").publish("pay", 1, 1, "pay-1"); g.Duplicate {
				t.Fatalf("another publisher after restart got %+v, want a "+
					"message of its own", g)
			}
		})
}

func TestBroker_ConfirmedMessagesSurviveRestart(t *testing.T) {
	path := t.TempDir() + "/popsub.db"
	ts := startBroker(t, Options{Store: openBolt(t, path)})
	publisher := ts.dial("publisher")
	var ids []string
	for i := range 50 {
		ids = append(ids, publisher.publish("audit", i, 1, "").MessageID)
	}
	ts.stop()

	restarted := startBroker(t, Options{Store: openBolt(t, path)})
	reader := restarted.dial("reader")
	reader.subscribe("audit", map[string]any{"last": 50})
	for i, g := range reader.messages(50) {
		if g.MessageID != ids[i] || g.Seq != uint64(i+1) {
			t.Fatalf("message %d = %+v, want id %s", i, g, ids[i])
		}
	}
	next := restarted.dial("publisher").publish("audit", "after", 1, "")
	if next.Seq != 51 {
		t.Fatalf("first seq after restart = %d, want 51", next.Seq)
	}
}

func TestBroker_SlowConsumers(t *testing.T) {
	t.Run("a subscriber that stops acking waits, and catches up on acks",
		func(t *testing.T) {
			ts := startBroker(t, Options{MaxInflight: 4})
			slow, fast := ts.dial("slow"), ts.dial("fast")
			publisher := ts.dial("publisher")
			slow.subscribe("q", nil)
			fast.subscribe("q", nil)
			for i := range 10 {
				publisher.publish("q", i, 1, "")
				fast.ack(fast.expect("message"))
			}
			fast.quiet()

			// The window held four; the rest wait in the log, and each
			// ack lets more through, in order, with nothing lost. Read
			// from the log, they take half the window at a time.
			wantSeqs(t, slow.messages(4), span(1, 4))
			slow.quiet()
			for _, seq := range []uint64{4, 6, 8} {
				slow.send(map[string]any{"type": "ack", "topic": "q",
					"seq": seq})
				wantSeqs(t, slow.messages(2), span(seq+1, seq+2))
			}
			slow.quiet()
		})
	t.Run("a subscriber the log overtakes is told what it missed, "+
		"and goes on", func(t *testing.T) {
		ts := startBroker(t, Options{MaxInflight: 2, MaxMessages: 2})
		slow, fast := ts.dial("slow"), ts.dial("fast")
		publisher := ts.dial("publisher")
		slow.subscribe("q", nil)
		fast.subscribe("q", nil)
		for i := range 6 {
			publisher.publish("q", i, 1, "")
			fast.ack(fast.expect("message"))
		}
		wantSeqs(t, slow.messages(2), span(1, 2))
		slow.quiet()

		// Its acks make room; the log keeps 5 and 6 only (3 too, if the
		// replay read it before it left).
		slow.send(map[string]any{"type": "ack", "topic": "q", "seq": 2})
		overtaken(t, slow, 2, 6)
		fast.quiet()
	})
	t.Run("a subscriber that stops reading is cut off, costing its outbox",
		func(t *testing.T) {
			const bound = 256 << 10
			ts := startBrokerSmallBuffers(t, Options{OutboxBytes: bound,
				MaxMessages: 1000, WriteTimeout: time.Second})
			stuck, fast := ts.dialStuck("stuck"), ts.dial("fast")
			publisher := ts.dial("publisher")
			stuck.subscribe("video", nil)
			fast.subscribe("video", nil)
			peak := watchOutboxes(t, ts.broker)
			frame := strings.Repeat("x", 64<<10)
			for i := range 100 {
				publisher.publish("video", frame, 0, "")
				if g := fast.expect("message"); g.Seq != uint64(i+1) {
					t.Fatalf("fast got seq %d, want %d", g.Seq, i+1)
				}
			}
			waitFor(t, func() bool { return ts.connected("stuck") == 0 },
				"the stuck subscriber to be cut off")
			if p := peak(); p > bound+len(frame)+256 {
				t.Fatalf("an outbox held %d bytes, bound %d", p, bound)
			}
			// Its close frame may never reach it: an abrupt end is fine.
			if s := stuck.closeStatus(); s != CloseSlowConsumer && s != -1 {
				t.Fatalf("stuck: closed with %d, want 4008 or an abrupt end",
					s)
			}
			fast.quiet()
		})
	t.Run("a prompt subscriber is never cut off by a long replay",
		func(t *testing.T) {
			ts := startBroker(t, Options{OutboxBytes: 2048, MaxInflight: 10})
			publisher := ts.dial("publisher")
			for i := range 500 {
				publisher.publish("history", i, 1, "")
			}
			reader := ts.dial("reader")
			reader.subscribe("history", nil)
			for i := range 500 {
				g := reader.expect("message")
				if g.Seq != uint64(i+1) {
					t.Fatalf("got seq %d, want %d", g.Seq, i+1)
				}
				reader.ack(g)
			}
			reader.quiet()
		})
}

func TestBroker_BadFramesGetErrors(t *testing.T) {
	ts := startBroker(t, Options{MaxFrameBytes: 4096})
	cases := []struct {
		name  string
		frame string
		code  string
	}{
		{"malformed JSON", `{"type":`, "bad_frame"},
		{"a field of the wrong type",
			`{"type":"publish","topic":"a","payload":1,"qos":"1"}`,
			"bad_frame"},
		{"a frame without a type", `{"topic":"a"}`, "missing_field"},
		{"an unknown type", `{"type":"dance"}`, "unknown_type"},
		{"a subscribe to an invalid filter",
			`{"type":"subscribe","topic":"a/#/b"}`, "invalid_topic"},
		{"a subscribe to an empty topic", `{"type":"subscribe"}`,
			"invalid_topic"},
		{"a subscribe to a topic over 256 bytes",
			`{"type":"subscribe","topic":"` + strings.Repeat("a", 257) +
				`"}`, "invalid_topic"},
		{"a durable wildcard subscription",
			`{"type":"subscribe","topic":"a/+","durable":"d"}`, "bad_frame"},
		{"a publish to a wildcard",
			`{"type":"publish","topic":"a/+","payload":1}`, "invalid_topic"},
		{"a publish without a payload",
			`{"type":"publish","topic":"a"}`, "missing_field"},
		{"a publish with qos 2",
			`{"type":"publish","topic":"a","payload":1,"qos":2}`,
			"invalid_qos"},
		{"a publish to a broker topic",
			`{"type":"publish","topic":"$dead/a","payload":1}`, "forbidden"},
		{"a message_id over 256 bytes",
			`{"type":"publish","topic":"a","payload":1,"message_id":"` +
				strings.Repeat("i", 257) + `"}`, "invalid_message_id"},
		{"an ack without a message_id", `{"type":"ack"}`, "missing_field"},
	}
	c := ts.dial("fuzzy")
	for _, tc := range cases {
		t.Run(tc.name+" gets "+tc.code, func(t *testing.T) {
			c.t = t
			c.sendRaw(websocket.MessageText, []byte(tc.frame))
			c.expectError(tc.code)
			c.quiet()
		})
	}
	closes := []struct {
		name string
		typ  websocket.MessageType
		data []byte
		code websocket.StatusCode
	}{
		{"a frame over the limit closes with 1009", websocket.MessageText,
			[]byte(`"` + strings.Repeat("x", 5000) + `"`),
			websocket.StatusMessageTooBig},
		{"a binary frame closes with 1003", websocket.MessageBinary,
			[]byte(`{"type":"ping"}`), websocket.StatusUnsupportedData},
		{"invalid UTF-8 closes with 1007", websocket.MessageText,
			[]byte("{\"type\":\"ping\",\"x\":\"\xff\"}"),
			websocket.StatusInvalidFramePayloadData},
	}
	for _, tc := range closes {
		t.Run(tc.name, func(t *testing.T) {
			c := ts.dial("fuzzy")
			c.sendRaw(tc.typ, tc.data)
			c.expectClose(tc.code)
		})
	}
	t.Run("other clients are unaffected", func(t *testing.T) {
		ts.dial("bystander").quiet()
	})
}

func TestBroker_Wildcards(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	sensors, everything := ts.dial("sensors"), ts.dial("everything")
	publisher := ts.dial("publisher")
	publisher.publish("sensors/old/temp", 0, 1, "")
	sensors.subscribe("sensors/+/temp", nil)
	everything.subscribe("#", nil)

	// Seqs, and so order, are per topic: on a shared log each topic has
	// a feed of its own, and # may hear humidity before temp.
	publisher.publish("sensors/kitchen/temp", 21, 0, "")
	publisher.publish("sensors/kitchen/humidity", 40, 1, "")
	list := everything.messages(2)
	topics := []string{list[0].Topic, list[1].Topic}
	slices.Sort(topics)
	if !slices.Equal(topics, []string{"sensors/kitchen/humidity",
		"sensors/kitchen/temp"}) {
		t.Fatalf("# got %+v", list)
	}
	g := sensors.expect("message")
	if g.Topic != "sensors/kitchen/temp" {
		t.Fatalf("got topic %q, want sensors/kitchen/temp", g.Topic)
	}
	sensors.quiet()

	t.Run("unsubscribe stops deliveries", func(t *testing.T) {
		sensors.send(map[string]any{"type": "unsubscribe",
			"topic": "sensors/+/temp"})
		sensors.expect("unsubscribed")
		publisher.publish("sensors/kitchen/temp", 22, 0, "")
		publisher.quiet()
		everything.expect("message")
		sensors.quiet()
	})
}

// A wildcard has no single log to fall back on, so one that owes all the
// acks its window allows is cut off; the close's reason says so, as the
// client read everything and may not guess why.
func TestBroker_AWildcardThatNeverAcksIsToldWhyItIsCutOff(t *testing.T) {
	ts := startBroker(t, Options{MaxInflight: 2, AckTimeout: time.Minute})
	everything, publisher := ts.dial("everything"), ts.dial("publisher")
	everything.subscribe("#", nil)
	for i := range 3 {
		publisher.publish("jobs", i, 1, "")
	}
	// The close may come before the two messages the window let in: a
	// cut-off does not wait for a slow consumer's outbox.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var err error
	for err == nil {
		_, _, err = everything.ws.Read(ctx)
	}
	var closed websocket.CloseError
	if !errors.As(err, &closed) || closed.Code != CloseSlowConsumer ||
		!strings.Contains(closed.Reason, "wildcard") {
		t.Fatalf("the wildcard ended with %v, want 4008 naming the wildcard",
			err)
	}
}

func TestCovers_MatchesTopics(t *testing.T) {
	cases := []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/+", "a/b", true},
		{"a/+", "a/b/c", false},
		{"a/+/c", "a/b/c", true},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"#", "a/b", true},
		{"+", "a", true},
		{"+", "a/b", false},
		{"#", "$dead/a", false},
		{"+/a", "$sys/a", false},
		{"$dead/#", "$dead/a", true},
		{"a/b", "a", false},
		{"a", "a/b", false},
		{"a//c", "a//c", true},
		{"a/+/c", "a//c", true},
	}
	for _, tc := range cases {
		if got := wire.Covers(tc.filter, tc.topic); got != tc.want {
			t.Errorf("wire.Covers(%q, %q) = %v, want %v", tc.filter, tc.topic,
				got, tc.want)
		}
	}
}

func TestAppendDelivery_IsValidJSON(t *testing.T) {
	m := &Message{Topic: "a\"b\\c\n\u00e9", ID: "id\x01<>&", Seq: 7,
		Timestamp: 1700000000000, QoS: 1, Payload: json.RawMessage(`{"k":[1]}`)}
	var g got
	if err := json.Unmarshal(appendDelivery(nil, m, 3), &g); err != nil {
		t.Fatalf("appendDelivery made invalid JSON: %v", err)
	}
	if g.Topic != m.Topic || g.MessageID != m.ID || g.Seq != 7 ||
		g.Attempt != 3 || g.QoS != 1 || g.Timestamp != m.Timestamp {
		t.Fatalf("decoded %+v from %+v", g, m)
	}
}

func TestBroker_ShutdownClosesClientsWith1001(t *testing.T) {
	ts := startBroker(t, Options{})
	c := dialRaw(t, ts.url, "reader")
	c.send(map[string]any{"type": "auth", "token": token(t, "reader")})
	c.expect("authenticated")
	done := make(chan websocket.StatusCode)
	go func() { done <- c.closeStatus() }()
	ts.stop()
	if code := <-done; code != websocket.StatusGoingAway {
		t.Fatalf("closed with %d, want 1001", code)
	}
}

// pendingIDs lists the message ids of every unacked delivery, sorted.
func pendingIDs(b *Broker) []string {
	var ids []string
	for _, c := range b.connectionList() {
		c.mu.Lock()
		for _, q := range c.unacked {
			for _, p := range q.Live() {
				ids = append(ids, p.message.ID)
			}
		}
		c.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

func TestBroker_AckForms(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	worker, publisher := ts.dial("worker"), ts.dial("publisher")
	worker.subscribe("jobs", nil)
	worker.subscribe("mail", nil)
	for _, id := range []string{"j1", "j2", "j3", "j4", "j5", "j6"} {
		publisher.publish("jobs", id, 1, id)
	}
	publisher.publish("mail", "m1", 1, "m1")
	publisher.publish("mail", "m2", 1, "m2")
	worker.messages(8)

	// Each ack is followed by a ping: its pong proves the ack was handled.
	steps := []struct {
		name string
		ack  map[string]any
		left []string
	}{
		{"everything on a topic up to a seq",
			map[string]any{"topic": "jobs", "seq": 2},
			[]string{"j3", "j4", "j5", "j6", "m1", "m2"}},
		{"one id out of order, on no topic",
			map[string]any{"message_id": "j5"},
			[]string{"j3", "j4", "j6", "m1", "m2"}},
		{"a list of ids on a topic",
			map[string]any{"topic": "mail", "message_ids": []string{"m2"}},
			[]string{"j3", "j4", "j6", "m1"}},
		{"an id on another topic changes nothing",
			map[string]any{"topic": "mail", "message_id": "j3"},
			[]string{"j3", "j4", "j6", "m1"}},
		{"a seq past a gap, with ids only on that topic",
			map[string]any{"topic": "jobs", "seq": 4,
				"message_ids": []string{"m1"}},
			[]string{"j6", "m1"}},
		{"the largest seq there is",
			map[string]any{"topic": "jobs", "seq": uint64(math.MaxUint64)},
			[]string{"m1"}},
		{"an id on its topic", map[string]any{"topic": "mail",
			"message_id": "m1"}, nil},
	}
	for _, step := range steps {
		step.ack["type"] = "ack"
		worker.send(step.ack)
		worker.quiet()
		if left := pendingIDs(ts.broker); !slices.Equal(left, step.left) {
			t.Fatalf("after %s: pending %v, want %v", step.name, left,
				step.left)
		}
	}

	t.Run("a message through two subscriptions is pending for each, "+
		"and owes one ack", func(t *testing.T) {
		worker.subscribe("#", nil)
		publisher.publish("jobs", "twice", 1, "j7")
		worker.messages(2)
		if left := pendingIDs(ts.broker); !slices.Equal(left,
			[]string{"j7", "j7"}) {
			t.Fatalf("pending %v, want [j7 j7]", left)
		}
		worker.send(map[string]any{"type": "ack", "message_id": "j7"})
		worker.quiet()
		if left := pendingIDs(ts.broker); len(left) != 0 {
			t.Fatalf("pending %v after one ack, want none", left)
		}
	})
	t.Run("an id on no topic is acked on every topic that holds it",
		func(t *testing.T) {
			publisher.publish("jobs", "same id", 1, "twin")
			publisher.publish("mail", "same id", 1, "twin")
			worker.messages(4) // each through "#" as well
			worker.send(map[string]any{"type": "ack", "message_id": "twin"})
			worker.quiet()
			if left := pendingIDs(ts.broker); len(left) != 0 {
				t.Fatalf("pending %v, want none", left)
			}
		})
}

// objects reads frames from c until it has n objects, and returns them
// with how many frames they came in.
func (c *client) objects(n int) ([]got, int) {
	c.t.Helper()
	var list []got
	frames := 0
	for len(list) < n {
		ctx, cancel := context.WithTimeout(context.Background(),
			10*time.Second)
		_, data, err := c.ws.Read(ctx)
		cancel()
		if err != nil {
			c.t.Fatalf("%s: read: %v", c.name, err)
		}
		record(c.t, false, data)
		frames++
		for line := range bytes.Lines(data) {
			var g got
			if err := json.Unmarshal(line, &g); err != nil {
				c.t.Fatalf("%s: line %q of frame %q: %v", c.name, line, data,
					err)
			}
			list = append(list, g)
		}
	}
	return list, frames
}

// TestBroker_OwnPublishComesBeforeItsConfirm is the original's demo,
// tutorial 1's last command: subscribe live, publish at QoS 1 at once,
// without waiting for "subscribed". A subscription with nothing to
// replay is live before the reader reads the publish, so the message
// always comes before its confirm; when it went live on a goroutine of
// its own, a busy machine now and then sent the confirm first.
func TestBroker_OwnPublishComesBeforeItsConfirm(t *testing.T) {
	ts := startBroker(t, Options{})
	for i := range 100 {
		c := ts.dial(fmt.Sprint("demo-", i))
		topic := fmt.Sprint("chat/", i%3)
		c.send(map[string]any{"type": "subscribe", "topic": topic, "last": 0})
		c.send(map[string]any{"type": "publish", "topic": topic, "qos": 1,
			"payload": "hello"})
		c.expect("subscribed")
		c.expect("message")
		c.expect("published")
		c.ws.CloseNow()
	}
}

// TestBroker_FramesEveryLengthRight checks the writer's own framing at
// the lengths where a WebSocket header changes shape (RFC 6455, 5.2): up
// to 125 bytes the length is in the header's second byte, up to 65,535
// in two more, and beyond in eight. The client is coder/websocket's,
// which refuses a malformed frame; the test fails unless the deliveries
// it read cross both boundaries, one object a frame and in runs.
func TestBroker_FramesEveryLengthRight(t *testing.T) {
	ts := startBroker(t, Options{MaxLogBytes: 64 << 20})
	plain := ts.dial("plain")
	plain.subscribe("s", nil)
	batched := ts.dialBatched("batched")
	batched.subscribe("s", nil)
	publisher := ts.dial("publisher")
	var lengths []int
	for n := range 80 {
		lengths = append(lengths, n, 65_400+n)
	}
	// A one-letter message_id lets a delivery be under 126 bytes.
	for _, n := range lengths {
		publisher.publish("s", strings.Repeat("x", n), 0, "m")
	}
	seen := map[int]bool{}
	for _, n := range lengths {
		_, data, err := plain.ws.Read(context.Background())
		record(t, false, data)
		var g got
		if err != nil || json.Unmarshal(data, &g) != nil ||
			string(g.Payload) != `"`+strings.Repeat("x", n)+`"` {
			t.Fatalf("a payload of %d bytes came as %.80q (%v)", n, data, err)
		}
		seen[len(data)] = true
	}
	for _, size := range []int{125, 126, 65_535, 65_536} {
		if !seen[size] {
			t.Errorf("no delivery was %d bytes long: move the lengths", size)
		}
	}
	list, _ := batched.objects(len(lengths))
	for i, g := range list {
		if len(g.Payload) != lengths[i]+2 {
			t.Fatalf("in runs, delivery %d has %d bytes, want %d", i,
				len(g.Payload), lengths[i]+2)
		}
	}
}

// dialBatched connects sub as a client that opted into batches.
func (ts *testServer) dialBatched(sub string) *client {
	c := dialRaw(ts.t, ts.url, sub)
	c.send(map[string]any{"type": "auth", "token": token(ts.t, sub),
		"batch": true})
	c.expect("authenticated")
	return c
}

func TestBroker_Batches(t *testing.T) {
	ts := startBroker(t, Options{})
	plain := ts.dial("plain")
	plain.subscribe("news", nil)
	batched := ts.dialBatched("batched")
	batched.subscribe("news", nil)

	t.Run("a batching client may send several objects a frame, one a line",
		func(t *testing.T) {
			batched.sendRaw(websocket.MessageText, []byte(
				`{"type":"publish","topic":"news","payload":1}`+"\n"+
					`{"type":"publish","topic":"news","payload":2}`+"\n\n"+
					`{"type":"ping"}`+"\n"))
			list, _ := batched.objects(3)
			kinds := []string{list[0].Type, list[1].Type, list[2].Type}
			if !slices.Contains(kinds, "pong") {
				t.Fatalf("got %v, want two messages and a pong", kinds)
			}
		})
	t.Run("a client that did not opt in gets one object a frame",
		func(t *testing.T) {
			for _, want := range []string{"1", "2"} {
				if g := plain.expect("message"); string(g.Payload) != want {
					t.Fatalf("payload %s, want %s", g.Payload, want)
				}
			}
		})
	t.Run("a batching client gets runs of deliveries in one frame",
		func(t *testing.T) {
			var frame bytes.Buffer
			for i := range 200 {
				fmt.Fprintf(&frame, `{"type":"publish","topic":"news",`+
					`"payload":%d}`+"\n", i)
			}
			batched.sendRaw(websocket.MessageText, frame.Bytes())
			list, frames := batched.objects(200)
			for i, g := range list {
				if string(g.Payload) != strconv.Itoa(i) {
					t.Fatalf("delivery %d has payload %s", i, g.Payload)
				}
			}
			if frames == len(list) {
				t.Fatalf("200 deliveries came in %d frames, want fewer",
					frames)
			}
			plain.messages(200)
		})
	t.Run("a payload that spans lines reaches a batch on one line",
		func(t *testing.T) {
			// The publisher did not opt in: its frame is one object.
			plain.sendRaw(websocket.MessageText, []byte(
				`{"type":"publish","topic":"news","payload":{`+"\r\n"+
					`  "a": [1,`+"\n"+`2]}}`))
			list, frames := batched.objects(1)
			if frames != 1 || string(list[0].Payload) != `{"a":[1,2]}` {
				t.Fatalf("%d frames, payload %s; want one, compacted",
					frames, list[0].Payload)
			}
			if g := plain.expect("message"); string(g.Payload) !=
				`{"a":[1,2]}` {
				t.Fatalf("plain subscriber got payload %s", g.Payload)
			}
		})
	t.Run("a run of deliveries stops short of maxJoined", func(t *testing.T) {
		// One read's worth of publishes reaches the writer at once: 900
		// of 1 KiB were one frame of 990 KiB, held by the writer whole.
		payload := strconv.Quote(strings.Repeat("x", 1024))
		var frame bytes.Buffer
		for range 900 {
			fmt.Fprintf(&frame, `{"type":"publish","topic":"news",`+
				`"payload":%s}`+"\n", payload)
		}
		batched.sendRaw(websocket.MessageText, frame.Bytes())
		for received := 0; received < 900; {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			_, data, err := batched.ws.Read(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			record(t, false, data)
			if len(data) >= socket.MaxJoined {
				t.Fatalf("a frame of %d bytes, want under %d", len(data),
					socket.MaxJoined)
			}
			received += bytes.Count(data, []byte("\n")) + 1
		}
		plain.messages(900)
	})
	t.Run("a frame of several objects is malformed without the opt-in",
		func(t *testing.T) {
			plain.sendRaw(websocket.MessageText, []byte(
				`{"type":"ping"}`+"\n"+`{"type":"ping"}`))
			plain.expectError("bad_frame")
		})
}

func TestUnacked_MatchesASortedList(t *testing.T) {
	// Random adds (mostly in order, some out of order or repeated),
	// removals (mostly from the front) and filters, against a plain
	// sorted list.
	random := rand.New(rand.NewPCG(1, 2))
	// The deadlines are an hour away: the connection's retry timer, set
	// for the earliest, must not fire on this half-built connection.
	c := &connection{unacked: map[string]*pendingQueue{}}
	s, later := &subscription{}, time.Now().Add(time.Hour)
	c.addPending(pending{subscription: s, message: &Message{},
		deadline: later})
	defer c.retries.Stop()
	q := c.unacked[""]
	q.Remove(0, 1)
	var want []uint64
	next := uint64(1)
	for step := range 20000 {
		switch r := random.IntN(10); {
		case r < 6:
			seq := next
			if random.IntN(8) == 0 && next > 20 {
				seq = next - 1 - uint64(random.IntN(20))
			} else {
				next++
			}
			before := c.inflight
			c.addPending(pending{subscription: s,
				message: &Message{Seq: seq}, deadline: later})
			added := c.inflight > before
			i, found := slices.BinarySearch(want, seq)
			if added == found {
				t.Fatalf("step %d: add(%d) added=%v, but present=%v", step,
					seq, added, found)
			}
			if !found {
				want = slices.Insert(want, i, seq)
			}
		case r == 6:
			everyThird := func(seq uint64) bool { return seq%3 == 0 }
			dropped := q.Drop(func(p pending) bool { return everyThird(p.message.Seq) })
			before := len(want)
			want = slices.DeleteFunc(want, everyThird)
			if dropped != before-len(want) {
				t.Fatalf("step %d: keep dropped %d, want %d", step, dropped,
					before-len(want))
			}
		case len(want) > 0:
			i := 0
			if r == 9 {
				i = random.IntN(len(want))
			}
			j := i + 1 + random.IntN(len(want)-i)
			q.Remove(i, j)
			want = slices.Delete(want, i, j)
		}
		got := make([]uint64, 0, len(want))
		for _, p := range q.Live() {
			got = append(got, p.message.Seq)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: live %v, want %v", step, got, want)
		}
	}
}

func TestBroker_ARefreshToFewerGrantsEndsWhatTheyNoLongerAllow(t *testing.T) {
	ts := startBroker(t, Options{})
	alice := ts.dialWith("alice", Claims{Subscribe: []string{"a/#", "b/#"}})
	alice.subscribe("a/x", nil)
	alice.subscribe("b/y", nil)

	// The refreshed token allows a/# only: b/y ends at once, and says why.
	fewer := Claims{Subscribe: []string{"a/#"}}
	fewer.Subject = "alice"
	fewer.ExpiresAt = jwtTime(time.Now().Add(time.Hour))
	tok, err := fewer.Sign(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	alice.send(map[string]any{"type": "auth", "token": tok})
	alice.expect("authenticated")
	ended := alice.expect("unsubscribed")
	if ended.Topic != "b/y" || ended.Reason == "" {
		t.Fatalf("got %+v, want b/y unsubscribed with a reason", ended)
	}

	// What came after goes to a/x only.
	bob := ts.dial("bob")
	bob.publish("b/y", "revoked", 1, "")
	bob.publish("a/x", "allowed", 1, "")
	if g := alice.expect("message"); g.Topic != "a/x" {
		t.Fatalf("alice got %+v, want only a/x's message", g)
	}
}

// overtaken reads c's frames on one topic after seq after up to seq
// last, acking each delivery, and checks that each seq between came
// once, delivered or announced gone in a skipped frame that counts it,
// and that something was skipped.
func overtaken(t *testing.T, c *client, after, last uint64) {
	t.Helper()
	next, skipped := after+1, false
	for next <= last {
		g := c.next()
		switch {
		case g.Type == "message" && g.Seq == next:
			c.ack(g)
			next++
		case g.Type == "skipped" && g.Seq >= next &&
			g.Missed == g.Seq-next+1:
			next, skipped = g.Seq+1, true
		default:
			t.Fatalf("%s: got %+v, want seq %d or a skip from it", c.name,
				g, next)
		}
	}
	if !skipped {
		t.Fatalf("%s: nothing was skipped", c.name)
	}
}
