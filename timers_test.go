package popsub

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/popsub/popsub/playground"
	"github.com/popsub/popsub/wire"
)

// A retry comes when it is due, within RetryWindow, however many
// deliveries wait for theirs: 1, 1,000 and 100,000 unacked at once, a
// thousand to a connection, their deadlines a millisecond apart. In
// fake time the broker's own work takes none, so what is measured is
// when each timer fired.
func TestRetries_FireWithinTheirWindowAtEveryScale(t *testing.T) {
	for _, pending := range []int{1, 1000, 100_000} {
		t.Run(fmt.Sprint(pending, " pending"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				firesWithinTheWindow(t, pending)
			})
		})
	}
}

// firesWithinTheWindow delivers waiting QoS 1 messages, a thousand to a
// connection at the most, acks none, and checks each one's retry
// against its deadline.
func firesWithinTheWindow(t *testing.T, waiting int) {
	perConnection := min(waiting, 1000)
	b, first, _ := fakeBroker(t, Options{MaxInflight: perConnection,
		MaxMessages: perConnection})
	workers := []*connection{first}
	for i := 1; i < waiting/perConnection; i++ {
		w, _ := fakeConnection(b, fmt.Sprint("worker-", i))
		w.handle([]byte(`{"type":"subscribe","topic":"jobs"}`))
		workers = append(workers, w)
		t.Cleanup(func() { b.unregister(w) })
	}
	synctest.Wait()
	for _, w := range workers {
		w.outbox.Take(nil) // the subscribed replies
	}

	// A publish a millisecond: each delivery's deadline, an ack timeout
	// after it, falls a millisecond after the one before.
	due := map[uint64]time.Time{}
	for i := range perConnection {
		b.publish(&Message{Topic: "jobs", ID: fmt.Sprint("j", i), QoS: 1,
			Payload: json.RawMessage(`1`)}, nil, nil)
		synctest.Wait()
		for _, w := range workers {
			for _, f := range w.outbox.Take(nil) {
				var g got
				json.Unmarshal(f, &g)
				due[g.Seq] = time.Now().Add(DefaultAckTimeout)
			}
		}
		time.Sleep(time.Millisecond)
	}
	if len(due) != perConnection {
		t.Fatalf("%d first deliveries, want %d", len(due), perConnection)
	}
	last := due[uint64(perConnection)]

	// A millisecond at a time through the ack timeout and a window
	// past it: each retry is taken the moment it is written.
	retried, worst := 0, time.Duration(0)
	for end := last.Add(2 * RetryWindow); time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		synctest.Wait()
		for _, w := range workers {
			for _, f := range w.outbox.Take(nil) {
				var g got
				json.Unmarshal(f, &g)
				late := time.Since(due[g.Seq])
				if g.Attempt != 2 || late < 0 || late > RetryWindow {
					t.Fatalf("seq %d: attempt %d %v after its deadline, "+
						"want attempt 2 within %v", g.Seq, g.Attempt, late,
						RetryWindow)
				}
				retried, worst = retried+1, max(worst, late)
			}
		}
	}
	if retried != waiting {
		t.Fatalf("%d retries, want %d", retried, waiting)
	}
	t.Logf("%d retries, the latest %v after its deadline", retried, worst)
}

// A delayed message is sent when it falls due, within 10 ms, with 1,
// 1,000 and 100,000 waiting: the release loop's timer is set for the
// earliest, and nothing walks the rest.
func TestDelay_SentWithinTenMillisecondsAtEveryScale(t *testing.T) {
	for _, waiting := range []int{1, 1000, 100_000} {
		t.Run(fmt.Sprint(waiting, " waiting"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// On bbolt: the tests' store in memory finds a record by
				// walking its topic, which 100,000 releases make slow.
				b, worker, _ := fakeBroker(t, Options{
					MaxMessages: waiting,
					Store: openBolt(t, filepath.Join(t.TempDir(),
						"popsub.db")),
					FeatureOptions: FeatureOptions{MaxDelayed: waiting,
						MaxDelayedBytes: 1 << 30},
				})
				publisher, _ := fakeConnection(b, "publisher")
				t.Cleanup(func() { b.unregister(publisher) })
				// Due over one second, a second on: a millisecond apart at
				// 1,000, a hundred a millisecond at 100,000. The confirms
				// are taken as they come.
				for i := range waiting {
					publisher.handle(fmt.Appendf(nil, `{"type":"publish",`+
						`"topic":"jobs","qos":1,"payload":%d,`+
						`"delay_ms":%d}`, i, 1000+i*1000/waiting))
					if i%1000 == 999 {
						synctest.Wait()
						publisher.outbox.Take(nil)
					}
				}
				sent := 0
				worst := sentWhenDue(t, worker, func(g got) {
					sent++
					worker.handle(fmt.Appendf(nil, `{"type":"ack",`+
						`"topic":"jobs","seq":%d}`, g.Seq))
				})
				if sent != waiting {
					t.Fatalf("%d sent, want %d", sent, waiting)
				}
				t.Logf("%d sent, the latest %v after it was due", sent, worst)
			})
		})
	}
}

// A delivery nobody acks becomes a dead letter within the span the
// playground's step 4 states (playground.Settings.DeadAfter) for the
// defaults: six waits from 5 s, doubling up to a minute, each less up
// to a fifth, and a RetryWindow late at most.
func TestDeadLetters_ComeWhenThePlaygroundSays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		dead := map[string]time.Time{}
		b, worker, _ := fakeBroker(t, Options{
			FeatureOptions: FeatureOptions{OnEvent: func(e wire.Event) {
				if e.Kind == "dead_lettered" {
					mu.Lock()
					dead[e.MessageID] = time.Now()
					mu.Unlock()
				}
			}},
		})
		start := time.Now()
		const n = 20 // seqs 1 to 20, each with its own jitter
		for i := range n {
			b.publish(&Message{Topic: "jobs", ID: fmt.Sprint("j", i),
				QoS: 1, Payload: json.RawMessage(`1`)}, nil, nil)
		}
		for range 4 * time.Minute / time.Second {
			time.Sleep(time.Second)
			synctest.Wait()
			worker.outbox.Take(nil) // read, never acked
		}
		least, most := playground.Settings{AckTimeout: DefaultAckTimeout,
			MaxRetries: DefaultMaxRetries, RetryBackoff: DefaultRetryBackoff,
			MaxRetryDelay: DefaultMaxRetryDelay}.DeadAfter()
		most += time.Duration(DefaultMaxRetries+1) * RetryWindow
		mu.Lock()
		defer mu.Unlock()
		if len(dead) != n {
			t.Fatalf("%d dead letters, want %d", len(dead), n)
		}
		for id, at := range dead {
			if took := at.Sub(start); took < least || took > most {
				t.Errorf("%s dead after %v, want %v to %v", id, took,
					least, most)
			}
		}
	})
}

// A delayed message due before its record is on disk is sent as soon as
// the record is, not a second later: a delay of a millisecond, on a
// store whose commits take three.
func TestDelay_DueBeforeItsRecordIsOnDiskIsSentOnceItIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := slowCommits{newMemoryStore(), 3 * time.Millisecond}
		b, worker, _ := fakeBroker(t, Options{Store: store})
		publisher, _ := fakeConnection(b, "publisher")
		t.Cleanup(func() { b.unregister(publisher) })
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"qos":1,"payload":1,"delay_ms":1}`))
		sent := 0
		sentWhenDue(t, worker, func(got) { sent++ })
		if sent != 1 {
			t.Fatalf("%d sent, want 1", sent)
		}
	})
}

// sentWhenDue takes what worker is sent over the next two seconds, a
// millisecond at a time, and hands each delivery to each as it comes. It
// fails the test for one sent more than 10 ms after its deliver_at, and
// returns the latest. It runs in a synctest bubble.
func sentWhenDue(t *testing.T, worker *connection,
	each func(got)) (worst time.Duration) {
	t.Helper()
	return sentWhenDueFor(t, 2*time.Second, worker, each)
}

// sentWhenDueFor is sentWhenDue over span.
func sentWhenDueFor(t *testing.T, span time.Duration, worker *connection,
	each func(got)) (worst time.Duration) {
	t.Helper()
	for end := time.Now().Add(span); time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		synctest.Wait()
		for _, f := range worker.outbox.Take(nil) {
			var g got
			json.Unmarshal(f, &g)
			late := time.Since(time.UnixMilli(g.DeliverAt))
			if late < 0 || late > 10*time.Millisecond {
				t.Fatalf("%s %v after it was due, want within 10 ms", f, late)
			}
			worst = max(worst, late)
			each(g)
		}
	}
	return worst
}

// slowCommits is a store in memory whose every commit takes a while.
type slowCommits struct {
	*memoryStore
	took time.Duration
}

// Commit waits, then commits batch.
func (s slowCommits) Commit(batch *Batch) error {
	time.Sleep(s.took)
	return s.memoryStore.Commit(batch)
}
