package popsub

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/popsub/popsub/queue"
	"github.com/popsub/popsub/wire"
)

// These tests hold work queues (popsub.go's Work queues) to protocol.md:
// each message to one member of a group, acked once, moved to another
// member when its first one does not ack or leaves.

// member is a group member whose frames a goroutine reads: it acks every
// QoS 1 delivery unless told not to, and records what it got.
type member struct {
	c    *client
	acks bool

	mu   sync.Mutex
	got  []got
	more chan struct{} // a delivery arrived
	done chan struct{} // the reader ended
}

// join subscribes c to topic in group, with extra fields, and starts
// reading for it.
func join(c *client, topic, group string, acks bool,
	extra map[string]any) *member {
	c.t.Helper()
	fields := map[string]any{"group": group}
	for k, v := range extra {
		fields[k] = v
	}
	c.subscribe(topic, fields)
	m := &member{c: c, acks: acks, more: make(chan struct{}, 1),
		done: make(chan struct{})}
	go m.read()
	return m
}

// read records deliveries until the connection ends.
func (m *member) read() {
	defer close(m.done)
	for {
		_, data, err := m.c.ws.Read(context.Background())
		if err != nil {
			return
		}
		record(m.c.t, false, data)
		var g got
		if json.Unmarshal(data, &g) != nil || g.Type != "message" {
			continue
		}
		if m.acks && g.QoS == 1 {
			frame, _ := json.Marshal(map[string]any{"type": "ack",
				"message_id": g.MessageID, "topic": g.Topic})
			m.c.ws.Write(context.Background(), websocket.MessageText, frame)
		}
		m.mu.Lock()
		m.got = append(m.got, g)
		m.mu.Unlock()
		queue.Notify(m.more)
	}
}

// deliveries returns what m got so far.
func (m *member) deliveries() []got {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

// waitUntil waits for cond over the members' deliveries, for up to 20 s.
func waitUntil(t *testing.T, what string, cond func() bool,
	members ...*member) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for !cond() {
		cases := make([]<-chan struct{}, 0, len(members))
		for _, m := range members {
			cases = append(cases, m.more)
		}
		select {
		case <-anyOf(cases):
		case <-deadline:
			t.Fatalf("waited 20 s for %s", what)
		}
	}
}

// anyOf returns a channel that receives when any of cases does, or
// after 50 ms, so that a condition is looked at again.
func anyOf(cases []<-chan struct{}) <-chan struct{} {
	out := make(chan struct{}, 1)
	for _, c := range cases {
		go func() {
			select {
			case <-c:
				queue.Notify(out)
			case <-time.After(50 * time.Millisecond):
				queue.Notify(out)
			}
		}()
	}
	if len(cases) == 0 {
		close(out)
	}
	return out
}

// firstSeqs returns the seqs of the first attempts among list.
func firstSeqs(list []got) []uint64 {
	var seqs []uint64
	for _, g := range list {
		if g.Attempt == 1 {
			seqs = append(seqs, g.Seq)
		}
	}
	return seqs
}

// ackedBy collects, from the broker's events, which connection acked
// each seq of topic.
type ackedBy struct {
	mu   sync.Mutex
	acks map[uint64][]uint64 // seq → the connections that acked it
}

// watch is an OnEvent that records acks.
func (a *ackedBy) watch(topic string) func(e wire.Event) {
	a.acks = map[uint64][]uint64{}
	return func(e wire.Event) {
		if e.Kind == "acked" && e.Topic == topic {
			a.mu.Lock()
			a.acks[e.Seq] = append(a.acks[e.Seq], e.Conn)
			a.mu.Unlock()
		}
	}
}

// count returns how many seqs were acked, and those acked more than once.
func (a *ackedBy) count() (int, []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var twice []uint64
	for seq, conns := range a.acks {
		if len(conns) > 1 {
			twice = append(twice, seq)
		}
	}
	return len(a.acks), twice
}

func TestGroups_ShareMessagesEachAckedOnce(t *testing.T) {
	var acks ackedBy
	ts := startBroker(t, Options{AckTimeout: time.Minute,
		FeatureOptions: FeatureOptions{OnEvent: acks.watch("jobs")},
	})
	var workers []*member
	for i := range 3 {
		workers = append(workers, join(ts.dial(fmt.Sprint("worker-", i)),
			"jobs", "workers", true, nil))
	}
	publisher := ts.dial("publisher")
	const n = 1000
	for i := range n {
		publisher.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1})
	}
	waitUntil(t, "every job acked", func() bool {
		acked, _ := acks.count()
		return acked == n
	}, workers...)

	var all []uint64
	for i, w := range workers {
		seqs := firstSeqs(w.deliveries())
		if len(seqs) < n/3/2 {
			t.Errorf("worker %d got %d of %d jobs: the turns are not fair",
				i, len(seqs), n)
		}
		all = append(all, seqs...)
	}
	slices.Sort(all)
	if !slices.Equal(all, span(1, n)) {
		t.Errorf("the workers got %d deliveries, not each of 1..%d once",
			len(all), n)
	}
	if _, twice := acks.count(); len(twice) > 0 {
		t.Errorf("acked more than once: %v", twice)
	}
}

func TestGroups_AMemberThatDoesNotAckLosesItsJobsToTheOthers(t *testing.T) {
	var acks ackedBy
	ts := startBroker(t, Options{AckTimeout: 100 * time.Millisecond,
		MaxRetries: 5, FeatureOptions: FeatureOptions{OnEvent: acks.watch("jobs")},
	})
	idle := join(ts.dial("idle"), "jobs", "workers", false, nil)
	busy := join(ts.dial("busy"), "jobs", "workers", true, nil)
	publisher := ts.dial("publisher")
	const n = 30
	for i := range n {
		publisher.publish("jobs", i, 1, "")
	}
	waitUntil(t, "every job acked", func() bool {
		acked, _ := acks.count()
		return acked == n
	}, idle, busy)

	if len(firstSeqs(idle.deliveries())) == 0 {
		t.Fatal("the idle member got no job: the turns skipped it")
	}
	moved := 0
	for _, g := range busy.deliveries() {
		if g.Attempt > 1 {
			moved++
		}
	}
	if moved == 0 {
		t.Error("no job moved from the idle member to the busy one")
	}
	if _, twice := acks.count(); len(twice) > 0 {
		t.Errorf("acked more than once: %v", twice)
	}
}

func TestGroups_AMemberThatDoesNotAckIsGivenNoMoreThanItsWindow(t *testing.T) {
	// The ack timeout is a minute: nothing moves by retry in this test,
	// so whatever the idle member holds, it was given.
	var acks ackedBy
	ts := startBroker(t, Options{AckTimeout: time.Minute,
		FeatureOptions: FeatureOptions{GroupWindow: 4,
			OnEvent: acks.watch("jobs")},
	})
	idleClient := ts.dial("idle")
	idle := join(idleClient, "jobs", "workers", false, nil)
	busy := join(ts.dial("busy"), "jobs", "workers", true, nil)
	publisher := ts.dial("publisher")
	const n = 200
	for i := range n {
		publisher.send(map[string]any{"type": "publish", "topic": "jobs",
			"payload": i, "qos": 1})
	}
	waitUntil(t, "every job the idle member does not hold acked",
		func() bool {
			acked, _ := acks.count()
			return acked == n-4
		}, idle, busy)
	if got := len(idle.deliveries()); got != 4 {
		t.Fatalf("the idle member holds %d jobs, want its window of 4", got)
	}

	// One ack makes room for one more job, and no more.
	first := idle.deliveries()[0]
	frame, _ := json.Marshal(map[string]any{"type": "ack",
		"message_id": first.MessageID, "topic": "jobs"})
	idleClient.ws.Write(context.Background(), websocket.MessageText, frame)
	publisher.publish("jobs", "one more", 1, "")
	publisher.publish("jobs", "and another", 1, "")
	waitUntil(t, "both new jobs delivered", func() bool {
		all := append(firstSeqs(idle.deliveries()),
			firstSeqs(busy.deliveries())...)
		return slices.Contains(all, n+1) && slices.Contains(all, n+2)
	}, idle, busy)
	if got := len(idle.deliveries()); got > 5 {
		t.Errorf("after one ack the idle member holds %d jobs, want at "+
			"most 5 in all", got)
	}
}

func TestGroups_AMemberThatLeavesHandsOnItsJobsAtOnce(t *testing.T) {
	// The ack timeout is a minute: anything that moves before it moved
	// because its member left.
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	leaving := join(ts.dial("leaving"), "jobs", "workers", false, nil)
	publisher := ts.dial("publisher")
	for i := range 4 {
		publisher.publish("jobs", i, 1, "")
	}
	waitUntil(t, "the first member's jobs", func() bool {
		return len(leaving.deliveries()) == 4
	}, leaving)
	staying := join(ts.dial("staying"), "jobs", "workers", true, nil)
	leaving.c.ws.CloseNow()
	waitUntil(t, "the jobs handed on", func() bool {
		return len(staying.deliveries()) == 4
	}, staying)
	for _, g := range staying.deliveries() {
		if g.Attempt != 2 {
			t.Errorf("seq %d came as attempt %d, want 2", g.Seq, g.Attempt)
		}
	}
}

func TestGroups_ResumeAfterARestartWithoutRedoingAckedWork(t *testing.T) {
	path := filepath.Join(t.TempDir(), "popsub.db")
	var acks ackedBy
	ts := startBroker(t, Options{Store: openBolt(t, path),
		FeatureOptions: FeatureOptions{OnEvent: acks.watch("jobs")},
	})
	first := join(ts.dial("worker"), "jobs", "workers", true, nil)
	publisher := ts.dial("publisher")
	for i := range 50 {
		publisher.publish("jobs", i, 1, "")
	}
	waitUntil(t, "fifty jobs acked", func() bool {
		acked, _ := acks.count()
		return acked == 50
	}, first)
	ts.stop()

	ts = startBroker(t, Options{Store: openBolt(t, path)})
	publisher = ts.dial("publisher")
	for i := range 50 {
		publisher.publish("jobs", 50+i, 1, "")
	}
	again := join(ts.dial("worker"), "jobs", "workers", true,
		map[string]any{"after": 0})
	waitUntil(t, "the next fifty", func() bool {
		return len(again.deliveries()) >= 50
	}, again)
	seqs := seqs(again.deliveries())
	if seqs[0] <= 50 {
		t.Errorf("after the restart the group redid seq %d, which was "+
			"acked", seqs[0])
	}
	if len(seqs) != 50 {
		t.Errorf("after the restart the group got %d jobs, want 50", len(seqs))
	}
}

func TestGroups_KeepTheirPlaceWhenEveryMemberHasLeft(t *testing.T) {
	// The only member joins and leaves before any job; two jobs come
	// while the group has nobody. The next member gets both: the group's
	// place was on disk from its first join, not from its first
	// delivery.
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	publisher := ts.dial("publisher")
	publisher.publish("jobs", "before", 1, "")
	first := join(ts.dial("first"), "jobs", "workers", false, nil)
	first.c.send(map[string]any{"type": "ping"})
	first.c.ws.CloseNow()
	<-first.done
	waitFor(t, func() bool { return ts.broker.open.Load() == 1 },
		"the first member to leave")
	publisher.publish("jobs", 1, 1, "")
	publisher.publish("jobs", 2, 1, "")
	next := join(ts.dial("next"), "jobs", "workers", true, nil)
	waitUntil(t, "the two jobs", func() bool {
		return len(next.deliveries()) == 2
	}, next)
	if got := seqs(next.deliveries()); !slices.Equal(got, []uint64{2, 3}) {
		t.Errorf("the next member got seqs %v, want [2 3]", got)
	}
}

func TestGroups_AJobLeftWhileAMemberJoinsReachesIt(t *testing.T) {
	// The only member leaves with an unacked job while a second is
	// between its reply and its join: the group lives on with nobody in
	// it, keeps the job, and hands it to the second when it joins.
	ts := startBroker(t, Options{AckTimeout: time.Minute})
	first := join(ts.dial("first"), "jobs", "workers", false, nil)
	ts.dial("publisher").publish("jobs", "job", 1, "j-1")
	waitUntil(t, "the first member's job", func() bool {
		return len(first.deliveries()) == 1
	}, first)

	second := ts.dial("second")
	var c *connection
	for _, each := range ts.broker.connectionList() {
		if each.subject == "second" {
			c = each
		}
	}
	s := c.newSubscription("jobs", ts.broker.pinTopic("jobs"), "")
	g, r, start, ok := ts.broker.prepareJoin(s,
		frame{Type: "subscribe", Topic: "jobs", Group: "workers"})
	if !ok {
		t.Fatalf("prepareJoin: %+v", r)
	}
	first.c.ws.CloseNow()
	waitFor(t, func() bool {
		return len(g.list()) == 0 &&
			ts.broker.open.Load() == 2
	}, "the first member to leave")
	g.join(s, start)
	if g := second.expect("message"); g.MessageID != "j-1" || g.Attempt != 2 {
		t.Fatalf("the second member got %+v, want j-1 as attempt 2", g)
	}
}

func TestGroups_EachGroupAndEachSubscriberGetsEverything(t *testing.T) {
	ts := startBroker(t, Options{})
	a1 := join(ts.dial("a1"), "jobs", "a", true, nil)
	a2 := join(ts.dial("a2"), "jobs", "a", true, nil)
	b1 := join(ts.dial("b1"), "jobs", "b", true, nil)
	plain := ts.dial("plain")
	plain.subscribe("jobs", map[string]any{"last": 0})
	publisher := ts.dial("publisher")
	const n = 20
	for i := range n {
		publisher.publish("jobs", i, 1, "")
	}
	waitUntil(t, "both groups' jobs", func() bool {
		return len(a1.deliveries())+len(a2.deliveries()) == n &&
			len(b1.deliveries()) == n
	}, a1, a2, b1)
	a := append(firstSeqs(a1.deliveries()), firstSeqs(a2.deliveries())...)
	slices.Sort(a)
	if !slices.Equal(a, span(1, n)) {
		t.Errorf("group a got %v", a)
	}
	if len(firstSeqs(a1.deliveries())) == 0 ||
		len(firstSeqs(a2.deliveries())) == 0 {
		t.Error("one member of group a got nothing")
	}
	wantSeqs(t, plain.messages(n), span(1, n))
}

func TestGroups_RefusedWhereTheyCannotWork(t *testing.T) {
	ts := startBroker(t, Options{})
	c := ts.dial("worker")
	cases := map[string]map[string]any{
		"a wildcard":   {"type": "subscribe", "topic": "jobs/+", "group": "w"},
		"with durable": {"type": "subscribe", "topic": "jobs", "group": "w", "durable": "d"},
		"a NUL":        {"type": "subscribe", "topic": "jobs", "group": "w\x00"},
	}
	for name, frame := range cases {
		t.Run(name, func(t *testing.T) {
			c.t = t
			c.send(frame)
			c.expectError("bad_frame")
		})
	}
}

// TestGroups_OnTheRunsEngine runs on both engines: on bbolt a group
// works; on a shared log it is refused, and the refusal says why.
func TestGroups_OnTheRunsEngine(t *testing.T) {
	ts := startBroker(t, Options{})
	c := ts.dial("worker")
	c.send(map[string]any{"type": "subscribe", "topic": "jobs",
		"group": "workers"})
	if ts.broker.appendShared == nil {
		c.expect("subscribed")
		return
	}
	if g := c.expectError("bad_frame"); g.Message !=
		"groups need the broker's own log, not a shared one" {
		t.Fatalf("refused with %q", g.Message)
	}
}

// A group whose jobs mix QoS 0 and QoS 1, beside a member whose window
// is full and never empties, hands out every job (a QoS 0 one once, to
// one member; a QoS 1 one until a member acks it) and never stops; after
// a restart it redoes none of them. NATS's work queues stalled this year
// when a QoS 0 delivery never counted as done.
func TestGroups_QoS0JobsBesideAFullWindowNeverStopTheGroup(t *testing.T) {
	var acks ackedBy
	ts := startBroker(t, Options{AckTimeout: 100 * time.Millisecond,
		MaxRetries: 50, FeatureOptions: FeatureOptions{GroupWindow: 4,
			OnEvent: acks.watch("jobs")},
	})
	full := join(ts.dial("full"), "jobs", "workers", false, nil)
	busy := join(ts.dial("busy"), "jobs", "workers", true, nil)
	publisher := ts.dial("publisher")
	const n = 300 // every third a QoS 0 job
	qos := func(i int) int { return min(i%3, 1) }
	for i := range n {
		publisher.publish("jobs", i, qos(i), fmt.Sprint("j", i))
	}
	got := func() map[string]int {
		ids := map[string]int{}
		for _, m := range []*member{full, busy} {
			for _, g := range m.deliveries() {
				if g.QoS == 0 || m == busy {
					ids[g.MessageID]++
				}
			}
		}
		return ids
	}
	waitUntil(t, "every job handed out, each QoS 1 one acked", func() bool {
		acked, _ := acks.count()
		return acked == 2*n/3 && len(got()) == n
	}, full, busy)
	if len(firstSeqs(full.deliveries())) < 4 {
		t.Fatalf("the member that does not ack got %d jobs, want its "+
			"window's worth at least", len(full.deliveries()))
	}
	for id, times := range got() {
		var i int
		fmt.Sscan(strings.TrimPrefix(id, "j"), &i)
		if qos(i) == 0 && times != 1 {
			t.Errorf("QoS 0 job %s was delivered %d times, want once", id,
				times)
		}
	}

	// Restarted, the group takes up after every job: the next is new.
	ts = ts.restart()
	again := join(ts.dial("busy"), "jobs", "workers", true, nil)
	ts.dial("publisher").publish("jobs", "after", 1, "after")
	waitUntil(t, "the next job", func() bool {
		return len(again.deliveries()) > 0
	}, again)
	if g := again.deliveries()[0]; g.MessageID != "after" {
		t.Fatalf("after the restart the group gave %s, want after", g.MessageID)
	}
}

// A group's place is in the log, so the log's caps bound it as they bound
// any subscriber: a backlog past MaxMessages is lost to the group, its
// member hears how much in a skipped frame, and the group goes on with
// what the log keeps. A restart resumes past the gap, saying it again to
// nobody and redoing nothing (tutorial 9 and protocol.md say so).
func TestGroups_ABacklogPastTheLogsCapIsSkippedAndSaid(t *testing.T) {
	ts := startBroker(t, Options{AckTimeout: time.Minute, MaxMessages: 10,
		FeatureOptions: FeatureOptions{GroupWindow: 1}})
	worker := ts.dial("worker")
	worker.subscribe("jobs", map[string]any{"group": "workers",
		"after": 0})
	publisher := ts.dial("publisher")
	const n = 30
	for i := range n {
		publisher.publish("jobs", i, 1, "")
	}

	// The window held job 1; the log kept 21 to 30 of the rest. The
	// group's replay tells its member of each gap as it finds one, while
	// the burst goes on: together they say 2 to 20, once each.
	first := worker.expect("message")
	if first.Seq != 1 {
		t.Fatalf("first job seq %d, want 1", first.Seq)
	}
	worker.ack(first)
	told := uint64(1) // the last seq the member has heard of
	for told < n {
		switch g := worker.next(); {
		case g.Type == "skipped" && g.Seq-g.Missed == told && g.Seq < 21:
			told = g.Seq
		case g.Type == "message" && g.Seq == told+1 && g.Seq >= 21 &&
			g.Attempt == 1:
			told = g.Seq
			worker.ack(g)
		default:
			t.Fatalf("after seq %d got %+v: want a skip on from it, "+
				"up to 20, or the next job the log keeps", told, g)
		}
	}
	worker.quiet()

	ts = ts.restart()
	worker = ts.dial("worker")
	worker.subscribe("jobs", map[string]any{"group": "workers"})
	ts.dial("publisher").publish("jobs", "after the restart", 1, "")
	if g := worker.expect("message"); g.Seq <= n || g.Attempt != 1 {
		t.Fatalf("after the restart got seq %d attempt %d, want the new "+
			"job, past %d", g.Seq, g.Attempt, n)
	}
}
