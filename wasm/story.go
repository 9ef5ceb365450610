package main

import (
	"fmt"
	"slices"
	"strings"
)

// This file is the story the page tells about each message: the steps of
// the sequence diagram, the state of each row a panel shows, and how far
// the guided run has come. All three are folded from the broker's own
// events, never from what the page guessed: a row says "acked" because
// the broker said it cleared the delivery, not because a button was
// pressed. Like the x-ray's model, it has no DOM in it.

// clientNames are the page's clients, in the order of their panels; the
// first two subscribe to jobs when the page opens, the third publishes.
var clientNames = []string{"alice", "bob", "carol"}

// Lanes of the diagram besides the panels' own.
const (
	brokerLane = "broker"
	otherLane  = "others" // connections of other pages and programs
	deadLane   = "$dead"  // the dead-letter topics
)

// maxSteps bounds the steps the diagram keeps.
const maxSteps = 80

// step is one line of the sequence diagram: an arrow between two lanes,
// or a note on one lane when From equals To.
type step struct {
	Serial    int    // counts steps from 1, so the renderer knows the new
	Kind      string // publish, commit, deliver, retry, move, ack, dead
	From, To  string // lanes
	Label     string // the short text on the arrow
	Detail    string // one sentence, for the tooltip and the reader
	Topic     string
	Seq       uint64
	MessageID string
	Attempt   int
	Time      int64  // Unix ms, the broker's
	Client    string // the lane of the client it concerns, if any
}

// Row states: what a panel's row of a delivery says, in words.
const (
	statePending  = "pending ack"
	stateRetried  = "retried"
	stateMoved    = "moved to another member"
	stateAcked    = "acked"
	stateDead     = "dead-lettered"
	stateTooLate  = "ack too late"
	stateReceived = "received"
)

// rowKey names a delivery as a panel shows it: the panel, the topic and
// the message. A reconnected panel's delivery of the same message is the
// same row.
type rowKey struct{ panel, topic, id string }

// rowState is what the broker said about one row's delivery.
type rowState struct {
	State   string
	Attempt int
	AckSent bool  // the panel sent an ack; a dead letter after it was late
	Sent    int64 // when the latest attempt went out, Unix ms
}

// story folds events into the diagram, the rows' states and the guide.
type story struct {
	steps    []step
	serial   int
	lanes    map[uint64]string        // connection → the panel that opened it
	authors  *fifo[string, string]    // message_id → the panel that published it
	rows     *fifo[rowKey, *rowState] // what the broker said of each row
	acked    *fifo[string, []string]  // message → the panels that acked it
	moved    *fifo[string, string]    // message → the lane a group took it from
	progress int                      // guide steps done, 0 to 4
	// shared says a group moved a panel's delivery to another panel:
	// the guide's work-queue step happened.
	shared bool
	// withholding says which panels withhold their acks: the guide's
	// second step is about one of them, not about an ack on its way.
	withholding map[string]bool
}

// maxRemembered bounds what the story remembers of messages: a page left
// open through a long session must not grow without end.
const maxRemembered = 4096

// fifo is a map that forgets its oldest keys past maxRemembered.
type fifo[K comparable, V any] struct {
	m     map[K]V
	order []K // keys, oldest first
}

// newFIFO returns an empty fifo.
func newFIFO[K comparable, V any]() *fifo[K, V] {
	return &fifo[K, V]{m: map[K]V{}}
}

// put sets k to v, forgetting the oldest key if there are too many.
func (f *fifo[K, V]) put(k K, v V) {
	if _, ok := f.m[k]; !ok {
		f.order = append(f.order, k)
		if len(f.order) > maxRemembered {
			delete(f.m, f.order[0])
			f.order = f.order[1:]
		}
	}
	f.m[k] = v
}

// newStory returns an empty story.
func newStory() *story {
	return &story{lanes: map[uint64]string{}, withholding: map[string]bool{},
		authors: newFIFO[string, string](), rows: newFIFO[rowKey, *rowState](),
		acked: newFIFO[string, []string](), moved: newFIFO[string, string]()}
}

// restart forgets the diagram, the rows and the guide's progress, for a
// run from the start; which connection is whose stays known.
func (s *story) restart() {
	s.steps, s.progress = nil, 0
	s.rows = newFIFO[rowKey, *rowState]()
	s.acked = newFIFO[string, []string]()
	s.moved, s.shared = newFIFO[string, string](), false
}

// withhold records whether panel withholds its acks.
func (s *story) withhold(panel string, on bool) {
	s.withholding[panel] = on
}

// own says connection conn is panel's, from its authenticated reply.
func (s *story) own(conn uint64, panel string) {
	s.lanes[conn] = panel
}

// disown forgets conn when it closes: after a restart the broker numbers
// connections from 1 again, and the number may then be someone else's.
func (s *story) disown(conn uint64) {
	delete(s.lanes, conn)
}

// wrote records that panel published id, so its publish is drawn from
// its lane.
func (s *story) wrote(id, panel string) {
	s.authors.put(id, panel)
}

// ackSent records that panel sent an ack for topic and id.
func (s *story) ackSent(panel, topic, id string) {
	s.row(rowKey{panel, topic, id}).AckSent = true
}

// row returns the state of key, made on first use.
func (s *story) row(key rowKey) *rowState {
	r := s.rows.m[key]
	if r == nil {
		r = &rowState{State: stateReceived}
		s.rows.put(key, r)
	}
	return r
}

// state returns what the broker said of key's delivery, if anything.
func (s *story) state(key rowKey) (rowState, bool) {
	r := s.rows.m[key]
	if r == nil {
		return rowState{}, false
	}
	return *r, true
}

// lane is the lane of connection conn.
func (s *story) lane(conn uint64) string {
	if panel, ok := s.lanes[conn]; ok {
		return panel
	}
	return otherLane
}

// apply folds one event into the story. Events about the broker's own
// topics ($sys, $dead) are not part of it: the dead-letter table shows
// those.
func (s *story) apply(e event) {
	if strings.HasPrefix(e.Topic, "$") {
		return
	}
	switch e.Kind {
	case "published":
		author := s.authors.m[e.MessageID]
		if author == "" {
			author = otherLane
		}
		s.add(e, "publish", author, brokerLane, fmt.Sprintf(
			"publish %s #%d", e.Topic, e.Seq), fmt.Sprintf("%s published "+
			"to %s with QoS %d; the broker gave it seq %d", author, e.Topic,
			e.QoS, e.Seq))
	case "committed":
		s.add(e, "commit", brokerLane, brokerLane, fmt.Sprintf(
			"%s #%d in the log", e.Topic, e.Seq), fmt.Sprintf("%s #%d is in "+
			"the log: it survives a crash, and a QoS 1 publisher hears "+
			"published", e.Topic, e.Seq))
	case "delivered", "redelivered", "nakked", "moved", "acked",
		"dead_lettered":
		s.applyDelivery(e)
	}
}

// applyDelivery folds what happened to one subscriber's delivery.
func (s *story) applyDelivery(e event) {
	lane := s.lane(e.Conn)
	r := s.row(rowKey{lane, e.Topic, e.MessageID})
	r.Attempt = max(r.Attempt, e.Attempt)
	switch e.Kind {
	case "delivered":
		r.State, r.Attempt, r.AckSent = stateReceived, e.Attempt, false
		r.Sent = e.Time
		if e.QoS == 1 {
			r.State = statePending
		}
		s.add(e, "deliver", brokerLane, lane, fmt.Sprintf("deliver %s #%d",
			e.Topic, e.Seq), fmt.Sprintf("%s #%d to %s, attempt %d", e.Topic,
			e.Seq, lane, e.Attempt))
	case "redelivered":
		if s.applyRetry(e, lane, r) {
			// A move is the work-queue step's, not the guide's retry.
			return
		}
	case "nakked":
		s.add(e, "retry", lane, brokerLane, fmt.Sprintf("nak %s #%d · "+
			"retry in %.1f s", e.Topic, e.Seq, float64(e.Deadline-e.Time)/
			1000), fmt.Sprintf("%s handed %s #%d back with a nak: the "+
			"broker retries it %.1f s from now, as the next attempt", lane,
			e.Topic, e.Seq, float64(e.Deadline-e.Time)/1000))
	case "moved":
		r.State = stateMoved
		s.moved.put(e.Topic+"\x00"+e.MessageID, lane)
		s.add(e, "move", lane, lane, fmt.Sprintf("%s #%d moves on", e.Topic,
			e.Seq), fmt.Sprintf("%s did not ack %s #%d in time, or left "+
			"its group: the broker takes the delivery back, for another "+
			"member, as attempt %d", lane, e.Topic, e.Seq, e.Attempt+1))
	case "acked":
		r.State = stateAcked
		s.noteAck(e, lane)
		s.add(e, "ack", lane, brokerLane, fmt.Sprintf("ack %s #%d", e.Topic,
			e.Seq), fmt.Sprintf("%s acked %s #%d: the broker forgets its "+
			"delivery to %s", lane, e.Topic, e.Seq, lane))
	case "dead_lettered":
		r.State = stateDead
		if r.AckSent {
			r.State = stateTooLate
		}
		s.add(e, "dead", brokerLane, deadLane, fmt.Sprintf("✕ %s #%d of %s → "+
			"$dead/%s%s", e.Topic, e.Seq, lane, e.Topic, waited(r.Sent,
			e.Time)), fmt.Sprintf("%s never acked %s #%d in %d "+
			"attempts: it goes to $dead/%s", lane, e.Topic, e.Seq, e.Attempt,
			e.Topic))
	}
	s.advance(e, lane)
}

// applyRetry folds a retry into the row: one to the subscriber that owes
// the ack, or one that a group moved to this member from another, and
// reports which.
func (s *story) applyRetry(e event, lane string, r *rowState) bool {
	label := fmt.Sprintf("retry %s #%d · attempt %d%s", e.Topic, e.Seq,
		e.Attempt, waited(r.Sent, e.Time))
	detail := fmt.Sprintf("no ack from %s in time: the broker sends %s "+
		"#%d again, to %s only; each retry waits about twice as long as "+
		"the one before (it looks for overdue acks every fifth of the "+
		"ack timeout, so a retry comes up to that much after it)",
		lane, e.Topic, e.Seq, lane)
	key := e.Topic + "\x00" + e.MessageID
	from := s.moved.m[key]
	moved := from != "" && from != lane
	if moved {
		s.moved.put(key, "")
		s.shared = s.shared || from != otherLane && lane != otherLane
		label = fmt.Sprintf("%s #%d from %s · attempt %d", e.Topic, e.Seq,
			from, e.Attempt)
		detail = fmt.Sprintf("%s, of the same group, did not ack %s #%d "+
			"in time, or left: %s takes it over as attempt %d, and owes "+
			"its ack now", from, e.Topic, e.Seq, lane, e.Attempt)
	}
	r.State, r.Sent = stateRetried, e.Time
	s.add(e, "retry", brokerLane, lane, label, detail)
	return moved
}

// noteAck remembers who acked a message, for the guide.
func (s *story) noteAck(e event, lane string) {
	key := e.Topic + "\x00" + e.MessageID
	s.acked.put(key, append(s.acked.m[key], lane))
}

// advance moves the guide on when e completes one of its steps: (1) a
// panel acked a QoS 1 message; (2) one panel acked a message another
// still owes; (3) a panel got attempt 2; (4) a panel's delivery went to
// $dead. A later step done implies the earlier ones.
func (s *story) advance(e event, lane string) {
	if lane == otherLane {
		return
	}
	done := 0
	switch {
	case e.Kind == "dead_lettered":
		done = 4
	case e.Kind == "redelivered" && e.Attempt >= 2:
		done = 3
	case e.Kind == "acked":
		done = 1
	}
	if done < 2 && s.ackedByAnother(e) {
		done = 2
	}
	s.progress = max(s.progress, done)
}

// ackedByAnother reports whether one panel acked e's message while
// another, which withholds its acks, still owes it: each subscriber acks
// for itself.
func (s *story) ackedByAnother(e event) bool {
	acked := s.acked.m[e.Topic+"\x00"+e.MessageID]
	if len(acked) == 0 {
		return false
	}
	for _, panel := range clientNames {
		r := s.rows.m[rowKey{panel, e.Topic, e.MessageID}]
		owes := r != nil && (r.State == statePending ||
			r.State == stateRetried)
		// A panel whose automatic ack is on its way owes for a moment
		// too: only one that withholds is the step's.
		if owes && s.withholding[panel] && !slices.Contains(acked, panel) {
			return true
		}
	}
	return false
}

// add appends a step, keeping the newest maxSteps.
func (s *story) add(e event, kind, from, to, label, detail string) {
	s.serial++
	client := s.lane(e.Conn)
	if e.Conn == 0 {
		client = ""
	}
	s.steps = append(s.steps, step{Serial: s.serial, Kind: kind, From: from,
		To: to, Label: label, Detail: detail, Topic: e.Topic, Seq: e.Seq,
		MessageID: e.MessageID, Attempt: e.Attempt, Time: e.Time,
		Client: client})
	if len(s.steps) > maxSteps {
		s.steps = s.steps[len(s.steps)-maxSteps:]
	}
}

// waited says how long after the attempt sent at sent an event at now
// came: the ack timeout a learner sees pass.
func waited(sent, now int64) string {
	if sent == 0 || now < sent {
		return ""
	}
	return fmt.Sprintf(" · %.1f s later", float64(now-sent)/1000)
}
