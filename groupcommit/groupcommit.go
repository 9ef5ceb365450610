// Package groupcommit gathers a broker's writes to its log into batches,
// one transaction and one sync each: group commit.
//
// # The contract
//
// popsub.go relies on a Log for the moment a message becomes durable
// (its section "The log: seq first, sync second"): Admit waits for room
// in a bounded queue; Append queues a message and returns the Outcome
// that is done once the message is on disk, or failed; Trim, Delete,
// SetHead, Reserve and SaveCursor queue the other changes a batch
// carries; Barrier returns the outcome of everything queued so far;
// Cursor reads a durable cursor, newest first; Stop commits what is
// queued and ends. After each commit, and before its outcome is done,
// Config.Committed hears how it went, so that the broker updates its own
// tables first.
//
// # The mechanism
//
// The committer is one goroutine and one queue. Callers queue appends,
// trims and cursor moves under its mutex, which nothing else is held
// under; the goroutine swaps the queue for an empty one, writes it in one
// transaction, and marks the batch's outcome done, which wakes every
// confirm waiting on it. A batch is taken at once when someone waits for
// it (urgent: a message Config.Urgent names, or a barrier) or it fills
// half the queue; otherwise it lingers up to Config.Linger.
// While one batch is written the next one fills, so the busier the
// broker, the more each sync carries. The queue is bounded (Admit), and
// the room a batch took is given back as soon as the loop takes it, not
// after the sync: memory holds at most two batches.
//
// A confirm on a quiet topic does not wait behind a flood on another.
// The queue keeps an eighth of its room for messages someone waits for,
// which a flood of messages nobody waits for cannot take; and when a
// batch holds such messages beside a large rest, the messages of their
// topics are committed first, in a small transaction of their own, and
// the rest after it. For a while after someone waited, a large batch is
// committed in chunks of an eighth of the queue, and between two chunks
// the topics someone has since come to wait for go first: the commit in
// flight is then a chunk, not a megabyte; and a flood may fill only half
// the queue, so that the disk holds it back sooner and leaves the cores
// to the waiter. Order within a topic is kept; only topics pass one
// another. One queue in strict order made such a confirm wait three
// times: for room, behind the flood's publisher; for the commit in
// flight; and for the megabyte of flood queued ahead of it. A topic's
// first publish waits for its head (Await), which goes first too, and
// hurries the loop for a few batches; the loop then waits, a few
// milliseconds at most, for the message behind the head, which goes
// before the flood's next chunk (follow).
//
// # What each speed trick buys
//
// Measured with BenchmarkPublishQoS1, popsub bench and docs/compare
// (performance.md):
//
//	trick                              buys
//	one sync per batch, not per message  64 publishers share each sync
//	a lingering batch (100 ms)         a quiet broker: a third of its CPU;
//	                                   100 ms, not 20: 10-20 % less CPU a
//	                                   delivery at 1,000 msg/s, p99 lower
//	                                   in 3 rounds of 4, 10 syncs a
//	                                   second, not 47
//	room given back before the sync    the next batch fills while one syncs
//	waited-for topics commit first,    a QoS 1 confirm behind a flood on
//	with room kept for them            another topic: p99 within 28-52 ms
//	                                   in 13 runs of 16, against 8 of 16
//	a flood in chunks while someone    the same confirm beside readers
//	waits, confirms between them       that keep up: p50 5.3-8.9 ms, not
//	                                   8.7-18.5; p99 within the bar in 10
//	                                   runs of 13, against 8
//	a batch taken at half the queue,   one subscriber's flood: 2.84-2.89
//	not a quarter                      us a delivery, not 3.28-3.35
//	a queue of 2 MiB (popsub.go), not  the same flood: 2.39-2.53 us a
//	1, and half of it beside a waiter  delivery, not 2.77-2.98
//	an awaited head goes first, and    with 2 MiB, the confirm behind a
//	hurries the loop for 4 batches     flood within 28-52 ms in 11 runs
//	                                   of 16, against 8 of 26 without
//	the message behind an awaited      the same confirm within the bar
//	head goes before the next chunk    in 24 runs of 26, against 20;
//	                                   median p99 37.5 ms, not 41.0
package groupcommit

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/popsub/popsub/queue"
)

// Batch is one atomic step of the log: forgets first, then appends, then
// trims and deletes, then heads and the reserve, then cursor moves.
type Batch[M any] struct {
	// Forgets maps a topic the broker forgot to the head it had: its log
	// and its head are deleted, and the store's floor, past which a topic
	// made again starts its seqs, rises to at least that head.
	Forgets map[string]uint64
	// Messages to append, in seq order within each topic.
	Messages []M
	// Trims maps a topic to the seq up to which its log is deleted.
	Trims map[string]uint64
	// Deletes maps a topic to single seqs deleted from its log.
	Deletes map[string][]uint64
	// Heads maps a topic to the head it is to have from now on: a
	// reservation, or at a clean stop the newest seq. It is set as it
	// is, lower or higher; the broker never sets one below a seq it
	// appended.
	Heads map[string]uint64
	// Reserve, if not nil, is the store's reserve from now on: the seqs
	// a topic with no head on disk may be given, past which a topic made
	// again after a crash starts. It is set as it is: a clean stop, which
	// stores every topic's head, sets it back to where its start's new
	// topics began.
	Reserve *uint64
	// Cursors maps a durable key to its new position.
	Cursors map[string]uint64
}

// Store is what the committer writes to: a popsub.Store keeps it.
type Store[M any] interface {
	// Commit applies a batch atomically and durably.
	Commit(batch *Batch[M]) error
	// Cursor returns a durable cursor's position, if one is stored.
	Cursor(key string) (uint64, bool, error)
}

// Config configures a Log.
type Config[M any] struct {
	// Store is where batches are committed.
	Store Store[M]
	// Size is what a message costs in the queue, in bytes; Urgent says
	// whether someone waits for it to be durable; Topic names the log it
	// goes to, within which order is kept.
	Size   func(M) int
	Urgent func(M) bool
	Topic  func(M) string
	// MaxMessages and MaxBytes bound the queue; Linger is the longest a
	// batch nobody waits for waits for company.
	MaxMessages, MaxBytes int
	Linger                time.Duration
	// Committed hears how each batch went, and how long its commit
	// took, before the batch's outcome is done.
	Committed func(batch *Batch[M], took time.Duration, err error)
}

// Outcome is what became of one batch (or, on a shared log, of one
// message): Done is closed once it is resolved.
type Outcome struct {
	done chan struct{} // closed by Resolve
	err  error         // nil when the batch is on disk
	// seq and duplicate are a shared log's answer for its one message.
	seq       uint64
	duplicate bool
}

// NewOutcome returns an outcome not yet resolved.
func NewOutcome() *Outcome { return &Outcome{done: make(chan struct{})} }

// Failed returns an outcome that has already failed with err.
func Failed(err error) *Outcome {
	o := NewOutcome()
	o.Resolve(0, false, err)
	return o
}

// Resolve records what became of the batch, and closes Done. seq and
// duplicate are a shared log's answer for its one message, 0 and false
// from a batch. Resolve is called once.
func (o *Outcome) Resolve(seq uint64, duplicate bool, err error) {
	o.seq, o.duplicate, o.err = seq, duplicate, err
	close(o.done)
}

// Done is closed once the outcome is resolved.
func (o *Outcome) Done() <-chan struct{} { return o.done }

// Err is nil once the batch is on disk, or why it is not; it is valid
// after Done.
func (o *Outcome) Err() error { return o.err }

// Seq and Duplicate are a shared log's answer, valid after Done: the
// message's seq, and whether it repeated a stored message_id.
func (o *Outcome) Seq() uint64     { return o.seq }
func (o *Outcome) Duplicate() bool { return o.duplicate }

// Log owns the group commit: callers queue work under its mutex and one
// goroutine commits the queue. Its mutex is a leaf: nothing else is
// locked while it is held.
type Log[M any] struct {
	config Config[M]
	// wake is signalled (capacity 1, never blocking) when work is queued;
	// followed when a topic in heads appends.
	wake, followed chan struct{}
	// ended is closed when the loop returns.
	ended chan struct{}
	// closed is the error an append after Stop fails with.
	closed error

	// mu guards the fields below; it is held for queueing only.
	mu sync.Mutex
	// queued is the work gathered since the loop last took a batch.
	queued *Batch[M]
	// committing is the batch being written now, or an empty one; Cursor
	// reads it.
	committing *Batch[M]
	// next is the fate of queued: every caller that queued into it waits
	// on the same outcome, but for urgent messages, which wait on
	// nextUrgent: it is resolved first when their topics commit first.
	next, nextUrgent *Outcome
	// waited holds the topics someone waits for: true for those with
	// urgent messages queued, false for those awaiting only a head.
	waited map[string]bool
	// heads holds the topics whose publisher awaits a head (Await) and
	// has not appended behind it yet: follow waits for them. A publisher
	// that gave up leaves its topic here until the topic's next append
	// or follow: one entry a topic at most.
	heads map[string]bool
	// calm counts the batches taken since the last that held an urgent
	// message (fewer after an awaited head alone: headTakes). Admit
	// reads it too, under mu.
	calm int
	// stopped is set by Stop: the loop commits what is queued and returns.
	stopped bool
	// urgent is set once someone waits for the queued batch: an urgent
	// message, or a barrier. reset clears it.
	urgent bool
	// admitted and admittedBytes count the messages admitted to the
	// queue and not yet taken by the loop, and their sizes; queuedBytes
	// the sizes of those already appended.
	admitted, admittedBytes, queuedBytes int
	// freed is closed, and replaced, whenever room is made in the queue;
	// callers waiting in Admit wake on it.
	freed chan struct{}
	// admitting is held by the one caller that Admit lets wait for room;
	// the others queue on it. Not under mu: it is taken first. Urgent
	// messages queue on admittingUrgent, so that they do not wait behind
	// a flood's caller for room a flood cannot take.
	admitting, admittingUrgent sync.Mutex
}

// Start starts the commit loop over config. closed is the error every
// outcome queued after Stop fails with.
func Start[M any](config Config[M], closed error) *Log[M] {
	l := &Log[M]{config: config, closed: closed,
		wake: make(chan struct{}, 1), followed: make(chan struct{}, 1),
		ended: make(chan struct{}), heads: map[string]bool{},
		freed: make(chan struct{}), committing: &Batch[M]{},
		calm: hurryTakes}
	l.reset()
	go l.loop()
	return l
}

// reset starts an empty queue. The caller holds l.mu (or owns l).
func (l *Log[M]) reset() {
	l.queued = &Batch[M]{Forgets: map[string]uint64{},
		Trims: map[string]uint64{}, Deletes: map[string][]uint64{},
		Heads: map[string]uint64{}, Cursors: map[string]uint64{}}
	l.next, l.nextUrgent, l.waited = NewOutcome(), NewOutcome(), nil
	l.queuedBytes, l.urgent = 0, false
}

// Admit waits until the queue has room for one more message of size
// bytes, urgent or not (Config.Urgent), and takes it; it reports false if
// done is closed, or the log stopped, first. beforeWait runs before each
// wait: the broker starts there the writers a publisher owes, so that its
// subscribers do not wait with it. The queue holds at most MaxMessages
// and MaxBytes (but always takes one message): a transaction stays
// bounded, and a publisher faster than the disk waits here. An unbounded
// queue was simpler, and under a flood grew to gigabytes, each commit
// slower than the last. An urgent message may use an eighth more, kept
// for it. While the loop hurries (someone waited lately), the others get
// half the queue: a flood that the disk holds back leaves the cores to
// the waiter.
func (l *Log[M]) Admit(size int, urgent bool, done <-chan struct{},
	beforeWait func()) bool {
	// Callers wait their turn: Go's mutex hands itself to the longest
	// waiter, so a flood cannot take every slot a commit frees while a
	// bystander on another topic waits for one.
	admitting := &l.admitting
	if urgent {
		admitting = &l.admittingUrgent
	}
	admitting.Lock()
	defer admitting.Unlock()
	l.mu.Lock()
	for l.admitted > 0 && !l.fits(size, urgent) && !l.stopped {
		freed := l.freed
		l.mu.Unlock()
		beforeWait()
		select {
		case <-freed:
		case <-done:
			return false
		}
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.admitted, l.admittedBytes = l.admitted+1, l.admittedBytes+size
	return true
}

// fits reports whether the queue has room for one more message of size
// bytes (room). The caller holds l.mu.
func (l *Log[M]) fits(size int, urgent bool) bool {
	most, bytes := l.room(urgent)
	return l.admitted < most && l.admittedBytes+size <= bytes
}

// room returns how many messages, and bytes, the queue may hold for a
// message: an eighth more if urgent, half while the loop hurries if not.
// The caller holds l.mu.
func (l *Log[M]) room(urgent bool) (most, bytes int) {
	most, bytes = l.config.MaxMessages, l.config.MaxBytes
	switch {
	case urgent:
		return most + most/8, bytes + bytes/8
	case l.hurrying():
		return most / 2, bytes / 2
	}
	return most, bytes
}

// hurrying reports whether the next batch taken commits in chunks: fewer
// than hurryTakes batches were taken since one held an urgent message.
// The caller holds l.mu.
func (l *Log[M]) hurrying() bool { return l.calm < hurryTakes }

// GiveBack gives back the room Admit took for a message that was not
// appended after all.
func (l *Log[M]) GiveBack(size int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.admitted, l.admittedBytes = l.admitted-1, l.admittedBytes-size
	l.wakeWaiters()
}

// wakeWaiters wakes every caller waiting in Admit. The caller holds l.mu.
func (l *Log[M]) wakeWaiters() {
	close(l.freed)
	l.freed = make(chan struct{})
}

// Append queues m and returns the outcome that says when it is durable.
// Appends of one topic must arrive in seq order, which is the order the
// store needs them in.
func (l *Log[M]) Append(m M) *Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.queued.Messages = append(l.queued.Messages, m)
	l.queuedBytes += l.config.Size(m)
	queue.Notify(l.wake)
	// Most appends find heads empty, and skip asking for the topic.
	if len(l.heads) > 0 {
		if topic := l.config.Topic(m); l.heads[topic] {
			delete(l.heads, topic)
			queue.Notify(l.followed)
		}
	}
	if !l.config.Urgent(m) {
		return l.next
	}
	return l.await(l.config.Topic(m), true)
}

// Await returns the outcome that is done once topic's new head is on
// disk. Heads commit first, as an urgent message does: a topic's first
// publish waits here for its seqs to be reserved, and would otherwise
// wait for a flood queued beside them. A head makes the loop hurry for
// headTakes batches, not hurryTakes: long enough for the topic's first
// message to follow, where a second of chunks would cost a flood beside
// each new topic a tenth of its speed.
func (l *Log[M]) Await(topic string) *Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	queue.Notify(l.wake)
	l.heads[topic] = true
	return l.await(topic, false)
}

// await marks topic as waited for, for an urgent message or only for its
// head, and the queued batch as urgent, and returns the outcome of what
// is waited for. The caller holds l.mu.
func (l *Log[M]) await(topic string, message bool) *Outcome {
	l.urgent = true
	if l.waited == nil {
		l.waited = map[string]bool{}
	}
	l.waited[topic] = l.waited[topic] || message
	return l.nextUrgent
}

// Trim queues deleting topic's log up to seq.
func (l *Log[M]) Trim(topic string, seq uint64) {
	l.queue(func(q *Batch[M]) { q.Trims[topic] = max(q.Trims[topic], seq) })
}

// Delete queues deleting seq from topic's log.
func (l *Log[M]) Delete(topic string, seq uint64) {
	l.queue(func(q *Batch[M]) { q.Deletes[topic] = append(q.Deletes[topic], seq) })
}

// SetHead queues setting topic's stored head to head.
func (l *Log[M]) SetHead(topic string, head uint64) {
	l.queue(func(q *Batch[M]) { q.Heads[topic] = head })
}

// Reserve queues setting the store's reserve to upTo (Batch.Reserve).
// It travels with the heads: a new topic's first publish awaits the
// batch that carries both.
func (l *Log[M]) Reserve(upTo uint64) {
	l.queue(func(q *Batch[M]) { q.Reserve = &upTo })
}

// Forget queues forgetting topic, whose head is head, and drops the
// trims, deletes and head queued for it: they are moot once the topic
// is gone. The broker forgets only a topic none of whose messages or
// heads is still on its way to the store, and a head set for the topic
// after the forget, in the same batch or the next, is the new topic's:
// forgets apply first, and travel with the heads (split, steal).
func (l *Log[M]) Forget(topic string, head uint64) {
	l.queue(func(q *Batch[M]) {
		delete(q.Trims, topic)
		delete(q.Deletes, topic)
		delete(q.Heads, topic)
		q.Forgets[topic] = max(q.Forgets[topic], head)
	})
}

// SaveCursor queues a durable cursor's new position. Only the newest
// position per cursor is kept: a thousand acks cost one write.
func (l *Log[M]) SaveCursor(key string, position uint64) {
	l.queue(func(q *Batch[M]) { q.Cursors[key] = position })
}

// queue does work on the queued batch, under l.mu, and wakes the loop.
func (l *Log[M]) queue(work func(queued *Batch[M])) {
	l.mu.Lock()
	defer l.mu.Unlock()
	work(l.queued)
	queue.Notify(l.wake)
}

// Barrier returns an outcome that completes once everything queued so far
// is durable: a repeated publish is confirmed no sooner than the first.
func (l *Log[M]) Barrier() (next *Outcome) {
	// The queued batch commits after any batch in progress, so its outcome
	// covers everything queued before, even with nothing queued itself.
	l.queue(func(*Batch[M]) { next, l.urgent = l.next, true })
	return next
}

// Cursor reads a durable cursor, newest first: the queue, the batch being
// committed, then the store.
func (l *Log[M]) Cursor(key string) (uint64, bool, error) {
	// A cursor moved a moment ago is still in memory; reading only the
	// store would resume a subscription from an older position.
	l.mu.Lock()
	for _, batch := range []*Batch[M]{l.queued, l.committing} {
		if position, ok := batch.Cursors[key]; ok {
			l.mu.Unlock()
			return position, true, nil
		}
	}
	l.mu.Unlock()
	return l.config.Store.Cursor(key)
}

// loop commits queued batches until Stop, then commits what is left.
func (l *Log[M]) loop() {
	defer close(l.ended)
	for range l.wake {
		l.linger()
		// Swap the queue for an empty one and release the lock at once,
		// giving its room back now rather than after the commit: the
		// next batch fills while this one is written.
		l.mu.Lock()
		batch, fate, urgentFate, stopped := l.queued, l.next, l.nextUrgent,
			l.stopped
		waited, size := l.waited, l.queuedBytes
		for _, message := range waited {
			if message {
				l.calm = 0
			} else {
				l.calm = min(l.calm, hurryTakes-headTakes)
			}
		}
		hurry := l.hurrying() && !stopped
		l.calm++
		l.committing = batch
		l.admitted -= len(batch.Messages)
		l.admittedBytes -= l.queuedBytes
		l.wakeWaiters()
		l.reset()
		if stopped {
			// Nothing queued after the last batch is committed.
			l.next, l.nextUrgent = Failed(l.closed), Failed(l.closed)
		}
		l.mu.Unlock()

		if len(batch.Forgets)+len(batch.Messages)+len(batch.Trims)+
			len(batch.Deletes)+len(batch.Heads)+len(batch.Cursors) == 0 &&
			batch.Reserve == nil {
			// Nothing to write, and what was queued before is written:
			// a sync would add nothing (a steal can leave a wake-up).
			fate.Resolve(0, false, nil)
			urgentFate.Resolve(0, false, nil)
		} else if first, rest := l.split(batch, waited, size); first != nil {
			l.commit(first, urgentFate)
			if l.follow(waited) {
				l.steal(rest.Messages)
			}
			l.commitInChunks(rest, hurry, fate)
		} else {
			l.commitInChunks(batch, hurry, urgentFate, fate)
		}

		l.mu.Lock()
		l.committing = &Batch[M]{}
		l.mu.Unlock()
		if stopped {
			return
		}
	}
}

// commit writes batch, and resolves the outcomes that wait for it.
// Committed hears the batch before they are done: a replay that starts
// after a confirm reads the message from the store.
func (l *Log[M]) commit(batch *Batch[M], fates ...*Outcome) error {
	start := time.Now()
	err := l.config.Store.Commit(batch)
	if err != nil {
		l.retryCursors(batch.Cursors)
	}
	l.config.Committed(batch, time.Since(start), err)
	for _, fate := range fates {
		fate.Resolve(0, false, err)
	}
	return err
}

// hurryTakes is how many batches after the last one somebody waited for
// the loop commits in chunks (commitInChunks): about a second of a flood.
const hurryTakes = 64

// headTakes is how many batches the loop hurries after a head was
// awaited (Await).
const headTakes = 4

// commitInChunks commits batch and resolves fates, in one transaction,
// or, when hurry (someone waited for a batch lately), in chunks of an
// eighth of the queue's bytes: between two chunks, the queued topics
// someone has since come to wait for commit first (l.steal). A confirm
// then waits for a chunk of another topic's flood, not for a whole batch
// of it. Chunks cost a flood more syncs, so a flood nobody waits beside
// commits whole. Forgets go with the first chunk, as a head stolen after
// it may be a topic's made again; trims, deletes, heads, the reserve and
// cursor moves with the last; fates hear the first error.
func (l *Log[M]) commitInChunks(batch *Batch[M], hurry bool,
	fates ...*Outcome) {
	var failed error
	messages, bytes, forgets := batch.Messages, 0, batch.Forgets
	for i := 0; hurry && i < len(messages)-1; i++ {
		if bytes += l.config.Size(messages[i]); 8*bytes < l.config.MaxBytes {
			continue
		}
		failed = cmp.Or(failed, l.commit(&Batch[M]{Forgets: forgets,
			Messages: messages[:i+1]}))
		messages, bytes, i, forgets = messages[i+1:], 0, -1, nil
		l.steal(messages)
	}
	last := *batch
	last.Messages, last.Forgets = messages, forgets
	failed = cmp.Or(failed, l.commit(&last))
	for _, fate := range fates {
		fate.Resolve(0, false, failed)
	}
}

// steal commits now the queued messages of the topics someone waits for,
// and the queued heads, reserve and forgets, and resolves their outcome,
// unless one of those topics still has messages in remaining, which must
// commit before them.
func (l *Log[M]) steal(remaining []M) {
	l.mu.Lock()
	if len(l.waited) == 0 || l.stopped {
		l.mu.Unlock()
		return
	}
	for _, m := range remaining {
		if l.waited[l.config.Topic(m)] {
			l.mu.Unlock()
			return
		}
	}
	stolen, kept, bytes := &Batch[M]{}, l.queued.Messages[:0], 0
	for _, m := range l.queued.Messages {
		if l.waited[l.config.Topic(m)] {
			stolen.Messages = append(stolen.Messages, m)
			bytes += l.config.Size(m)
		} else {
			kept = append(kept, m)
		}
	}
	clear(l.queued.Messages[len(kept):])
	l.queued.Messages = kept
	stolen.Heads, l.queued.Heads = l.queued.Heads, map[string]uint64{}
	stolen.Reserve, l.queued.Reserve = l.queued.Reserve, nil
	stolen.Forgets, l.queued.Forgets = l.queued.Forgets, map[string]uint64{}
	fate, waited := l.nextUrgent, l.waited
	l.nextUrgent, l.waited = NewOutcome(), nil
	if len(stolen.Messages) > 0 {
		l.calm = 0
	}
	l.admitted -= len(stolen.Messages)
	l.admittedBytes -= bytes
	l.queuedBytes -= bytes
	l.wakeWaiters()
	l.mu.Unlock()
	l.commit(stolen, fate)
	if l.follow(waited) {
		l.steal(remaining)
	}
}

// followWait is the longest the loop waits, after a head it committed,
// for the message whose publisher awaited it (follow).
const followWait = 5 * time.Millisecond

// follow waits, after a commit that served waited, until each topic
// there that awaited only a head has appended behind it, or for at most
// followWait, and reports whether there were such topics and all
// appended: the messages then go before the flood's next chunk (steal).
// Without the wait they went after it, one commit later: the loop took
// the chunk at once, while their publisher waited for a core to wake on.
// A publisher that gives up costs the flood followWait once.
func (l *Log[M]) follow(waited map[string]bool) bool {
	var heads []string
	for topic, message := range waited {
		if !message {
			heads = append(heads, topic)
		}
	}
	if len(heads) == 0 {
		return false
	}
	timeout := time.NewTimer(followWait)
	defer timeout.Stop()
	for {
		l.mu.Lock()
		pending := slices.ContainsFunc(heads,
			func(topic string) bool { return l.heads[topic] })
		l.mu.Unlock()
		if !pending {
			return true
		}
		select {
		case <-l.followed:
		case <-timeout.C:
			l.mu.Lock()
			for _, topic := range heads {
				delete(l.heads, topic)
			}
			l.mu.Unlock()
			return false
		}
	}
}

// split takes out of batch, which holds size bytes of messages, to be
// committed first, the messages of the topics in waited, and the heads
// and the reserve (with the forgets, which a head set after them must
// follow), which are small and which a topic's first publish may wait
// for, if the rest is large enough to keep them waiting: an eighth of
// the queue's bytes. Trims, deletes and cursor moves stay with the rest,
// which commits after them. It returns a nil first when there is nothing
// to split.
func (l *Log[M]) split(batch *Batch[M], waited map[string]bool,
	size int) (first, rest *Batch[M]) {
	if len(waited) == 0 || 8*size < l.config.MaxBytes {
		return nil, batch
	}
	first = &Batch[M]{Forgets: batch.Forgets, Heads: batch.Heads,
		Reserve: batch.Reserve}
	rest = &Batch[M]{Trims: batch.Trims, Deletes: batch.Deletes,
		Cursors: batch.Cursors}
	restBytes := 0
	for _, m := range batch.Messages {
		if waited[l.config.Topic(m)] {
			first.Messages = append(first.Messages, m)
		} else {
			rest.Messages = append(rest.Messages, m)
			restBytes += l.config.Size(m)
		}
	}
	if 8*restBytes < l.config.MaxBytes {
		return nil, batch
	}
	return first, rest
}

// retryCursors queues again, for a batch a second from now, the cursor
// moves of a batch that failed, unless a newer move of the same cursor
// is queued already. A failed message has a publisher to send it again;
// a cursor has only its subscriber's next ack, which may never come, and
// a durable subscriber must not resume behind what it acked because the
// log was away (NATS restarting, say) when its ack was committed.
func (l *Log[M]) retryCursors(cursors map[string]uint64) {
	if len(cursors) == 0 {
		return
	}
	l.mu.Lock()
	for key, position := range cursors {
		if _, newer := l.queued.Cursors[key]; !newer {
			l.queued.Cursors[key] = position
		}
	}
	l.mu.Unlock()
	time.AfterFunc(time.Second, func() { queue.Notify(l.wake) })
}

// linger waits, at most Linger, until the queued batch is worth a sync
// of its own: someone waits for it, it holds half of what the queue may
// (a quarter cost one subscriber's flood 10 % more CPU, in syncs and
// meta pages), or the log stops.
func (l *Log[M]) linger() {
	for wait := time.After(l.config.Linger); !l.ready(); {
		select {
		case <-l.wake:
		case <-wait:
			return
		}
	}
}

// ready reports whether the queued batch should be committed now.
func (l *Log[M]) ready() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	most, bytes := l.room(false)
	return l.urgent || l.stopped || 2*l.admitted >= most ||
		2*l.admittedBytes >= bytes
}

// Stop commits what is queued and ends the loop.
func (l *Log[M]) Stop() {
	// The signal makes the loop run once more, see stopped, commit what
	// is queued and return.
	l.mu.Lock()
	l.stopped = true
	queue.Notify(l.wake)
	l.wakeWaiters()
	l.mu.Unlock()
	<-l.ended
}
