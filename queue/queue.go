// Package queue holds the containers PopSub's tables are made of: a
// slice appended to at the back and taken from at the front, which costs
// nothing while it is empty, and the outbox built the same way.
//
// # The contract
//
// popsub.go keeps each connection's pending deliveries, and each topic's
// index of retained messages, in a Queue: Live returns the items, oldest
// first; Insert puts one at a place, at the back usually; Remove drops
// a run of them; Drop drops those that match, keeping the order of the
// rest. Each connection's frames for its writer wait in an Outbox,
// bounded in bytes, and the writers a reader's publishes filled wait in
// its Wakeups for their start (outbox.go states both contracts); the
// broker's Workers run the writers (workers.go).
//
// # What each trick buys
//
// Measured with popsub bench, docs/compare and their profiles
// (performance.md):
//
//	trick                               buys
//	taking from the front moves head    with a slice, 69 % of the
//	                                    broker's CPU went to copying
//	moving down only to free half       each item copied a bounded number
//	                                    of times
//	an empty queue holds no array       an idle connection costs nothing
//	a writer runs on a goroutine kept   2.35-3.30 -> 0.60 us a writer's
//	from the writer before              start (BenchmarkWorkers_Deep-
//	                                    Writer); 21.5-24.8 -> 19.7-21.3
//	                                    us of CPU a delivery at 1,000
//	                                    msg/s to ten subscribers
package queue

import "slices"

// Queue is a slice appended to at the back and taken from at the front:
// items[head:] are live. Taking from the front moves head and copies
// nothing. An append that finds the array full first moves the live
// items down to its start if that frees at least half of it, and lets
// the array grow otherwise, so each item is copied a bounded number of
// times and a queue that stays about as long allocates nothing. Deleting
// from the front of a plain slice was simpler, and copied the rest each
// time; reslicing it left the room at the front unused, so appends kept
// allocating new arrays.
type Queue[T any] struct {
	items []T
	head  int
}

// Live returns the items in the queue, oldest first.
func (q *Queue[T]) Live() []T { return q.items[q.head:] }

// Insert puts v at i among the live items: at the back, usually.
func (q *Queue[T]) Insert(i int, v T) {
	n := len(q.items) - q.head
	if len(q.items) == cap(q.items) && q.head >= n {
		copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	q.items = slices.Insert(q.items, q.head+i, v)
}

// Remove drops the live items i to j. An emptied queue starts again at
// the front of its array.
func (q *Queue[T]) Remove(i, j int) {
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

// Drop drops the live items for which drop reports true, keeping the
// order of the rest, and returns how many it dropped.
func (q *Queue[T]) Drop(match func(T) bool) int {
	live := q.Live()
	kept := slices.DeleteFunc(live, match)
	q.items = q.items[:q.head+len(kept)]
	return len(live) - len(kept)
}
