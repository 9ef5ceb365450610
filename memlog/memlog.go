// Package memlog keeps a log in memory: the one in-memory engine of
// PopSub, under the broker's tests (as a Store) and under the lab's disk
// (as the contents a sync leaves, and a power cut keeps).
//
// A store is also a popsub.DueIndex, as boltstore is: Due and Waiting
// find the records that wait in the $delayed logs, here by looking at
// every record, so that the broker's tests run that path.
//
// A batch applies as popsub.Batch says: the topics it forgets are
// deleted whole, raising the floor; its messages are appended, each
// deleting the record of another log it names (a delayed message's, sent
// when due), then the trims and single deletes, then the heads, the
// reserve and the cursors. A store is a popsub.Forgetter. Reads return
// what the log holds after a seq, within a count and a number of payload
// bytes, as a disk's would.
//
// It is generic over the message, as package groupcommit is, so that
// package popsub's own tests can use it: a package that imported popsub
// could not be imported by them.
package memlog

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"sync"

	"github.com/popsub/popsub/groupcommit"
)

// Record is what the log needs to know of a message: where it goes, the
// bytes of its payload, and the record it deletes as it is stored
// (Releases, at Released), if any; and, for a message that waits to be
// sent (only such a message has a DeliverAt), when it is due, in Unix
// ms, and its publisher and id, by which Due and Waiting find it.
type Record struct {
	Topic     string
	Seq       uint64
	Size      int
	Releases  string
	Released  uint64
	DeliverAt int64
	Publisher string
	ID        string
}

// Contents are a log's topics, each topic's head, the durable cursors,
// the floor (the highest head forgotten) and the reserve: what a batch
// leaves. A topic made again starts past both. The zero value is not
// usable: make one with NewContents.
type Contents[M any] struct {
	Logs    map[string][]M
	Heads   map[string]uint64
	Cursors map[string]uint64
	Floor   uint64
	Reserve uint64
	record  func(M) Record
}

// NewContents returns empty contents of messages that record describes.
func NewContents[M any](record func(M) Record) Contents[M] {
	return Contents[M]{Logs: map[string][]M{}, Heads: map[string]uint64{},
		Cursors: map[string]uint64{}, record: record}
}

// Clone copies c; the messages are shared, as they never change.
func (c Contents[M]) Clone() Contents[M] {
	d := NewContents(c.record)
	for topic, log := range c.Logs {
		d.Logs[topic] = slices.Clone(log)
	}
	maps.Copy(d.Heads, c.Heads)
	maps.Copy(d.Cursors, c.Cursors)
	d.Floor, d.Reserve = c.Floor, c.Reserve
	return d
}

// Apply applies b. keepHeads false drops the heads and the reserve b
// sets, as the lab's broker without reservations does.
func (c *Contents[M]) Apply(b *groupcommit.Batch[M], keepHeads bool) {
	for topic, head := range b.Forgets {
		delete(c.Logs, topic)
		delete(c.Heads, topic)
		c.Floor = max(c.Floor, head)
	}
	for _, m := range b.Messages {
		r := c.record(m)
		c.Logs[r.Topic] = append(c.Logs[r.Topic], m)
		c.Heads[r.Topic] = max(c.Heads[r.Topic], r.Seq)
		if r.Released != 0 {
			c.Logs[r.Releases] = slices.DeleteFunc(c.Logs[r.Releases],
				func(m M) bool { return c.record(m).Seq == r.Released })
		}
	}
	for topic, upTo := range b.Trims {
		c.Logs[topic] = slices.DeleteFunc(c.Logs[topic],
			func(m M) bool { return c.record(m).Seq <= upTo })
	}
	for topic, seqs := range b.Deletes {
		c.Logs[topic] = slices.DeleteFunc(c.Logs[topic],
			func(m M) bool { return slices.Contains(seqs, c.record(m).Seq) })
	}
	if keepHeads {
		maps.Copy(c.Heads, b.Heads)
		if b.Reserve != nil {
			c.Reserve = *b.Reserve
		}
	}
	maps.Copy(c.Cursors, b.Cursors)
}

// Read returns up to limit messages of topic after seq after, and no
// more once their payloads pass maxBytes.
func (c Contents[M]) Read(topic string, after uint64, limit,
	maxBytes int) []M {
	var out []M
	size := 0
	for _, m := range c.Logs[topic] {
		if len(out) == limit || size >= maxBytes {
			break
		}
		if r := c.record(m); r.Seq > after {
			out = append(out, m)
			size += r.Size
		}
	}
	return out
}

// Store is Contents behind a lock, as a Store: every commit is on its
// "disk" at once, and the store lives as long as the process.
type Store[M any] struct {
	mu       sync.Mutex
	contents Contents[M]
	closed   bool
}

// New returns an empty store of messages that record describes.
func New[M any](record func(M) Record) *Store[M] {
	return &Store[M]{contents: NewContents(record)}
}

// ErrClosed is what a commit to a closed store gets.
var ErrClosed = errors.New("memlog: store closed")

// Commit applies batch.
func (s *Store[M]) Commit(batch *groupcommit.Batch[M]) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.contents.Apply(batch, true)
	return nil
}

// Read returns up to limit messages of topic after seq after.
func (s *Store[M]) Read(topic string, after uint64, limit,
	maxBytes int) ([]M, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contents.Read(topic, after, limit, maxBytes), nil
}

// Topics returns each topic's head.
func (s *Store[M]) Topics() (map[string]uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.contents.Heads), nil
}

// Floor returns the highest head of a topic the store forgot, or the
// reserve if that is higher.
func (s *Store[M]) Floor() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.contents.Floor, s.contents.Reserve), nil
}

// CursorKeys returns the key of every cursor stored.
func (s *Store[M]) CursorKeys() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.contents.Cursors)), nil
}

// Cursor returns a durable cursor's position, if one is stored.
func (s *Store[M]) Cursor(key string) (uint64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	position, ok := s.contents.Cursors[key]
	return position, ok, nil
}

// Due calls found for each waiting record due by until (Unix ms),
// earliest first, at most n of them: what a disk's index by due time
// would find, found here by looking at every record.
func (s *Store[M]) Due(until int64, n int,
	found func(log string, seq uint64, at int64)) error {
	s.mu.Lock()
	var due []Record
	for _, msgs := range s.contents.Logs {
		for _, m := range msgs {
			if r := s.contents.record(m); r.DeliverAt != 0 &&
				r.DeliverAt <= until {
				due = append(due, r)
			}
		}
	}
	s.mu.Unlock()
	slices.SortFunc(due, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.DeliverAt, b.DeliverAt),
			cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Topic, b.Topic))
	})
	for _, r := range due[:min(n, len(due))] {
		found(r.Topic, r.Seq, r.DeliverAt)
	}
	return nil
}

// Waiting returns the seq of the record in log that publisher sent
// with id, if log holds one.
func (s *Store[M]) Waiting(log, publisher, id string) (uint64, bool,
	error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.contents.Logs[log] {
		if r := s.contents.record(m); r.Publisher == publisher && r.ID == id {
			return r.Seq, true, nil
		}
	}
	return 0, false, nil
}

// Close refuses every commit from now on; reads go on.
func (s *Store[M]) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// Copy returns an open store holding what s holds: the disk a restarted
// broker finds.
func (s *Store[M]) Copy() *Store[M] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &Store[M]{contents: s.contents.Clone()}
}
