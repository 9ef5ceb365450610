package popsub

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// sharedMemory is a SharedLog kept in memory, for tests of the seam: it
// gives out seqs like a shared log, and the test decides what it feeds.
type sharedMemory struct {
	*memoryStore
	mu   sync.Mutex // one Append gives out a seq at a time
	feed func(*Message)
}

// Append gives m the topic's next seq, keeps it, and answers at once.
// Nothing is fed: the test feeds with put.
func (s *sharedMemory) Append(m *Message,
	done func(seq uint64, duplicate bool, err error)) {
	s.mu.Lock()
	heads, _ := s.Topics()
	seq := heads[m.Topic] + 1
	s.Commit(&Batch{Heads: map[string]uint64{m.Topic: seq}})
	s.mu.Unlock()
	done(seq, false, nil)
}

// Follow keeps the broker's feed.
func (s *sharedMemory) Follow(feed func(*Message)) { s.feed = feed }

// Want needs nothing: the test feeds every topic.
func (s *sharedMemory) Want(string) {}

// Forget has nothing to drop: the test keeps every topic.
func (s *sharedMemory) Forget(string) {}

// A sharedMemory is a SharedLog, or the broker would take it for a Store.
var _ SharedLog = (*sharedMemory)(nil)

// put stores a message at seq, as another broker's publish, and feeds it.
func (s *sharedMemory) put(topic string, seq uint64, id string) {
	m := &Message{Topic: topic, ID: id, Seq: seq, QoS: 0,
		Payload: []byte(`"` + id + `"`)}
	s.Commit(&Batch{Messages: []*Message{m}})
	s.feed(m)
}

func TestBroker_AGapInASharedLogIsSaid(t *testing.T) {
	log := &sharedMemory{memoryStore: newMemoryStore()}
	ts := startBroker(t, Options{Store: log})
	alice, bob, carol := ts.dial("alice"), ts.dial("bob"), ts.dial("carol")
	alice.subscribe("news", nil)
	bob.subscribe("+", nil)

	log.put("news", 1, "n-1")
	alice.expect("message")
	bob.expect("message")

	// Seq 2 was deleted before this broker had it: neither subscriber
	// may go on as if nothing was missing. Alice hears what is gone and
	// goes on; bob's wildcard has no one log to go back to, and is cut
	// off, to subscribe again.
	log.put("news", 3, "n-3")
	if g := alice.expect("skipped"); g.Seq != 2 || g.Missed != 1 {
		t.Fatalf("alice got %+v, want seq 2 skipped", g)
	}
	if g := alice.expect("message"); g.Seq != 3 {
		t.Fatalf("alice got %+v, want seq 3", g)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		_, data, err := bob.ws.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != CloseSlowConsumer {
				t.Fatalf("bob closed with %d, want 4008", code)
			}
			break
		}
		if strings.Contains(string(data), `"n-3"`) {
			t.Fatalf("bob's wildcard got the message past the gap: %s", data)
		}
	}

	// A subscriber resuming after 1 reads on from what the log kept.
	carol.subscribe("news", map[string]any{"after": 1})
	if g := carol.expect("message"); g.Seq != 3 || g.MessageID != "n-3" {
		t.Fatalf("resumed with %+v, want seq 3", g)
	}
}
