package queue

import "container/heap"

// Schedule holds items each due at a time, and hands back the earliest
// first: a heap, so that adding one and taking the earliest cost a
// logarithm of how many wait, and finding when the next is due costs
// nothing. Scanning every item at each tick, as a loop that looks once
// a second does, cost a broker with 300,000 delayed messages and none
// due 6 to 9 % of a core.
//
// popsub.go relies on it for this: Add adds an item due at a time (Unix
// milliseconds), and reports whether none is due sooner; Due takes
// out every item due by a time, earliest first, and of those due at the
// same time the first added first; Next says when the earliest is due.
// The zero Schedule is empty and ready; the caller locks it.
type Schedule[T any] struct {
	items timed[T]
	added uint64 // items added so far, which orders those due together
}

// dated is one item of a Schedule, when it is due, and how many were
// added before it.
type dated[T any] struct {
	due   int64
	order uint64
	item  T
}

// timed is a Schedule's heap, for container/heap.
type timed[T any] []dated[T]

func (h timed[T]) Len() int { return len(h) }
func (h timed[T]) Less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].order < h[j].order
}
func (h timed[T]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timed[T]) Push(x any)   { *h = append(*h, x.(dated[T])) }
func (h *timed[T]) Pop() any {
	last := (*h)[len(*h)-1]
	*h = (*h)[:len(*h)-1]
	return last
}

// Add adds item, due at due, and reports whether none is due sooner (a
// caller's timer set for the earliest needs no change if one is).
func (s *Schedule[T]) Add(due int64, item T) bool {
	heap.Push(&s.items, dated[T]{due, s.added, item})
	s.added++
	return s.items[0].due == due
}

// Due takes out every item due at or before now, earliest first, and
// of those due at the same time the first added first.
func (s *Schedule[T]) Due(now int64) []T {
	var due []T
	for len(s.items) > 0 && s.items[0].due <= now {
		due = append(due, heap.Pop(&s.items).(dated[T]).item)
	}
	return due
}

// Next returns when the earliest item is due, and false if none waits.
func (s *Schedule[T]) Next() (int64, bool) {
	if len(s.items) == 0 {
		return 0, false
	}
	return s.items[0].due, true
}
