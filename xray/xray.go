// Package xray is the publishing half of PopSub's x-ray: a bounded queue
// of the broker's transitions, and the one goroutine that publishes them
// on $sys/events.
//
// # The contract
//
// popsub.go decides which transitions are events and what each says (its
// section "The x-ray"); it relies on a Feed for four things: Emit never
// blocks and takes no lock, so code holding a topic's or a connection's
// lock may call it; Heard says whether anyone listens, so that an
// event nobody would read is never made; Run publishes what was
// queued, in order, until the broker stops; and Count counts what comes
// once a message or more, for monitoring, where an event each would
// cost too much.
//
// # The mechanism
//
// Events wait on a channel of QueueSize and are published by Run, never
// by the code that noticed them: that code often holds a lock, and
// publishing takes a topic's lock of its own. When the queue is full,
// events are dropped and counted, not waited for: the x-ray must never
// slow the broker it watches.
//
// # What each trick buys
//
// Measured with popsub bench and its profile (performance.md):
//
//	trick                             buys
//	no delivery event while unwatched 6 % of a busy broker's CPU (10 subs)
//	no publish or commit event while  3 % of a busy broker's CPU (1 sub)
//	unwatched
//	a full queue drops, never waits   a burst never waits for its watcher
package xray

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/popsub/popsub/wire"
)

// QueueSize is how many events may wait for Run: a few hundred
// milliseconds of a busy playground, and a bounded cost when a burst
// outruns the feed.
const QueueSize = 4096

// Feed queues a broker's events for publishing.
type Feed struct {
	// hook, if set, sees every event, watched or not.
	hook func(wire.Event)
	// logger hears of dropped events, once a thousand.
	logger *slog.Logger
	// events holds the events Run has not published yet.
	events chan wire.Event
	// watchers counts subscriptions to $sys topics; dropped counts the
	// events lost to a full queue.
	watchers, dropped atomic.Int64
	// published, committed and delivered count what Count is told.
	published, committed, delivered atomic.Uint64
}

// NewFeed returns an empty feed; hook, if not nil, sees every event.
func NewFeed(hook func(wire.Event), logger *slog.Logger) *Feed {
	return &Feed{hook: hook, logger: logger,
		events: make(chan wire.Event, QueueSize)}
}

// Watch counts a watcher in (+1) or out (-1).
func (f *Feed) Watch(delta int64) { f.watchers.Add(delta) }

// Watched reports whether anyone subscribes to a $sys topic now.
func (f *Feed) Watched() bool { return f.watchers.Load() > 0 }

// Heard reports whether an event made now would be read: someone
// watches, or the hook listens.
func (f *Feed) Heard() bool { return f.Watched() || f.hook != nil }

// Emit queues e if anyone watches, and hands it to the hook. It never
// blocks and takes no lock.
func (f *Feed) Emit(e wire.Event) {
	f.Tell(e)
	// An event about $sys/events would make another event when it is
	// published, and so on for ever.
	if f.watchers.Load() == 0 || strings.HasPrefix(e.Topic, "$sys/") {
		return
	}
	e.Time = time.Now().UnixMilli()
	select {
	case f.events <- e:
	default:
		if f.dropped.Add(1)%1000 == 1 {
			f.logger.Warn("x-ray events dropped", "total", f.dropped.Load())
		}
	}
}

// Tell hands e to the hook alone: an event for monitoring, such as a
// commit's size and time, which is never published.
func (f *Feed) Tell(e wire.Event) {
	if f.hook != nil {
		f.hook(e)
	}
}

// Count counts kind if it is one of the transitions that come once a
// message or more, "published", "committed" or "delivered", and reports
// whether it was. The broker emits those as events only while someone
// watches, and reads their counts (Counted) for monitoring.
func (f *Feed) Count(kind string) bool {
	switch kind {
	case "published":
		f.published.Add(1)
	case "committed":
		f.committed.Add(1)
	case "delivered":
		f.delivered.Add(1)
	default:
		return false
	}
	return true
}

// Counted reads the counts, for monitoring.
func (f *Feed) Counted() (published, committed, delivered uint64) {
	return f.published.Load(), f.committed.Load(), f.delivered.Load()
}

// Run hands each queued event to publish, in order, until stop is closed.
func (f *Feed) Run(stop <-chan struct{}, publish func(wire.Event)) {
	for {
		select {
		case e := <-f.events:
			publish(e)
		case <-stop:
			return
		}
	}
}
