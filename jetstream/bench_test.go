package jetstream

import (
	"fmt"
	"testing"

	"github.com/popsub/popsub"
)

// BenchmarkNewTopic measures what a topic costs on the shared log: its
// first publish makes its stream, lists it, and starts this broker
// following it. The decision (a stream per topic) pays this once per
// topic; BenchmarkPublish is what every later message pays.
func BenchmarkNewTopic(b *testing.B) {
	url := startNATS(b).ClientURL()
	log, err := Open(Options{URL: url, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	log.Follow(func(*popsub.Message) {})
	for i := 0; b.Loop(); i++ {
		appendAndWait(b, log, fmt.Sprint("topic-", i))
	}
}

// BenchmarkPublish measures one publish to an existing topic, answered.
func BenchmarkPublish(b *testing.B) {
	url := startNATS(b).ClientURL()
	log, err := Open(Options{URL: url, Logger: quiet, MaxMessages: 1000})
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	log.Follow(func(*popsub.Message) {})
	appendAndWait(b, log, "topic")
	for b.Loop() {
		appendAndWait(b, log, "topic")
	}
}

// appendAndWait appends one message to topic and waits for its answer.
func appendAndWait(b *testing.B, log *Log, topic string) {
	done := make(chan error, 1)
	log.Append(&popsub.Message{Topic: topic, ID: "x", Payload: []byte(`1`)},
		func(_ uint64, _ bool, err error) { done <- err })
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
