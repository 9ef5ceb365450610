package popsub

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/popsub/popsub/wire"
)

// These tests hold popsub.go's dead letters to protocol.md: a delivery
// that runs out of retries is never dropped. Its letter reaches
// $dead/<topic> whatever the topic's name, once, restart or not, and a
// letter the log refuses leaves the delivery pending.

// readsDeadLetters are the grants of an operator who reads dead letters.
var readsDeadLetters = Claims{Subscribe: []string{"#", "$dead/#"}}

// signed signs claims for sub, valid for a day.
func signed(t *testing.T, sub string, claims Claims) string {
	t.Helper()
	claims.Subject, claims.ExpiresAt = sub, jwtTime(time.Now().Add(
		24*time.Hour))
	token, err := claims.Sign(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func TestDeadLetters_EveryTopicHasRoomForItsDeadLetters(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: 100 * time.Millisecond,
		MaxRetries: -1})
	operator := ts.dialWith("operator", readsDeadLetters)
	worker, publisher := ts.dial("worker"), ts.dial("publisher")
	for _, size := range []int{250, 251, wire.MaxTopicBytes} {
		topic := "t/" + strings.Repeat("x", size-2)
		operator.subscribe("$dead/"+topic, nil)
		worker.subscribe(topic, map[string]any{"durable": "d"})
		publisher.publish(topic, size, 1, "")
		worker.expect("message")

		dead := operator.expect("message")
		var letter wire.DeadLetter
		json.Unmarshal(dead.Payload, &letter)
		if dead.Topic != "$dead/"+topic || letter.Topic != topic {
			t.Fatalf("a topic of %d bytes: dead letter on %d bytes, of %q",
				size, len(dead.Topic), letter.Topic)
		}
		operator.ack(dead)
	}
	publisher.send(map[string]any{"type": "publish", "topic": "t/" +
		strings.Repeat("x", wire.MaxTopicBytes-1), "payload": 1})
	publisher.expectError("invalid_topic")
}

// refusingStore is a memoryStore that refuses every batch with a
// message to $dead/ while refuse is set, as a full disk would.
type refusingStore struct {
	*memoryStore
	refuse atomic.Bool
}

// Commit commits batch unless it holds a dead letter and refuse is set.
func (s *refusingStore) Commit(batch *Batch) error {
	for _, m := range batch.Messages {
		if s.refuse.Load() && strings.HasPrefix(m.Topic, deadPrefix) {
			return errors.New("disk full")
		}
	}
	return s.memoryStore.Commit(batch)
}

func TestDeadLetters_ALetterTheLogRefusesLeavesTheDeliveryPending(
	t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &refusingStore{memoryStore: newMemoryStore()}
		store.refuse.Store(true)
		ps := startPipeBroker(t, Options{Store: store,
			AckTimeout: time.Second, MaxRetries: -1})
		defer ps.stop()
		worker, publisher := ps.dialAs("worker"), ps.dialAs("publisher")
		worker.subscribe("jobs", map[string]any{"durable": "d"})
		publisher.publish("jobs", 1, 1, "job")
		worker.expect("message")

		// The disk refuses the letter: the delivery stays pending, and
		// the cursor behind it.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := pendingCount(ps.broker); n != 1 {
			t.Fatalf("after a refused dead letter %d deliveries are "+
				"pending, want 1", n)
		}
		msgs, _ := store.Read("$dead/jobs", 0, 10, 1<<20)
		if len(msgs) != 0 {
			t.Fatalf("$dead/jobs holds %d letters on a full disk", len(msgs))
		}

		// With room again, the next try stores it, once.
		store.refuse.Store(false)
		time.Sleep(time.Minute)
		synctest.Wait()
		if msgs, _ := store.Read("$dead/jobs", 0, 10, 1<<20); len(msgs) != 1 {
			t.Fatalf("$dead/jobs holds %d letters, want 1", len(msgs))
		}
		if n := pendingCount(ps.broker); n != 0 {
			t.Fatalf("%d deliveries still pending, want none", n)
		}
	})
}

// deadEvents counts the dead_lettered events of every broker it is
// given to, by message_id.
type deadEvents struct {
	mu     sync.Mutex
	counts map[string]int
}

// watch is an Options.OnEvent that counts.
func (d *deadEvents) watch(e wire.Event) {
	if e.Kind == "dead_lettered" {
		d.mu.Lock()
		d.counts[e.MessageID]++
		d.mu.Unlock()
	}
}

// count is how many dead_lettered events id had.
func (d *deadEvents) count(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[id]
}

// Killed right after a dead letter (the letter stored, the durable
// cursor's move past it not yet), the broker makes the letter again for
// the resumed subscriber: it is a duplicate, stored once and said once.
func TestDeadLetters_AKillRightAfterALetterStoresItAndSaysItOnce(
	t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		events := &deadEvents{counts: map[string]int{}}
		opts := Options{AckTimeout: time.Second, MaxRetries: -1,
			FeatureOptions: FeatureOptions{OnEvent: events.watch},
		}
		d := newDisk()
		opts.Store = d
		ps := startPipeBroker(t, opts)
		worker, publisher := ps.dialAs("worker"), ps.dialAs("publisher")
		worker.subscribe("jobs", map[string]any{"durable": "d"})
		publisher.publish("jobs", 1, 1, "job")
		worker.expect("message")

		// Killed the moment the letter is said: its commit is done, the
		// cursor's move, queued after it, is not.
		for events.count("job") == 0 {
			time.Sleep(time.Millisecond)
		}
		d = ps.crash(d)
		opts.Store = d
		ps = startPipeBroker(t, opts)
		defer ps.stop()
		worker = ps.dialAs("worker")
		worker.subscribe("jobs", map[string]any{"durable": "d"})
		if g := worker.expect("message"); g.MessageID != "job" {
			t.Fatalf("resumed with %+v, want job again", g)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if msgs, _ := d.Read("$dead/jobs", 0, 10, 1<<20); len(msgs) != 1 {
			t.Fatalf("$dead/jobs holds %d letters, want 1", len(msgs))
		}
		if n := events.count("job"); n != 1 {
			t.Fatalf("%d dead_lettered events for job, want 1", n)
		}
	})
}
