package popsub

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
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
	dave := ts.dial("dave")
	alice.subscribe("news", nil)
	bob.subscribe("+", nil)
	dave.subscribe("news", nil)
	dave.subscribe("#", nil)

	log.put("news", 1, "n-1")
	alice.expect("message")
	bob.expect("message")
	dave.expect("message")
	dave.expect("message")

	// Seq 2 was deleted before this broker had it: no subscriber may go
	// on as if nothing was missing. Alice hears what is gone from her
	// replay and goes on; bob's wildcard has no one log to go back to,
	// and hears it at once, naming the topic and, as filter, itself.
	log.put("news", 3, "n-3")
	if g := alice.expect("skipped"); g.Seq != 2 || g.Missed != 1 ||
		g.Filter != "" {
		t.Fatalf("alice got %+v, want seq 2 skipped", g)
	}
	if g := alice.expect("message"); g.Seq != 3 {
		t.Fatalf("alice got %+v, want seq 3", g)
	}
	g := bob.expect("skipped")
	if g.Topic != "news" || g.Seq != 2 || g.Missed != 1 || g.Filter != "+" {
		t.Fatalf("bob got %+v, want seq 2 of news skipped, for +", g)
	}
	if g := bob.expect("message"); g.Seq != 3 || g.MessageID != "n-3" {
		t.Fatalf("bob got %+v, want seq 3", g)
	}

	// Dave, with the topic and a wildcard on one connection, hears the
	// gap once for each, before either subscription's next message.
	var frames []string
	for range 4 {
		g := dave.next()
		frames = append(frames, fmt.Sprintf("%s %d %q", g.Type, g.Seq,
			g.Filter))
	}
	if !strings.HasPrefix(frames[0], "skipped") ||
		!slices.Equal(slices.Sorted(slices.Values(frames)), []string{
			`message 3 ""`, `message 3 ""`, `skipped 2 ""`,
			`skipped 2 "#"`}) {
		t.Fatalf("dave got %q, want the gap said for news and for #, "+
			"each before seq 3", frames)
	}

	// Nobody was cut off: the next message reaches all of them.
	log.put("news", 4, "n-4")
	for _, c := range []*client{alice, bob, dave, dave} {
		if g := c.expect("message"); g.Seq != 4 {
			t.Fatalf("%s got %+v, want seq 4", c.name, g)
		}
	}

	// A subscriber resuming after 1 reads on from what the log kept.
	carol.subscribe("news", map[string]any{"after": 1})
	if g := carol.expect("message"); g.Seq != 3 || g.MessageID != "n-3" {
		t.Fatalf("resumed with %+v, want seq 3", g)
	}
}
