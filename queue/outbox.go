package queue

import (
	"slices"
	"sync"
)

// Outbox is a connection's queue of frames for its writer, bounded in
// bytes. A channel would be simpler, but it bounds frames rather than
// bytes, and allocates every slot up front, for every idle connection.
// This queue grows with a burst and gives the memory back once drained:
// it hands its array to the writer and takes the written one back, so a
// busy outbox grows neither, and an idle one holds none.
//
// popsub.go relies on it for this: Push queues frames, all or none,
// within the outbox's bytes (PushWithin within fewer); the first frames
// into an idle outbox start its writer (on one of the broker's Workers),
// or owe Wakeups the start; Take hands the writer everything queued, and
// an empty batch tells it to exit.
type Outbox struct {
	mu      sync.Mutex // guards the fields below
	frames  [][]byte   // queued, oldest first
	bytes   int        // the frames' lengths, added up
	limit   int        // the bound, in bytes
	writing bool       // a writer goroutine owns the socket's write side
	write   func()     // the writer, started by workers
	workers *Workers   // where the writer runs
}

// NewOutbox returns an empty outbox of limit bytes, whose writer is
// write, run by workers (nil: a goroutine of its own each time).
func NewOutbox(limit int, write func(), workers *Workers) *Outbox {
	return &Outbox{limit: limit, write: write, workers: workers}
}

// Push queues frames, all or none: none if they would take the outbox
// past its limit, unless it is empty and they are one frame, which may
// then be as large as a frame can be. The first frames into an idle
// outbox start its writer.
func (o *Outbox) Push(frames ...[]byte) bool {
	return o.PushWithin(o.limit, nil, frames...)
}

// PushWithin is Push with a lower limit, for a sender that may use only
// part of the outbox. With wake (a publisher's fan-out), the writer is
// not started here: wake.Owe owes it a start, so that a subscriber gets
// a read's worth of publishes in one write. A nil wake starts it now.
func (o *Outbox) PushWithin(limit int, wake *Wakeups, frames ...[]byte) bool {
	size := 0
	for _, frame := range frames {
		size += len(frame)
	}
	o.mu.Lock()
	if o.bytes+size > limit && (o.bytes > 0 || len(frames) > 1) {
		o.mu.Unlock()
		return false
	}
	if o.frames == nil {
		o.frames = *spareFrames.Get().(*[][]byte)
	}
	o.frames = append(o.frames, frames...)
	o.bytes += size
	idle := !o.writing
	o.writing = true
	o.mu.Unlock()
	switch {
	case !idle:
	case wake == nil:
		o.start()
	default:
		wake.Owe(o)
	}
	return true
}

// Take returns every queued frame, in order, and keeps the writer's
// written batch, emptied, to queue the next ones in: the two arrays
// change hands at each take. An empty batch means the outbox is idle:
// the writer must exit, the next push starts another, and a large array
// goes to spareFrames, for the next outbox to fill, rather than staying
// with an idle connection.
func (o *Outbox) Take(written [][]byte) [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(written[:cap(written)])
	batch := o.frames
	o.frames, o.bytes, o.writing = written[:0], 0, len(batch) > 0
	if !o.writing && cap(o.frames) > 64 {
		spareFrames.Put(new(o.frames))
		o.frames = nil
	}
	return batch
}

// start runs the writer.
func (o *Outbox) start() { o.workers.Go(o.write) }

// Bytes is how many bytes are queued now.
func (o *Outbox) Bytes() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bytes
}

// spareFrames holds the frame arrays nobody is using: those of outboxes
// gone idle and of writers that exited, emptied. A writer exits whenever
// its outbox empties, and the next burst into an empty outbox grew an
// array from nothing again: a quarter of what a busy broker allocated,
// and the collections that come with it.
var spareFrames = sync.Pool{New: func() any { return new([][]byte) }}

// Recycle gives a writer's batch array back when the writer exits,
// emptied, for the next outbox to fill.
func Recycle(batch [][]byte) {
	if cap(batch) > 0 {
		clear(batch[:cap(batch)]) // the frames of a failed write
		spareFrames.Put(new(batch[:0]))
	}
}

// Notify signals ch, a channel of capacity one, without waiting: a
// signal already pending says the same. It is how one goroutine wakes
// another that waits for work (a writer for room, a committer for a
// batch), in popsub.go and the packages under it alike.
func Notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Wakeups are the writers a reader's work owes a start: the idle
// outboxes its publishes filled since it last read its socket. A writer
// started at once, for each frame a publish queues, wrote each delivery
// of a burst alone, a system call each; started when the reader is
// about to read again (socket.Options.BeforeRead), or to wait, it finds
// a whole read's worth of publishes queued for its subscriber, and
// nothing waits for a timer. nats-server's read loop does the same (flushClients). mu
// is a leaf: a close's handshake reads the socket from another goroutine.
type Wakeups struct {
	mu      sync.Mutex
	writers []*Outbox // owed their writer's start, in the order filled
}

// Owe owes o's writer a start, or, on a nil w, starts it at once.
func (w *Wakeups) Owe(o *Outbox) {
	if w == nil {
		o.start()
		return
	}
	w.mu.Lock()
	w.writers = append(w.writers, o)
	w.mu.Unlock()
}

// Start starts every writer owed. A nil w owes none.
func (w *Wakeups) Start() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range w.writers {
		o.start()
	}
	w.writers = slices.Delete(w.writers, 0, len(w.writers)) // cleared
}
