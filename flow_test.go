package popsub

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// This file tests flow control under bursts and floods, over real
// WebSockets: publishers that outrun the disk wait, subscribers that
// read are never cut off, and one that stops reading costs a bounded
// amount of memory and is cut off.

// burstRuns is how many times TestBroker_BurstWithAStuckSubscriber runs
// its burst: once in the test command, ten times where CI runs it by
// name, to catch a rare ordering.
var burstRuns = flag.Int("burst.runs", 1, "runs of the burst test")

func TestBroker_BurstWithAStuckSubscriber(t *testing.T) {
	const total, size, bound = 20_000, 1024, 256 << 10
	runs := *burstRuns
	for run := range runs {
		t.Run(fmt.Sprintf("run %d", run+1), func(t *testing.T) {
			// The log keeps the whole burst, so a reader that falls
			// behind its outbox can always catch up from it.
			ts := startBrokerSmallBuffers(t, Options{OutboxBytes: bound,
				MaxMessages: total, WriteTimeout: time.Second})
			stuck, fast := ts.dialStuck("stuck"), ts.dial("fast")
			publisher := ts.dial("publisher")
			stuck.subscribe("burst", nil)
			fast.subscribe("burst", nil)
			peak := watchOutboxes(t, ts.broker)

			// Open loop: the publisher never waits for a subscriber.
			payload := `"` + strings.Repeat("x", size) + `"`
			go func() {
				for range total {
					frame := `{"type":"publish","topic":"burst",` +
						`"payload":` + payload + `}`
					err := publisher.ws.Write(context.Background(),
						websocket.MessageText, []byte(frame))
					if err != nil {
						return
					}
				}
			}()
			for i := range total {
				if g := fast.expect("message"); g.Seq != uint64(i+1) {
					t.Fatalf("fast got seq %d, want %d", g.Seq, i+1)
				}
			}
			fast.quiet()
			waitFor(t, func() bool { return ts.connected("stuck") == 0 },
				"the stuck subscriber to be cut off")
			if p := peak(); p > bound+size+256 {
				t.Fatalf("an outbox held %d bytes, bound %d", p, bound)
			}
		})
	}
}

func TestBroker_FloodsAreBounded(t *testing.T) {
	// The bound covers the whole test process, clients included, in
	// live heap grown during the flood: what the broker keeps by design
	// (the log's 64 MiB, an outbox, the log's queue) and some room, far
	// under what an unbounded queue reached (gigabytes). An outbox of a
	// gigabyte grew it by 230 MiB in two seconds.
	const heapBound = 128 << 20
	cases := []struct {
		name string
		size int
		qos  int
	}{
		{"QoS 0, 64-byte payloads", 64, 0},
		{"QoS 0, 512 KiB payloads", 512 << 10, 0},
		{"QoS 1, confirms never read", 64, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := startBrokerSmallBuffers(t, Options{WriteTimeout: time.Second})
			stuck := ts.dialStuck("stuck")
			stuck.subscribe("flood", nil)
			flooder, bystander := ts.dial("flooder"), ts.dial("bystander")
			heap := watchHeap(t)

			// The flood runs for two seconds; the bystander publishes on
			// another topic in the middle of it, and is confirmed.
			ctx, cancel := context.WithTimeout(context.Background(),
				2*time.Second)
			defer cancel()
			var sent atomic.Int64
			go flood(ctx, flooder, tc.size, tc.qos, &sent)
			time.Sleep(500 * time.Millisecond)
			g := bystander.publish("calm", "still here", 1, "")
			if g.Seq != 1 {
				t.Fatalf("bystander confirmed at seq %d, want 1", g.Seq)
			}
			<-ctx.Done()
			if sent.Load() == 0 {
				t.Fatal("the flood sent nothing")
			}
			if p := heap(); p > heapBound {
				t.Fatalf("heap grew by %d MiB, bound %d MiB", p>>20,
					heapBound>>20)
			}
			t.Logf("flood sent %d publishes; heap grew by %d MiB",
				sent.Load(), heap()>>20)
		})
	}
}

// flood publishes to "flood" as fast as the broker reads, until ctx ends.
func flood(ctx context.Context, c *client, size, qos int,
	sent *atomic.Int64) {
	frame := []byte(fmt.Sprintf(`{"type":"publish","topic":"flood",`+
		`"qos":%d,"payload":"%s"}`, qos, strings.Repeat("x", size)))
	for ctx.Err() == nil {
		if c.ws.Write(ctx, websocket.MessageText, frame) != nil {
			return
		}
		sent.Add(1)
	}
}

// watchHeap samples the heap the process keeps alive until the test
// ends, as each garbage collection finds it (runtime/metrics'
// /gc/heap/live:bytes), and returns a function that reports the most it
// grew above where it was, after a collection, when it began. The heap
// in use would count garbage no collection has reached yet: under a
// flood of 512 KiB messages that is as large as what is live, and how
// large depends on when the collector runs, not on what the broker keeps.
func watchHeap(t *testing.T) func() uint64 {
	var peak atomic.Uint64
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	live := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	runtime.GC()
	start := live()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if l := live(); l > peak.Load() {
				peak.Store(l)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return func() uint64 { return peak.Load() - min(peak.Load(), start) }
}

// floodGate is a memoryStore whose commits holding a message of topic
// "flood" wait for gate to close, and which keeps, in commit order, the
// topics of each batch.
type floodGate struct {
	*memoryStore
	gate    chan struct{} // closed to let flood commits through
	waiting chan struct{} // signalled as a flood commit waits
	mu      sync.Mutex
	batches [][]string
}

func (s *floodGate) Commit(batch *Batch) error {
	var topics []string
	for _, m := range batch.Messages {
		if !slices.Contains(topics, m.Topic) {
			topics = append(topics, m.Topic)
		}
	}
	if slices.Contains(topics, "flood") {
		select {
		case s.waiting <- struct{}{}:
		default:
		}
		<-s.gate
	}
	s.mu.Lock()
	s.batches = append(s.batches, topics)
	s.mu.Unlock()
	return s.memoryStore.Commit(batch)
}

func TestBroker_AConfirmDoesNotWaitForAFloodOnAnotherTopic(t *testing.T) {
	store := &floodGate{memoryStore: newMemoryStore(),
		gate: make(chan struct{}), waiting: make(chan struct{}, 1)}
	ts := startBroker(t, Options{Store: store})
	flood, quiet := ts.dial("flood"), ts.dial("quiet")
	// published waits until the broker has given n messages their seqs.
	published := func(n uint64) {
		for deadline := time.Now().Add(10 * time.Second); ; {
			if got, _, _ := ts.broker.Counted(); got >= n {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("%d messages published after 10 s, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// A topic's first publish waits for its seqs to be reserved on disk:
	// the quiet topic has had one.
	quiet.publish("quiet", "first", 1, "")

	// The flood's first commit waits at the gate, and the next batch
	// fills behind it: 200 KiB of flood, then a QoS 1 publish on the
	// quiet topic.
	flood.publish("flood", "first", 0, "")
	select {
	case <-store.waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the flood's first commit never came")
	}
	payload := strings.Repeat("x", 1000)
	for range 200 {
		flood.publish("flood", payload, 0, "")
	}
	published(202)
	quiet.send(map[string]any{"type": "publish", "topic": "quiet",
		"payload": "hello", "qos": 1})
	published(203)

	// The gate opens: the quiet topic's batch commits before the flood's,
	// and nothing is lost.
	close(store.gate)
	quiet.expect("published")
	flood.publish("flood", "last", 1, "")
	store.mu.Lock()
	defer store.mu.Unlock()
	flooded := slices.IndexFunc(store.batches, func(topics []string) bool {
		return slices.Contains(topics, "flood")
	})
	if len(store.batches) < flooded+3 || !slices.Equal(
		store.batches[flooded+1], []string{"quiet"}) ||
		!slices.Contains(store.batches[flooded+2], "flood") {
		t.Fatalf("batches by topic %v, want the quiet one second, alone",
			store.batches)
	}
	stored, _ := store.Read("flood", 0, 1000, 1<<30)
	if n := len(stored); n != 202 {
		t.Fatalf("%d flood messages stored, want 202", n)
	}
}
