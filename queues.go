package popsub

import (
	"cmp"
	"slices"
	"sync"
)

// This file holds the two queues each connection keeps: its outbox, the
// frames waiting for its writer, and its unacked tables, the QoS 1
// deliveries waiting for acks. popsub.go says why each exists and when it
// is used; here is how each keeps its order and gives memory back.

// outbox is a connection's queue of frames for its writer, at most limit
// long. A channel of that capacity would be simpler, but it allocates
// every slot up front: a thousand of them for every idle connection. This
// queue grows with a burst and gives the memory back once drained.
type outbox struct {
	mu      sync.Mutex // guards the fields below
	frames  [][]byte   // queued, oldest first
	limit   int        // Options.Outbox
	writing bool       // a writer goroutine owns the socket's write side
	write   func()     // the writer: connection.writeLoop
}

// push queues frames, all or none: none if they would overfill the
// outbox. The first frames into an idle outbox start a writer goroutine.
func (o *outbox) push(frames ...[]byte) bool {
	o.mu.Lock()
	if len(o.frames)+len(frames) > o.limit {
		o.mu.Unlock()
		return false
	}
	o.frames = append(o.frames, frames...)
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
	o.frames = o.frames[:0]
	if cap(o.frames) > 64 {
		o.frames = nil
	}
	return batch
}

// size is how many frames are queued.
func (o *outbox) size() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.frames)
}

// unacked is one topic's pending deliveries on one connection, in seq
// order: entries[head:]. Settling the oldest moves head and copies
// nothing. An append that finds the array full first moves the live
// entries down to its start if that frees at least half of it, and lets
// the array grow otherwise, so each entry is copied a bounded number of
// times. Moving the rest down on every ack was simpler, and copied most
// of the window each time: a tenth of QoS 1's CPU.
type unacked struct {
	entries []pending
	head    int
}

// live returns the entries still pending, oldest first.
func (q *unacked) live() []pending {
	return q.entries[q.head:]
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
	if len(q.entries) == cap(q.entries) && q.head >= len(live) {
		n := copy(q.entries, live)
		clear(q.entries[n:])
		q.entries, q.head = q.entries[:n], 0
	}
	q.entries = slices.Insert(q.entries, q.head+i, p)
	return &q.entries[q.head+i], true
}

// remove drops the live entries i to j. An emptied table starts again at
// the front of its array.
func (q *unacked) remove(i, j int) {
	if i == 0 {
		clear(q.entries[q.head : q.head+j])
		q.head += j
	} else {
		q.entries = slices.Delete(q.entries, q.head+i, q.head+j)
	}
	if q.head == len(q.entries) {
		q.entries, q.head = q.entries[:0], 0
	}
}

// bySeq compares a pending delivery with a seq, for binary searches.
func bySeq(p pending, seq uint64) int {
	return cmp.Compare(p.message.Seq, seq)
}
