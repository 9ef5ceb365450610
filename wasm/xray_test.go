package main

import (
	"encoding/json"
	"fmt"
	"github.com/popsub/popsub/wire"
	"strings"
	"testing"
)

func TestXray_FollowsAQoS1Delivery(t *testing.T) {
	x := newXray()
	x.apply(event{Kind: "connected", Conn: 1, Client: "alice", Sub: "local"})
	x.apply(event{Kind: "subscribed", Conn: 1, Client: "alice",
		Topic: "jobs"})
	x.apply(event{Kind: "published", Topic: "jobs", Seq: 1, QoS: 1,
		MessageID: "m"})
	delivered := event{Kind: "delivered", Conn: 1, Topic: "jobs", Seq: 1,
		QoS: 1, MessageID: "m", Attempt: 1}
	x.apply(delivered)
	if x.topics["jobs"] != 1 || len(x.pending) != 1 {
		t.Fatalf("after delivery: topics %v, pending %v", x.topics, x.pending)
	}
	delivered.Kind, delivered.Attempt = "redelivered", 2
	x.apply(delivered)
	if p := x.sortedPending(0); len(p) != 1 || p[0].Attempt != 2 {
		t.Fatalf("after retry: pending %v, want attempt 2", p)
	}
	if p := x.sortedPending(1); len(p) != 0 {
		t.Fatalf("the watcher's own deliveries are listed: %v", p)
	}
	delivered.Kind = "dead_lettered"
	x.apply(delivered)
	if len(x.pending) != 0 {
		t.Fatalf("after dead letter: pending %v", x.pending)
	}
	x.apply(event{Kind: "disconnected", Conn: 1})
	if len(x.connections) != 0 {
		t.Fatalf("connections %v", x.connections)
	}
}

func TestXray_SnapshotReplacesState(t *testing.T) {
	x := newXray()
	x.apply(event{Kind: "connected", Conn: 9})
	var snap event
	if err := jsonUnmarshal(`{"event":"snapshot","state":{"topics":{"a":3},
		"connections":[{"conn":2,"sub":"bob","subscriptions":["a"]}],
		"pending":[{"conn":2,"topic":"a","seq":3,"message_id":"x","qos":1,
		"attempt":1}]}}`, &snap); err != nil {
		t.Fatal(err)
	}
	x.apply(snap)
	if x.topics["a"] != 3 || x.connections[9] != nil ||
		x.connections[2].subscriptions[0] != "a" || len(x.pending) != 1 {
		t.Fatalf("after snapshot: %+v", x)
	}
}

// A reloaded page learns of $dead/jobs from the snapshot, reads it once,
// and lists each dead letter once by the client's name, however often
// the broker replays it.
func TestXray_DeadLettersComeFromTheirTopic(t *testing.T) {
	x := newXray()
	x.apply(event{Kind: "snapshot", State: &wire.State{Topics: map[string]uint64{
		"jobs": 4, "$dead/jobs": 2}}})
	if got := x.unreadDeadTopics(); len(got) != 1 || got[0] != "$dead/jobs" {
		t.Fatalf("dead topics to read: %v", got)
	}
	if got := x.unreadDeadTopics(); len(got) != 0 {
		t.Fatalf("read twice: %v", got)
	}
	payload := json.RawMessage(`{"topic":"jobs","message_id":"m","seq":3,
		"attempts":3,"subscriber":"local","client":"alice"}`)
	x.addDead("$dead/jobs", 2, payload)
	x.addDead("$dead/jobs", 2, payload)
	x.addDead("$dead/jobs", 1, json.RawMessage(`{"topic":"jobs","seq":1,
		"subscriber":"local"}`))
	if len(x.dead) != 2 || x.dead[1].who() != "alice" ||
		x.dead[0].who() != "local" || x.dead[1].Seq != 3 {
		t.Fatalf("dead letters: %+v", x.dead)
	}
	x.forgetDeadTopics()
	x.apply(event{Kind: "published", Topic: "$dead/other", Seq: 1})
	if got := x.unreadDeadTopics(); len(got) != 2 {
		t.Fatalf("after a new connection, read again: %v", got)
	}
}

// scenario feeds the events of the guided run for alice (connection 1,
// withholding) and bob (connection 2), and returns the story after each
// of its four steps.
func TestStory_FollowsTheGuidedRun(t *testing.T) {
	s := newStory()
	s.own(1, "alice")
	s.own(2, "bob")
	s.withhold("alice", true)
	s.wrote("c-1", "carol")
	m := event{Topic: "jobs", Seq: 1, QoS: 1, MessageID: "c-1"}
	at := func(kind string, conn uint64, attempt int) event {
		e := m
		e.Kind, e.Conn, e.Attempt = kind, conn, attempt
		return e
	}
	s.apply(at("published", 0, 0))
	s.apply(at("committed", 0, 0))
	first := at("delivered", 1, 1)
	first.Time = 1
	s.apply(first)
	s.apply(at("delivered", 2, 1))
	if s.progress != 0 || s.rows.m[rowKey{"alice", "jobs", "c-1"}].State !=
		statePending {
		t.Fatalf("before any ack: progress %d, rows %v", s.progress, s.rows.m)
	}
	s.apply(at("acked", 2, 1))
	if s.progress != 2 {
		t.Fatalf("bob acked what alice owes: progress %d, want 2",
			s.progress)
	}
	retry := at("redelivered", 1, 2)
	retry.Time = 400
	s.apply(retry)
	if label := s.steps[len(s.steps)-1].Label; label !=
		"retry jobs #1 · attempt 2 · 0.4 s later" {
		t.Fatalf("the retry says %q", label)
	}
	if s.progress != 3 || s.rows.m[rowKey{"alice", "jobs", "c-1"}].State !=
		stateRetried {
		t.Fatalf("attempt 2: progress %d, row %+v", s.progress,
			s.rows.m[rowKey{"alice", "jobs", "c-1"}])
	}
	s.ackSent("alice", "jobs", "c-1")
	s.apply(at("dead_lettered", 1, 2))
	if s.progress != 4 {
		t.Fatalf("dead letter: progress %d, want 4", s.progress)
	}
	if r := s.rows.m[rowKey{"alice", "jobs", "c-1"}]; r.State != stateTooLate {
		t.Fatalf("an ack sent before the dead letter: %+v, want %q", r,
			stateTooLate)
	}
	if r := s.rows.m[rowKey{"bob", "jobs", "c-1"}]; r.State != stateAcked {
		t.Fatalf("bob's row: %+v", r)
	}
	var kinds []string
	for _, st := range s.steps {
		kinds = append(kinds, st.Kind+":"+st.From+">"+st.To)
	}
	want := "publish:carol>broker commit:broker>broker " +
		"deliver:broker>alice deliver:broker>bob ack:bob>broker " +
		"retry:broker>alice dead:broker>$dead"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("diagram:\n got %s\nwant %s", got, want)
	}
}

func TestStory_AGroupMovesADelivery(t *testing.T) {
	// Alice's delivery of a group's job moves to Bob: her row says so,
	// the x-ray forgets her pending ack, Bob's retry names her, and the
	// guide's retry step, about a subscriber retried alone, stays undone.
	s, x := newStory(), newXray()
	s.own(1, "alice")
	s.own(2, "bob")
	m := event{Topic: "jobs", Seq: 1, QoS: 1, MessageID: "c-1"}
	for _, e := range []event{
		{Kind: "delivered", Conn: 1, Attempt: 1},
		{Kind: "moved", Conn: 1, Attempt: 1},
		{Kind: "redelivered", Conn: 2, Attempt: 2},
	} {
		e.Topic, e.Seq, e.QoS, e.MessageID = m.Topic, m.Seq, m.QoS, m.MessageID
		s.apply(e)
		x.apply(e)
	}
	if r := s.rows.m[rowKey{"alice", "jobs", "c-1"}]; r.State != stateMoved {
		t.Fatalf("alice's row: %+v", r)
	}
	if r := s.rows.m[rowKey{"bob", "jobs", "c-1"}]; r.State != stateRetried ||
		r.Attempt != 2 {
		t.Fatalf("bob's row: %+v", r)
	}
	if label := s.steps[len(s.steps)-1].Label; label !=
		"jobs #1 from alice · attempt 2" {
		t.Fatalf("bob's retry says %q", label)
	}
	if s.progress >= 3 || !s.shared {
		t.Fatalf("progress %d, shared %v: want below 3, and shared",
			s.progress, s.shared)
	}
	if len(x.pending) != 1 {
		t.Fatalf("pending: %v, want bob's alone", x.pending)
	}
	for _, p := range x.pending {
		if p.Conn != 2 {
			t.Fatalf("pending: %v, want bob's alone", x.pending)
		}
	}
}

func TestStory_OthersAndOwnTopics(t *testing.T) {
	s := newStory()
	s.apply(event{Kind: "published", Topic: "jobs", Seq: 1, MessageID: "x"})
	s.apply(event{Kind: "delivered", Conn: 7, Topic: "jobs", Seq: 1,
		QoS: 1, MessageID: "x", Attempt: 1})
	s.apply(event{Kind: "acked", Conn: 7, Topic: "jobs", Seq: 1,
		MessageID: "x", Attempt: 1})
	s.apply(event{Kind: "delivered", Conn: 7, Topic: "$dead/jobs", Seq: 1})
	if len(s.steps) != 3 || s.steps[0].From != otherLane ||
		s.steps[1].To != otherLane || s.progress != 0 {
		t.Fatalf("another program's messages: %+v, progress %d", s.steps,
			s.progress)
	}
	s.own(3, "bob")
	s.disown(3)
	if s.lane(3) != otherLane {
		t.Fatal("a closed connection's number still names its panel")
	}
	s.restart()
	if len(s.steps) != 0 || len(s.rows.m) != 0 || s.progress != 0 {
		t.Fatalf("after restart: %+v", s)
	}
}

// A page open for a long session remembers a bounded number of rows.
func TestStory_ForgetsTheOldest(t *testing.T) {
	s := newStory()
	s.own(1, "alice")
	for i := range maxRemembered + 10 {
		s.apply(event{Kind: "delivered", Conn: 1, Topic: "t",
			Seq: uint64(i + 1), QoS: 1, MessageID: fmt.Sprint(i)})
	}
	if len(s.rows.m) != maxRemembered || s.rows.m[rowKey{"alice", "t",
		"0"}] != nil || s.rows.m[rowKey{"alice", "t", "10"}] == nil {
		t.Fatalf("%d rows remembered", len(s.rows.m))
	}
}

// An ack that is merely on its way, while another panel's came first, is
// not the guide's second step: only a panel that withholds makes it.
func TestStory_StepTwoNeedsAPanelThatWithholds(t *testing.T) {
	s := newStory()
	s.own(1, "alice")
	s.own(2, "bob")
	m := event{Topic: "jobs", Seq: 1, QoS: 1, MessageID: "c-1"}
	for _, e := range []struct {
		kind string
		conn uint64
	}{{"published", 0}, {"delivered", 1}, {"delivered", 2}, {"acked", 2},
		{"acked", 1}} {
		m.Kind, m.Conn, m.Attempt = e.kind, e.conn, 1
		s.apply(m)
		if s.progress > 1 {
			t.Fatalf("after %s from %d: progress %d, want at most 1",
				e.kind, e.conn, s.progress)
		}
	}
	if s.progress != 1 {
		t.Fatalf("progress %d after two acks, want 1", s.progress)
	}
}
