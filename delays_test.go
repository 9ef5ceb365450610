package popsub

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"
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
			late < 0 || late > RetryInterval(DefaultAckTimeout) {
			t.Fatalf("got %+v %v after it was due, want later at seq 2 "+
				"within a retry tick", g, late)
		}

		// Sent, it leaves $delayed/jobs, and is not sent again.
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if d := b.topic("$delayed/jobs"); len(d.index.Live()) != 0 {
			t.Fatalf("$delayed/jobs still holds %d", len(d.index.Live()))
		}
		if head := b.topic("jobs").headNow(); head != 2 {
			t.Fatalf("jobs head = %d, want 2: sent once", head)
		}
		worker.handle([]byte(`{"type":"ack","topic":"jobs","seq":2}`))
	})
}

func TestDelay_SurvivesARestartAndIsSentOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &crashingStore{memoryStore: newMemoryStore()}
		opts := Options{Secret: testSecret, Logger: quietLogger,
			Store: store, PingInterval: time.Hour}
		b, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		publisher, wake := fakeConnection(b, "publisher")
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":1,"qos":1,"message_id":"first","delay_ms":2000}`))
		publisher.handle([]byte(`{"type":"publish","topic":"jobs",` +
			`"payload":2,"qos":1,"message_id":"second",` +
			`"deliver_at":` + jsonTime(time.Now().Add(time.Hour)) + `}`))
		nextFrame(t, publisher, wake)
		nextFrame(t, publisher, wake)

		// The first is sent; a crash loses the $delayed log's trim, and
		// the broker is down when the second falls due.
		store.loseTrims.Store(true)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		b.unregister(publisher)
		b.Shutdown(context.Background())
		store.loseTrims.Store(false)
		time.Sleep(2 * time.Hour)

		// After the restart the second goes at the first look; the first,
		// sent again, is the duplicate jobs stores once.
		b, err = New(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Shutdown(context.Background())
		time.Sleep(time.Second)
		synctest.Wait()
		msgs, _ := store.Read("jobs", 0, 10, 1<<20)
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.ID)
		}
		if len(ids) != 2 || ids[0] != "first" || ids[1] != "second" {
			t.Fatalf("jobs holds %v, want first and second, once each", ids)
		}
	})
}

// jsonTime is t in Unix milliseconds, as JSON.
func jsonTime(t time.Time) string {
	data, _ := json.Marshal(t.UnixMilli())
	return string(data)
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
