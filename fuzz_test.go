package popsub

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/popsub/popsub/wire"
)

// Fuzz targets for the places a stranger's bytes meet the broker's
// logic: frame parsing and topic matching. Their seed corpora run in
// every plain go test; go test -fuzz=FuzzFrame explores further; the hand-written
// frame reader has its own in package wire.

func FuzzFrame(f *testing.F) {
	for _, seed := range wire.SeedFrames {
		f.Add([]byte(seed))
	}
	// The publish rule that reads the frame's times needs only the
	// default options (ready refuses the missing Secret and Store after
	// filling them in).
	opts, _ := Options{}.ready()
	c := &connection{broker: &Broker{opts: opts}}
	f.Fuzz(func(t *testing.T, data []byte) {
		frame, problem := decodeFrame(data)
		if problem.Type != "" {
			return
		}
		wire.ValidFilter(frame.Topic)
		m, problem := newMessage(frame, "")
		if problem.Type != "" {
			return
		}
		// ttl_ms, delay_ms and deliver_at land in the delivery too.
		if times(c, m, frame).Type != "" {
			return
		}

		// Whatever a publisher sent, the delivery built from it must be
		// one line of valid JSON, or batching and clients would break.
		m.Seq, m.Timestamp = 1, 1
		delivery := appendDelivery(nil, m, 1)
		if !json.Valid(delivery) || strings.ContainsRune(string(delivery),
			'\n') {
			t.Fatalf("bad delivery %q from frame %q", delivery, data)
		}
	})
}

func FuzzCovers(f *testing.F) {
	for _, seed := range [][2]string{
		{"a/+/c", "a/b/c"}, {"#", "$sys/x"}, {"a/#", "a"}, {"+", ""},
		{"a//b", "a//b"}, {"$dead/#", "$dead/a/b"}, {"/", "/"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, grant, topic string) {
		wire.Covers(grant, topic)
		if wire.ValidTopic(topic) != "" {
			return
		}

		// Two properties any matcher must keep: a topic covers itself,
		// and # covers every topic that is not the broker's own.
		if !wire.Covers(topic, topic) {
			t.Fatalf("%q does not cover itself", topic)
		}
		if !strings.HasPrefix(topic, "$") && !wire.Covers("#", topic) {
			t.Fatalf("# does not cover %q", topic)
		}
	})
}
