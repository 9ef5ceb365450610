package jetstream

import (
	"testing"

	"github.com/popsub/popsub"
)

// threeBrokers runs three brokers on one JetStream.
func threeBrokers(t *testing.T, opts popsub.Options) (a, b, c *broker) {
	t.Helper()
	url := startNATS(t).ClientURL()
	return startBroker(t, url, opts), startBroker(t, url, opts),
		startBroker(t, url, opts)
}

func TestJetStream_APublishReachesBAndCWithOneSeq(t *testing.T) {
	a, b, c := threeBrokers(t, popsub.Options{})
	// A topic that is no NATS subject: mapped, not refused.
	const topic = "rooms/kitchen.temp *>"
	onB, onC := b.dial("bob"), c.dial("carol")
	onB.subscribe(topic, map[string]any{"last": 0})
	onC.subscribe(topic, map[string]any{"last": 0})
	onC.subscribe("rooms/+", nil)

	publisher := a.dial("alice")
	for i, id := range []string{"m-1", "m-2"} {
		confirm := publisher.publish(topic, id, i)
		if confirm.Seq != uint64(i+1) || confirm.MessageID != id {
			t.Fatalf("confirm %+v, want seq %d id %s", confirm, i+1, id)
		}
	}
	for _, got := range [][]frame{onB.messages(2), onC.messages(4)} {
		for _, m := range got {
			want := map[uint64]string{1: "m-1", 2: "m-2"}[m.Seq]
			if m.MessageID != want || m.Topic != topic {
				t.Fatalf("delivery %+v: want id %s on %q", m, want, topic)
			}
		}
	}
}

func TestJetStream_ReplayAfterLastAndRecoveredAgreeOnEveryBroker(t *testing.T) {
	a, b, c := threeBrokers(t, popsub.Options{MaxMessages: 3})
	publisher := a.dial("alice")
	for i := range 5 {
		publisher.publish("log", "", i)
	}
	for _, br := range []*broker{a, b, c} {
		br.caughtUp("log", 5)
		reader := br.dial("reader")
		sub := reader.subscribe("log", map[string]any{"after": 0})
		if sub.Seq != 5 || sub.Recovered == nil || *sub.Recovered {
			t.Fatalf("after 0: %+v, want head 5 and recovered false", sub)
		}
		if got := seqs(reader.messages(3)); got != "3,4,5" {
			t.Fatalf("after 0 replays %s, want 3,4,5", got)
		}
		reader.subscribe("log", map[string]any{"last": 2})
		if got := seqs(reader.messages(2)); got != "4,5" {
			t.Fatalf("last 2 replays %s, want 4,5", got)
		}
		sub = reader.subscribe("log", map[string]any{"after": 3})
		if sub.Recovered != nil {
			t.Fatalf("after 3: %+v, want recovered", sub)
		}
		if got := seqs(reader.messages(2)); got != "4,5" {
			t.Fatalf("after 3 replays %s, want 4,5", got)
		}
	}
}
