package popsub

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
)

// Benchmarks for the hot paths. Speed is measured here and with popsub
// bench, never asserted in tests: these machines are shared and noisy.
// docs/performance.md records what they showed.

func BenchmarkDecodeFrame(b *testing.B) {
	data := []byte(`{"type":"publish","topic":"bench/0","qos":1,` +
		`"payload":{"p":0,"n":123,"t":1795997686774000000,"x":"xxxxxxxx"}}`)
	for b.Loop() {
		decodeFrame(data)
	}
}

func BenchmarkAppendDelivery(b *testing.B) {
	m := &Message{Topic: "bench/0", ID: newID(), Seq: 123456, QoS: 1,
		Timestamp: 1795997686774, Payload: json.RawMessage(
			`{"p":0,"n":123,"t":1795997686774000000,"x":"xxxxxxxx"}`)}
	buffer := make([]byte, 0, 256)
	for b.Loop() {
		buffer = appendDelivery(buffer[:0], m, 1)
	}
}

// BenchmarkFanOut measures one committed message offered to N live
// subscribers: the per-delivery cost without sockets or disk.
func BenchmarkFanOut(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subscribers=%d", n), func(b *testing.B) {
			broker, err := New(Options{Secret: testSecret,
				Store: newMemoryStore(), Logger: quietLogger})
			if err != nil {
				b.Fatal(err)
			}
			defer broker.Shutdown(context.Background())
			t := broker.topic("bench")
			var connections []*connection
			for i := range n {
				c, _ := fakeConnection(broker, fmt.Sprint("s", i))
				defer broker.unregister(c)
				connections = append(connections, c)
				s := c.newSubscription("bench", t, "")
				s.live = true
				t.subscribers[s] = struct{}{}
			}
			m := &Message{Topic: "bench", ID: "id", Seq: 1,
				Payload: json.RawMessage(`"x"`)}
			// Each round also takes the frame out of every outbox, as
			// the writers would.
			var drained [][]byte
			for b.Loop() {
				t.mu.Lock()
				broker.fanOut(t, m, m.Seq-1)
				t.mu.Unlock()
				for _, c := range connections {
					drained = c.outbox.take(drained[:0])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/
				float64(b.N*n), "ns/delivery")
		})
	}
}

// BenchmarkPublishQoS1 measures publishes that wait for their confirm,
// one publisher at a time and 64 at once: group commit lets the 64 share
// each disk sync.
func BenchmarkPublishQoS1(b *testing.B) {
	for _, publishers := range []int{1, 64} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			store, err := OpenBolt(filepath.Join(b.TempDir(), "b.db"),
				quietLogger)
			if err != nil {
				b.Fatal(err)
			}
			broker, err := New(Options{Secret: testSecret, Store: store,
				Logger: quietLogger, MaxMessages: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer broker.Shutdown(context.Background())
			b.SetParallelism(publishers)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := broker.Publish(context.Background(),
						"bench", 1, 1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "confirms/s")
		})
	}
}
