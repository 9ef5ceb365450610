// Package chaos checks PopSub's promises under faults. Its clients
// publish unique values at QoS 1 and subscribe, durably or not, through
// whatever the faults do to them, and record every frame in a History;
// Check then holds the history to exactly what docs/protocol.md
// promises, one invariant at a time.
//
// Two drivers use it: `popsub chaos` runs real brokers (bbolt, or
// several on NATS JetStream) behind TCP proxies (Proxy, which can drop
// every connection or stop carrying bytes) and kills, pauses, cuts and
// stalls them; the root package's simulation runs a broker in fake
// time on a disk that loses what it had not synced. Both feed the same
// clients and the same checker, so a violation means the same thing in
// either.
//
// The package knows the protocol, not the broker: it imports nothing of
// PopSub's.
package chaos

import (
	"sync"
	"time"

	"github.com/popsub/popsub/wire"
)

// A History is everything a run's clients saw. Its methods are safe for
// concurrent use; read its fields only once the run is over.
type History struct {
	mu sync.Mutex
	// Attempts lists every publish sent, re-sends included.
	Attempts []Attempt
	// Confirms lists every "published" reply.
	Confirms []Confirm
	// Subscriptions lists every subscribe frame sent, with what it got.
	Subscriptions []*Subscription
	// Faults lists what the nemesis did.
	Faults []*Fault
	// Refusals lists every error reply that named a publish.
	Refusals []Refusal
	// Stalls lists what the run's own probes waited for in vain while
	// nothing failed (a publish to a new topic that was never delivered).
	Stalls []string
	// Final is each topic's log read from the start, after the run, in
	// seq order.
	Final map[string][]Stored
	// DeadLetters are the run's topics' dead letters, read after it.
	DeadLetters []wire.DeadLetter
	// FinalReads are the messages of Final that carried an expires_at,
	// as the final read got them: when, and until when.
	FinalReads []FinalRead
	// Acks lists every ack sent, for the checks of a run still going
	// (Promises).
	Acks []Ack
	// Bounds are the topics whose delayed messages a client held to a
	// bound (Client.Burst), and the bound: the broker's --max-delayed.
	Bounds map[string]int
}

// Ack is one ack frame sent for one delivery.
type Ack struct {
	Subscriber, Topic, ID string
	At                    time.Time
}

// Attempt is one publish frame sent.
type Attempt struct {
	Publisher string // the client that sent it
	Topic     string
	ID        string // its message_id
	Value     string // its payload, a JSON string
	// At is when it was sent; Unread is set when its sender does not
	// read the answer (a probe that waits for the delivery instead).
	At     time.Time
	Unread bool
	// Expiring is set when it carried a ttl_ms: it may expire before a
	// subscriber, or the final read, gets it. Delayed is set when it
	// carried a delay_ms: it is due no sooner than that after At.
	Expiring, Delayed bool
	// Run, if not 0, numbers the run of publishes it was sent in, all at
	// once on one connection (Client.Burst): the broker takes a run's
	// publishes one by one, in the order they were sent.
	Run int
}

// Confirm is one "published" reply.
type Confirm struct {
	Publisher string
	Topic     string
	ID        string
	Seq       uint64    // the seq it names
	Duplicate bool      // the reply said duplicate
	At        time.Time // when it came
	// Delayed is set when the confirm named the $delayed log of Topic,
	// where the message waits: Seq is its place there, not in Topic.
	Delayed bool
}

// Refusal is one error reply that named a publish: store_failed, say.
type Refusal struct {
	Publisher, Topic, ID, Code string
	At                         time.Time
}

// Subscription is one subscribe frame and what came of it, until its
// connection ended.
type Subscription struct {
	Subscriber string // the client that sent it
	Topic      string
	// Durable is the durable name, or "" for a plain subscription.
	Durable string
	// Group is the work queue it joined, or "": its deliveries are the
	// group's share of the topic, not all of it.
	Group string
	// Overlap is a wildcard filter subscribed beside it on the same
	// connection, or "": then its deliveries are those of both, each
	// once, in the order they came, and it is a plain subscription too.
	Overlap string
	// After is the "after" it sent, or nil: a plain subscription's
	// first, from the oldest message kept, or a durable one's.
	After *uint64
	// Begun is set on a durable name's first subscribe, which asked for
	// new messages only ("last":0): the name begins at Head.
	Begun bool
	// Replied is set once "subscribed" came, at RepliedAt; Head is its
	// seq, and Unrecovered says it carried "recovered":false.
	Replied     bool
	RepliedAt   time.Time
	Head        uint64
	Unrecovered bool
	// Deliveries are the messages it got, in order.
	Deliveries []Delivery
	// Skips are the "skipped" frames it got: the log overtook it.
	Skips []Skip
	// Ended is set when its connection ended; End is when.
	Ended bool
	End   time.Time
}

// Skip is one "skipped" frame: the messages up to Seq left the log
// before the subscription had them; it came after Delivered deliveries.
type Skip struct {
	Delivered int
	Seq       uint64
}

// Delivery is one message frame.
type Delivery struct {
	Seq     uint64
	ID      string
	Value   string
	Attempt int
	// QoS and At are the delivery's QoS and when it came; At is set by
	// Delivered.
	QoS int
	At  time.Time
	// Nakked is set when the subscriber handed it back with a nak: it
	// is owed again, or a dead letter.
	Nakked bool
	// ExpiresAt and DeliverAt are the delivery's expires_at and
	// deliver_at, Unix ms, or 0.
	ExpiresAt, DeliverAt int64
}

// FinalRead is one message of the final read that carried expires_at.
type FinalRead struct {
	Topic     string
	Seq       uint64
	ID        string
	ExpiresAt int64     // Unix ms
	At        time.Time // when the final read got it
}

// ReadExpiring records a message with an expires_at the final read got.
func (h *History) ReadExpiring(r FinalRead) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.At = time.Now()
	h.FinalReads = append(h.FinalReads, r)
}

// Stored is one message of a topic's final log.
type Stored struct {
	Seq   uint64
	ID    string
	Value string
}

// Fault is one thing the nemesis did, and when it was undone.
type Fault struct {
	Kind   string // "kill", "pause", "cut", "stall", "kill-nats", …
	Target string // which broker, proxy or server
	Start  time.Time
	// Healed is set once the fault is undone; a fault never healed is a
	// violation.
	Healed bool
	End    time.Time
}

// Sent records a publish about to be sent.
func (h *History) Sent(a Attempt) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a.At = time.Now()
	h.Attempts = append(h.Attempts, a)
}

// Confirmed records a "published" reply.
func (h *History) Confirmed(c Confirm) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.At = time.Now()
	h.Confirms = append(h.Confirms, c)
}

// Refused records an error reply that named a publish.
func (h *History) Refused(r Refusal) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r.At = time.Now()
	h.Refusals = append(h.Refusals, r)
}

// Bounded records that topic's delayed messages are held to bound.
func (h *History) Bounded(topic string, bound int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Bounds == nil {
		h.Bounds = map[string]int{}
	}
	h.Bounds[topic] = bound
}

// Stalled records that a probe of the run waited in vain, while nothing
// failed, for what the broker promises within AnswerBound.
func (h *History) Stalled(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Stalls = append(h.Stalls, what)
}

// Subscribed records a subscribe frame about to be sent, and returns the
// record its replies go into.
func (h *History) Subscribed(s *Subscription) *Subscription {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Subscriptions = append(h.Subscriptions, s)
	return s
}

// Replied records the "subscribed" reply of s.
func (h *History) Replied(s *Subscription, head uint64, recovered bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.Replied, s.RepliedAt = true, time.Now()
	s.Head, s.Unrecovered = head, !recovered
}

// Delivered records a message frame of s.
func (h *History) Delivered(s *Subscription, d Delivery) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d.At = time.Now()
	s.Deliveries = append(s.Deliveries, d)
}

// Acked records an ack frame about to be sent.
func (h *History) Acked(subscriber, topic, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Acks = append(h.Acks, Ack{subscriber, topic, id, time.Now()})
}

// Closed records that the connection of s ended.
func (h *History) Closed(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !s.Ended {
		s.Ended, s.End = true, time.Now()
	}
}

// Skipped records a "skipped" frame of s.
func (h *History) Skipped(s *Subscription, seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s.Skips = append(s.Skips, Skip{len(s.Deliveries), seq})
}

// Fault records a fault that starts now, and returns the function that
// records it healed.
func (h *History) Fault(kind, target string) (heal func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := &Fault{Kind: kind, Target: target, Start: time.Now()}
	h.Faults = append(h.Faults, f)
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		f.Healed, f.End = true, time.Now()
	}
}

// FaultsSoFar returns a copy of the faults recorded so far, for a run
// still going.
func (h *History) FaultsSoFar() []Fault {
	h.mu.Lock()
	defer h.mu.Unlock()
	faults := make([]Fault, len(h.Faults))
	for i, f := range h.Faults {
		faults[i] = *f
	}
	return faults
}

// SetFinal records a topic's final log.
func (h *History) SetFinal(topic string, log []Stored) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.Final == nil {
		h.Final = map[string][]Stored{}
	}
	h.Final[topic] = log
}

// Dead records dead letters read after the run.
func (h *History) Dead(letters []wire.DeadLetter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.DeadLetters = append(h.DeadLetters, letters...)
}

// SetDeadLetters replaces the dead letters with those a run still going
// has on disk now.
func (h *History) SetDeadLetters(letters []wire.DeadLetter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.DeadLetters = letters
}
