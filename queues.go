package popsub

import (
	"cmp"
	"slices"
	"sync"
)

// This file holds the queues the broker keeps: each connection's outbox,
// the frames waiting for its writer, and its unacked tables, the QoS 1
// deliveries waiting for acks; and each topic's index of retained
// messages. popsub.go says why each exists and when it is used; here is
// how each keeps its order and its memory.

// outbox is a connection's queue of frames for its writer, at most limit
// bytes. A channel would be simpler, but it bounds frames rather than
// bytes, and allocates every slot up front, for every idle connection.
// This queue grows with a burst and gives the memory back once drained.
type outbox struct {
	mu      sync.Mutex // guards the fields below
	frames  [][]byte   // queued, oldest first
	bytes   int        // the frames' lengths, added up
	limit   int        // Options.OutboxBytes
	writing bool       // a writer goroutine owns the socket's write side
	write   func()     // the writer: connection.writeLoop
}

// push queues frames, all or none: none if they would take the outbox
// past limit bytes, unless it is empty and they are one frame, which may
// then be as large as a frame can be. The first frames into an idle
// outbox start a writer goroutine.
func (o *outbox) push(frames ...[]byte) bool {
	return o.pushWithin(o.limit, frames...)
}

// pushWithin is push with a lower limit, for a sender that may use only
// part of the outbox.
func (o *outbox) pushWithin(limit int, frames ...[]byte) bool {
	size := 0
	for _, frame := range frames {
		size += len(frame)
	}
	o.mu.Lock()
	if o.bytes+size > limit && (o.bytes > 0 || len(frames) > 1) {
		o.mu.Unlock()
		return false
	}
	o.frames = append(o.frames, frames...)
	o.bytes += size
	idle := !o.writing
	o.writing = true
	o.mu.Unlock()
	if idle {
		go o.write()
	}
	return true
}

// take moves every queued frame into batch, in order, and returns it. An
// empty batch means the outbox is idle: the writer must exit, and the
// next push starts another.
func (o *outbox) take(batch [][]byte) [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	batch = append(batch, o.frames...)
	o.writing = len(batch) > 0
	clear(o.frames)
	o.frames, o.bytes = o.frames[:0], 0
	if cap(o.frames) > 64 {
		o.frames = nil
	}
	return batch
}

// size is how many bytes are queued.
func (o *outbox) size() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// queue is a slice appended to at the back and taken from at the front:
// items[head:] are live. Taking from the front moves head and copies
// nothing. An append that finds the array full first moves the live
// items down to its start if that frees at least half of it, and lets
// the array grow otherwise, so each item is copied a bounded number of
// times and a queue that stays about as long allocates nothing. Deleting
// from the front of a plain slice was simpler, and copied the rest each
// time; reslicing it left the room at the front unused, so appends kept
// allocating new arrays.
type queue[T any] struct {
	items []T
	head  int
}

// live returns the items in the queue, oldest first.
func (q *queue[T]) live() []T {
	return q.items[q.head:]
}

// insert puts v at i among the live items: at the back, usually.
func (q *queue[T]) insert(i int, v T) {
	n := len(q.items) - q.head
	if len(q.items) == cap(q.items) && q.head >= n {
		copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = slices.Insert(q.items, q.head+i, v)
}

// remove drops the live items i to j. An emptied queue starts again at
// the front of its array.
func (q *queue[T]) remove(i, j int) {
	if i == 0 {
		clear(q.items[q.head : q.head+j])
		q.head += j
	} else {
		q.items = slices.Delete(q.items, q.head+i, q.head+j)
	}
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
}

// keep drops the live items for which drop reports true, keeping the
// order of the rest, and returns how many it dropped.
func (q *queue[T]) keep(drop func(T) bool) int {
	live := q.live()
	kept := slices.DeleteFunc(live, drop)
	q.items = q.items[:q.head+len(kept)]
	return len(live) - len(kept)
}

// unacked is one topic's pending deliveries on one connection, in seq
// order. Deliveries mostly come in order and are acked in it, so it is a
// queue: acks take from its front, and new deliveries go on its back.
type unacked struct {
	queue[pending]
}

// add puts p in seq order and returns where it went, and whether it was
// new: the same message already pending is replaced, not added, as the
// connection owes one ack for it.
func (q *unacked) add(p pending) (*pending, bool) {
	live := q.live()
	i := len(live)
	if i > 0 && live[i-1].message.Seq >= p.message.Seq {
		// Out of order (a replay), or the same message again.
		var found bool
		i, found = slices.BinarySearchFunc(live, p.message.Seq, bySeq)
		if found {
			live[i] = p
			return &live[i], false
		}
	}
	q.insert(i, p)
	return &q.live()[i], true
}

// bySeq compares a pending delivery with a seq, for binary searches.
func bySeq(p pending, seq uint64) int {
	return cmp.Compare(p.message.Seq, seq)
}
