package chaos

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub/wire"
)

// clean is a small history that keeps every promise: alice publishes
// two values, bob reads them live and durably, the group workers shares
// them between two members, the log keeps both.
func clean() *History {
	h := &History{}
	h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-1", Value: "v1"})
	h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-2", Value: "v2"})
	h.Confirmed(Confirm{Publisher: "alice", Topic: "jobs", ID: "a-1", Seq: 1, Duplicate: false})
	h.Confirmed(Confirm{Publisher: "alice", Topic: "jobs", ID: "a-2", Seq: 2, Duplicate: false})
	s := h.Subscribed(&Subscription{Subscriber: "bob", Topic: "jobs",
		Durable: "bob"})
	h.Replied(s, 0, true)
	h.Delivered(s, Delivery{Seq: 1, ID: "a-1", Value: "v1", Attempt: 1})
	h.Delivered(s, Delivery{Seq: 1, ID: "a-1", Value: "v1", Attempt: 2})
	h.Delivered(s, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 1})
	for i, id := range []string{"a-1", "a-2"} {
		s := h.Subscribed(&Subscription{Subscriber: []string{"w1", "w2"}[i],
			Topic: "jobs", Group: "workers"})
		h.Replied(s, 0, true)
		h.Delivered(s, Delivery{Seq: uint64(i + 1), ID: id, Value: "v" + id[2:], Attempt: 1})
	}
	h.SetFinal("jobs", []Stored{{1, "a-1", "v1"}, {2, "a-2", "v2"}})
	h.Fault("kill", "broker-1")()
	return h
}

// violated returns the invariants r says were broken.
func violated(r Report) []string {
	var names []string
	for _, l := range r.Lines {
		if l.Violations > 0 {
			names = append(names, l.Invariant)
		}
	}
	return names
}

func TestCheck_ACleanHistoryPasses(t *testing.T) {
	r := Check(clean())
	if !r.OK() {
		t.Fatalf("a clean history was refused:\n%s", r)
	}
	if r.Attempted != 2 || r.Confirmed != 2 || r.Deliveries != 5 ||
		r.Redeliveries != 1 || r.Stored != 2 || r.Faults["kill"] != 1 {
		t.Fatalf("counts are off:\n%s", r)
	}
}

func TestCheck_FindsEachViolation(t *testing.T) {
	cases := []struct {
		name      string
		break_    func(h *History)
		invariant string
	}{
		{"a confirmed value missing from the log", func(h *History) {
			h.Final["jobs"] = h.Final["jobs"][:1]
		}, "every confirmed value is in the final log"},
		{"a value stored at another seq than its confirm's", func(h *History) {
			h.Confirms[1].Seq = 7
		}, "each is stored at the seq its confirm named"},
		{"a seq delivered as one value and stored as another",
			func(h *History) {
				s := h.Subscriptions[0]
				s.Deliveries = append(s.Deliveries, Delivery{Seq: 3, ID: "a-3", Value: "v3", Attempt: 1})
				h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-3", Value: "v3"})
				h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-4", Value: "v4"})
				h.Final["jobs"] = append(h.Final["jobs"],
					Stored{3, "a-4", "v4"})
				h.Fault("kill", "broker-1")() // what left them unanswered
			}, "no seq names two values, across every crash"},
		{"one message_id stored twice", func(h *History) {
			h.Final["jobs"] = append(h.Final["jobs"], Stored{3, "a-2", "v2"})
		}, "no message_id is stored under two seqs"},
		{"a delivery nobody published", func(h *History) {
			h.Subscriptions[0].Deliveries[0].Value = "forged"
		}, "nothing is read that was never published"},
		{"a seq older than one already delivered", func(h *History) {
			s := h.Subscriptions[0]
			s.Deliveries[0], s.Deliveries[2] = s.Deliveries[2],
				s.Deliveries[0]
		}, "each subscription's seqs come in order"},
		{"the same attempt twice", func(h *History) {
			s := h.Subscriptions[0]
			s.Deliveries[1].Attempt = 1
		}, "each subscription's seqs come in order"},
		{"a stored message skipped", func(h *History) {
			s := h.Subscribed(&Subscription{Subscriber: "carol",
				Topic: "jobs"})
			h.Replied(s, 0, true)
			h.Delivered(s, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 1})
		}, "no subscription skips a message unannounced"},
		{"a durable subscriber that never got a confirmed value",
			func(h *History) {
				s := h.Subscriptions[0]
				s.Deliveries = s.Deliveries[:2]
			}, "every durable subscriber has every confirmed value"},
		{"a group whose members never got a confirmed value",
			func(h *History) {
				s := h.Subscriptions[2]
				s.Deliveries = nil
			}, "every group's members have every confirmed value"},
		{"a group member's first attempts out of order", func(h *History) {
			s := h.Subscriptions[1]
			s.Deliveries = append(s.Deliveries, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 2},
				Delivery{Seq: 1, ID: "a-1", Value: "v1", Attempt: 1})
		}, "each subscription's seqs come in order"},
		{"a durable name begun after a seq, resumed from before it",
			func(h *History) {
				s := h.Subscribed(&Subscription{Subscriber: "erin",
					Topic: "jobs", Durable: "e-1", Begun: true})
				h.Replied(s, 1, true)
				s.RepliedAt = s.RepliedAt.Add(time.Hour) // long after the kill
				h.Closed(s)
				resumed(h, "erin", "e-1")
			}, "a durable name resumes where it began"},
		{"a fault left in place", func(h *History) {
			h.Fault("pause", "broker-1")
		}, "every fault was healed"},
		{"a publish never answered while nothing failed", func(h *History) {
			h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-3",
				Value: "v3"})
		}, "every publish made while nothing failed was answered within 30s"},
		{"a publish answered too late", func(h *History) {
			h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-3",
				Value: "v3"})
			h.Attempts[len(h.Attempts)-1].At = h.Attempts[0].At.Add(
				-time.Minute)
			h.Refused(Refusal{Publisher: "alice", Topic: "jobs", ID: "a-3",
				Code: "store_failed"})
		}, "every publish made while nothing failed was answered within 30s"},
		{"a probe that stalled", func(h *History) {
			h.Stalled("nothing delivered on fresh-1")
		}, "every publish made while nothing failed was answered within 30s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := clean()
			tc.break_(h)
			r := Check(h)
			got := violated(r)
			if len(got) != 1 || got[0] != tc.invariant {
				t.Fatalf("violated %q, want only %q:\n%s", got, tc.invariant, r)
			}
			if !strings.Contains(r.String(), "VIOLATED") {
				t.Fatalf("the report does not say so:\n%s", r)
			}
		})
	}
}

// resumed records name resumed by subscriber on jobs, given both values.
func resumed(h *History, subscriber, name string) {
	s := h.Subscribed(&Subscription{Subscriber: subscriber, Topic: "jobs",
		Durable: name})
	h.Replied(s, 2, true)
	h.Delivered(s, Delivery{Seq: 1, ID: "a-1", Value: "v1", Attempt: 1})
	h.Delivered(s, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 1})
}

func TestCheck_ExcusesWhatItWasTold(t *testing.T) {
	t.Run("a gap announced with recovered false", func(t *testing.T) {
		h := clean()
		s := h.Subscribed(&Subscription{Subscriber: "carol", Topic: "jobs"})
		h.Replied(s, 2, false)
		h.Delivered(s, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 1})
		if r := Check(h); !r.OK() || r.Announced != 1 {
			t.Fatalf("an announced gap was refused:\n%s", r)
		}
	})
	t.Run("a durable name begun just before a kill", func(t *testing.T) {
		h := clean()
		s := h.Subscribed(&Subscription{Subscriber: "erin", Topic: "jobs",
			Durable: "e-1", Begun: true})
		h.Replied(s, 1, true)
		h.Closed(s)
		h.Fault("kill", "broker-1")()
		resumed(h, "erin", "e-1")
		if r := Check(h); !r.OK() {
			t.Fatalf("a name the kill may have forgotten was held to its "+
				"start:\n%s", r)
		}
	})
	t.Run("a gap announced with skipped, and only that gap",
		func(t *testing.T) {
			h := clean()
			s := h.Subscribed(&Subscription{Subscriber: "carol", Topic: "jobs",
				After: new(uint64)})
			h.Replied(s, 0, true)
			h.Skipped(s, 1)
			h.Delivered(s, Delivery{Seq: 2, ID: "a-2", Value: "v2", Attempt: 1})
			if r := Check(h); !r.OK() {
				t.Fatalf("an announced skip was refused:\n%s", r)
			}
			s.Skips = nil
			if got := violated(Check(h)); len(got) != 1 ||
				got[0] != "no subscription skips a message unannounced" {
				t.Fatalf("an unannounced skip gave %q", got)
			}
		})
	t.Run("a durable subscriber's dead letter", func(t *testing.T) {
		h := clean()
		s := h.Subscriptions[0]
		s.Deliveries = s.Deliveries[:2]
		h.Dead([]wire.DeadLetter{{Topic: "jobs", MessageID: "a-2", Seq: 2,
			Subscriber: "bob"}})
		if r := Check(h); !r.OK() || r.DeadLettered != 1 {
			t.Fatalf("a dead-lettered value was held against bob:\n%s", r)
		}
	})
	t.Run("a lost unconfirmed message, then its re-send at a new seq",
		func(t *testing.T) {
			h := clean()
			h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-3", Value: "v3"})
			s := h.Subscriptions[0]
			h.Delivered(s, Delivery{Seq: 3, ID: "a-3", Value: "v3", Attempt: 1})
			h.Fault("kill", "broker-1")()
			// The broker died before the disk had seq 3; after the
			// restart seqs jump, and the re-send is stored at 16387.
			again := h.Subscribed(&Subscription{Subscriber: "bob",
				Topic: "jobs", Durable: "bob"})
			h.Replied(again, 16386, true)
			h.Sent(Attempt{Publisher: "alice", Topic: "jobs", ID: "a-3", Value: "v3"})
			h.Confirmed(Confirm{Publisher: "alice", Topic: "jobs", ID: "a-3", Seq: 16387, Duplicate: false})
			h.Delivered(again, Delivery{Seq: 16387, ID: "a-3", Value: "v3", Attempt: 1})
			h.Delivered(h.Subscriptions[1], Delivery{Seq: 16387, ID: "a-3", Value: "v3", Attempt: 1})
			h.Final["jobs"] = append(h.Final["jobs"],
				Stored{16387, "a-3", "v3"})
			if r := Check(h); !r.OK() {
				t.Fatalf("a lost unconfirmed message was refused:\n%s", r)
			}
		})
}

// A proxy carries bytes both ways, stops carrying them while held
// without closing anything, and drops every connection when cut.
func TestProxy_HoldsAndCuts(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go io.Copy(c, c)
		}
	}()
	p, err := NewProxy(func() string { return echo.Addr().String() })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip := func(want string) error {
		if _, err := c.Write([]byte(want)); err != nil {
			return err
		}
		got := make([]byte, len(want))
		_, err := io.ReadFull(c, got)
		if err == nil && string(got) != want {
			err = fmt.Errorf("echoed %q, want %q", got, want)
		}
		return err
	}
	if err := roundTrip("one"); err != nil {
		t.Fatal(err)
	}

	// Held, nothing comes back; resumed, what was sent arrives.
	p.Hold()
	c.Write([]byte("two"))
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := c.Read(make([]byte, 8)); n != 0 {
		t.Fatalf("%d bytes came through a held proxy", n)
	}
	c.SetReadDeadline(time.Time{})
	p.Resume()
	got := make([]byte, 3)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "two" {
		t.Fatalf("after resuming: %q, %v", got, err)
	}

	// Cut, the connection is closed.
	p.Cut()
	if _, err := io.ReadFull(c, make([]byte, 1)); err == nil {
		t.Fatal("a cut connection still reads")
	}
}

// Promises, on a run still going: a QoS 1 delivery left without an ack,
// a retry or a dead letter past its ack timeout breaks the retry
// promise, and one dead-lettered twice does too; a group's job with two
// members at once breaks the group's. Their answers keep them held.
func TestPromises_JudgeARunStillGoing(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	broken := func(h *History, now time.Time) map[string]int {
		found := map[string]int{}
		for _, p := range Promises(h, time.Second, 200*time.Millisecond, now) {
			if p.Violations > 0 {
				found[p.Name] = p.Violations
			}
		}
		return found
	}
	const retried = "a QoS 1 delivery is retried until acked or dead-lettered, once"
	const oneHolder = "a group's job is with one member at a time"

	h := &History{}
	s := &Subscription{Subscriber: "bob", Topic: "jobs"}
	h.Subscriptions = []*Subscription{s}
	s.Deliveries = []Delivery{{Seq: 1, ID: "a-1", Value: "v", Attempt: 1,
		QoS: 1, At: at(0)}}
	if got := broken(h, at(1000)); len(got) != 0 {
		t.Errorf("within the ack timeout: %v", got)
	}
	if got := broken(h, at(1500)); got[retried] != 1 {
		t.Errorf("past the ack timeout, unanswered: %v", got)
	}
	h.Acks = []Ack{{"bob", "jobs", "a-1", at(10)}}
	if got := broken(h, at(60000)); len(got) != 0 {
		t.Errorf("acked: %v", got)
	}
	h.Acks = nil
	s.Deliveries = append(s.Deliveries, Delivery{Seq: 1, ID: "a-1",
		Value: "v", Attempt: 2, QoS: 1, At: at(1100)})
	if got := broken(h, at(2000)); len(got) != 0 {
		t.Errorf("retried in time: %v", got)
	}
	letter := wire.DeadLetter{Topic: "jobs", MessageID: "a-1", Seq: 1,
		Subscriber: "bob"}
	h.DeadLetters = []wire.DeadLetter{letter}
	if got := broken(h, at(60000)); len(got) != 0 {
		t.Errorf("dead-lettered once: %v", got)
	}
	h.DeadLetters = append(h.DeadLetters, letter)
	if got := broken(h, at(60000)); len(got) != 0 {
		t.Errorf("dead-lettered again to a plain subscription: %v", got)
	}
	s.Durable = "bob-jobs"
	if got := broken(h, at(60000)); got[retried] != 1 {
		t.Errorf("dead-lettered twice on one durable cursor: %v", got)
	}

	g := &History{}
	a := &Subscription{Subscriber: "bob", Topic: "jobs", Group: "w",
		Deliveries: []Delivery{{Seq: 1, ID: "a-1", Attempt: 1, QoS: 1, At: at(0)}}}
	b := &Subscription{Subscriber: "carol", Topic: "jobs", Group: "w",
		Deliveries: []Delivery{{Seq: 1, ID: "a-1", Attempt: 2, QoS: 1, At: at(500)}}}
	g.Subscriptions = []*Subscription{a, b}
	g.Acks = []Ack{{"carol", "jobs", "a-1", at(510)}}
	if got := broken(g, at(600)); got[oneHolder] != 1 {
		t.Errorf("moved while bob held it: %v", got)
	}
	a.Ended, a.End = true, at(400)
	if got := broken(g, at(600)); len(got) != 0 {
		t.Errorf("moved after bob left: %v", got)
	}
}

func TestCheck_ANakedDeliveryComesAgainOrIsExcused(t *testing.T) {
	const nakked = "every nakked delivery comes again or is dead-lettered"
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time {
		return start.Add(time.Duration(ms) * time.Millisecond)
	}
	nak := Delivery{Seq: 1, ID: "a-1", Value: "v1", Attempt: 1, QoS: 1, At: at(0),
		Nakked: true}
	h := clean()
	s := h.Subscribed(&Subscription{Subscriber: "carol", Topic: "jobs",
		Deliveries: []Delivery{nak}})
	s.Ended, s.End = true, at(10_000)
	if got := violated(Check(h)); len(got) != 1 || got[0] != nakked {
		t.Fatalf("a nak never answered, its connection up 10 s more: "+
			"broken %v, want only %q", got, nakked)
	}

	// Any of these answers it: the retry, a dead letter, or the
	// connection's end before the retry was due.
	s.Deliveries = append(s.Deliveries, Delivery{Seq: 1, ID: "a-1",
		Value: "v1", Attempt: 2, QoS: 1, At: at(300)})
	if r := Check(h); !r.OK() {
		t.Fatalf("retried:\n%s", r)
	}
	s.Deliveries = s.Deliveries[:1]
	s.End = at(500)
	if r := Check(h); !r.OK() {
		t.Fatalf("its connection ended before the retry was due:\n%s", r)
	}
	s.End = at(10_000)
	h.DeadLetters = []wire.DeadLetter{{Topic: "jobs", MessageID: "a-1",
		Seq: 1, Subscriber: "carol"}}
	if r := Check(h); !r.OK() {
		t.Fatalf("dead-lettered:\n%s", r)
	}
}

func TestCheck_ADeadLetterStoredTwiceIsCaught(t *testing.T) {
	const once = "each dead letter is stored once"
	h := clean()
	letter := wire.DeadLetter{Topic: "jobs", MessageID: "a-2", Seq: 2,
		Subscriber: "w1"}
	h.DeadLetters = []wire.DeadLetter{letter}
	if r := Check(h); !r.OK() {
		t.Fatalf("one dead letter:\n%s", r)
	}
	// w1 and w2 are one group: the job's second letter, in the other
	// member's name, is the group's second.
	letter.Subscriber = "w2"
	h.DeadLetters = append(h.DeadLetters, letter)
	if got := violated(Check(h)); len(got) != 1 || got[0] != once {
		t.Fatalf("a group's job dead-lettered twice: broken %v", got)
	}
	// Two cursors that each gave up have a letter each: the group's,
	// and bob's durable subscription's; two of bob's are one too many.
	bobs := wire.DeadLetter{Topic: "jobs", MessageID: "a-2", Seq: 2,
		Subscriber: "bob"}
	h.DeadLetters = []wire.DeadLetter{letter, bobs}
	if r := Check(h); !r.OK() {
		t.Fatalf("one letter for the group, one for bob:\n%s", r)
	}
	h.DeadLetters = append(h.DeadLetters, bobs)
	if got := violated(Check(h)); len(got) != 1 || got[0] != once {
		t.Fatalf("bob's durable subscription dead-lettered twice: broken %v",
			got)
	}
}

func TestCheck_NothingIsDeliveredAfterItExpired(t *testing.T) {
	const expired = "no message is delivered after it expired"
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time {
		return start.Add(time.Duration(ms) * time.Millisecond)
	}
	h := clean()
	h.Attempts[0].Expiring = true
	s := h.Subscriptions[0]
	s.Deliveries[0].ExpiresAt = at(1000).UnixMilli()
	s.Deliveries[0].At = at(500)
	if r := Check(h); !r.OK() {
		t.Fatalf("delivered before it expired:\n%s", r)
	}
	s.Deliveries[0].At = at(5000)
	if got := violated(Check(h)); len(got) != 1 || got[0] != expired {
		t.Fatalf("delivered 4 s after it expired: broken %v", got)
	}
	// A stall when it expired may have held a delivery made in time.
	heal := h.Fault("stall", "every connection")
	h.Faults[len(h.Faults)-1].Start = at(900)
	heal()
	h.Faults[len(h.Faults)-1].End = at(4900)
	if r := Check(h); !r.OK() {
		t.Fatalf("held up by a stall:\n%s", r)
	}

	// The final read comes after every fault: no excuse. An expiring
	// value missing from it is no loss.
	h.FinalReads = []FinalRead{{Topic: "jobs", Seq: 1, ID: "a-1",
		ExpiresAt: at(1000).UnixMilli(), At: at(9000)}}
	if got := violated(Check(h)); len(got) != 1 || got[0] != expired {
		t.Fatalf("the final read replayed it after it expired: broken %v",
			got)
	}
	h.FinalReads = nil
	h.Final["jobs"] = h.Final["jobs"][1:]
	if r := Check(h); !r.OK() {
		t.Fatalf("an expired value missing from the final read:\n%s", r)
	}
}

func TestCheck_ADelayedValueComesWhenDueAtItsOwnPlace(t *testing.T) {
	const early = "no delayed message is delivered before it is due"
	h := clean()
	// a-2 was delayed: its confirm named seq 7 of $delayed/jobs, and it
	// took seq 2 of jobs when due, after a-1.
	sent := h.Attempts[1].At
	h.Attempts[1].Delayed = true
	h.Confirms[1].Delayed, h.Confirms[1].Seq = true, 7
	due := sent.UnixMilli() + delay
	for _, s := range h.Subscriptions {
		for i := range s.Deliveries {
			if s.Deliveries[i].ID == "a-2" {
				s.Deliveries[i].DeliverAt = due
				s.Deliveries[i].At = time.UnixMilli(due + 300)
			}
		}
	}
	if r := Check(h); !r.OK() {
		t.Fatalf("a delayed value sent when due was refused:\n%s", r)
	}

	// Delivered before its deliver_at, or with a deliver_at sooner than
	// its delay allows.
	d := &h.Subscriptions[0].Deliveries[2]
	d.At = time.UnixMilli(due - 100)
	if got := violated(Check(h)); len(got) != 1 || got[0] != early {
		t.Fatalf("delivered 100 ms early: broken %v", got)
	}
	d.At, d.DeliverAt = time.UnixMilli(due), due-500
	if got := violated(Check(h)); len(got) != 1 || got[0] != early {
		t.Fatalf("due 500 ms before its delay ran out: broken %v", got)
	}
	d.DeliverAt = due

	// Missing from its topic's log, it is a loss.
	h.Final["jobs"] = h.Final["jobs"][:1]
	got := violated(Check(h))
	if len(got) == 0 || got[0] != "every confirmed value is in the final log" {
		t.Fatalf("a delayed value never sent: broken %v", got)
	}
}

func TestCheck_ADelayedBurstPastItsBoundIsCaught(t *testing.T) {
	const bounded = "a topic's delayed messages wait within its bound"
	// later holds two delayed values at most; each is confirmed 10 ms
	// after it is sent, and sent 10 ms after the last confirm.
	burst := func(n int, gap time.Duration) *History {
		h := &History{}
		h.Bounded("later", 2)
		at := time.UnixMilli(1_000_000)
		for i := range n {
			id := fmt.Sprint("b-", i+1)
			h.Attempts = append(h.Attempts, Attempt{Publisher: "b",
				Topic: "later", ID: id, Value: id, Delayed: true, At: at})
			at = at.Add(10 * time.Millisecond)
			h.Confirms = append(h.Confirms, Confirm{Publisher: "b",
				Topic: "later", ID: id, Seq: uint64(i + 1), Delayed: true,
				At: at})
			at = at.Add(gap)
		}
		return h
	}
	if got := violated(Check(burst(2, 10*time.Millisecond))); slices.Contains(
		got, bounded) {
		t.Fatalf("two delayed values under a bound of two: broken %v", got)
	}
	r := Check(burst(3, 10*time.Millisecond))
	if got := violated(r); !slices.Contains(got, bounded) {
		t.Fatalf("a third confirmed while two waited: broken %v", got)
	}
	if l := r.Lines[slices.IndexFunc(r.Lines, func(l Line) bool {
		return l.Invariant == bounded
	})]; l.Violations != 1 || !strings.Contains(l.Examples[0], "b-3") {
		t.Fatalf("want b-3 alone:\n%s", r)
	}

	// The first two fell due before the third was confirmed.
	if got := violated(Check(burst(3, delay*time.Millisecond))); slices.
		Contains(got, bounded) {
		t.Fatalf("a third sent once the first two were due: broken %v", got)
	}

	// A repeat of one that waits takes no room.
	h := burst(3, 10*time.Millisecond)
	h.Confirms[2].Duplicate = true
	if got := violated(Check(h)); slices.Contains(got, bounded) {
		t.Fatalf("a repeat held to the bound: broken %v", got)
	}

	// Three sent at once, then confirmed: in one run the broker took the
	// third after the first two; on three connections it may have taken
	// them side by side.
	h = burst(3, 10*time.Millisecond)
	for i := range h.Attempts {
		h.Attempts[i].At = h.Attempts[0].At
		h.Confirms[i].At = h.Attempts[0].At.Add(
			time.Duration(i+1) * time.Millisecond)
	}
	if got := violated(Check(h)); slices.Contains(got, bounded) {
		t.Fatalf("sent at once, not in a run: broken %v", got)
	}
	for i := range h.Attempts {
		h.Attempts[i].Run = 1
	}
	if got := violated(Check(h)); !slices.Contains(got, bounded) {
		t.Fatalf("a run's third confirmed while two waited: broken %v", got)
	}
}
