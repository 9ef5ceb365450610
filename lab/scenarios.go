package lab

import (
	"strings"
	"time"
)

// # Guided scenarios
//
// A scenario sets a scene, asks the learner to predict what a fault will
// do, then does it and says why, with links to the lines of popsub.go
// that decide it. Its steps are actions, waits and "until"s, the same in
// the page and in the tests, so the tests run each scenario as the page
// does and hold its verdict.

// Scenario is one guided run.
type Scenario struct {
	Name  string `json:"name"`
	Title string `json:"title"`
	// Setup sets the scene; Question and Choices ask for a prediction,
	// Answer is the index of the right one; Fault does it, and Explain
	// says what happened and why, with Links into popsub.go.
	Setup    []Step   `json:"setup"`
	Question string   `json:"question"`
	Choices  []string `json:"choices"`
	Answer   int      `json:"answer"`
	Fault    []Step   `json:"fault"`
	Explain  string   `json:"explain"`
	Links    []Link   `json:"links"`
}

// Step is one step of a scenario: an action, a wait, or a wait until an
// event: Until names its kind and the lane it reaches ("message bob").
type Step struct {
	Do    *Action `json:"do,omitempty"`
	Wait  int64   `json:"wait,omitempty"` // milliseconds
	Until string  `json:"until,omitempty"`
}

// Link points into popsub.go on /source.
type Link struct {
	Text   string `json:"text"`
	Anchor string `json:"anchor"`
}

// do and wait make steps.
func do(a Action) Step    { return Step{Do: &a} }
func wait(ms int64) Step  { return Step{Wait: ms} }
func until(e string) Step { return Step{Until: e} }

// Scenarios are the lab's guided runs.
var Scenarios = []Scenario{{
	Name:  "seq-reuse",
	Title: "Kill -9 right after a new topic's first delivery",
	Setup: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "news"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "news"}),
		until("message bob"),
	},
	Question: "Bob has seq 1 of the new topic news; the disk has not " +
		"written it yet. The broker is killed now, restarts, and alice " +
		"publishes again. Which seq does bob see next?",
	Choices: []string{"seq 1 again: the first message never reached " +
		"the disk", "seq 2", "a seq far past 1"},
	Answer: 2,
	Fault: []Step{
		do(Action{Do: "kill"}),
		wait(2000),
		do(Action{Do: "publish", Client: "alice", Topic: "news"}),
		until("message bob"),
		wait(500),
	},
	Explain: "Before the first delivery on a topic, the broker wrote a " +
		"reservation to the disk: the topic's head is the end of a block " +
		"of seqs it may give out. After the crash it starts past the " +
		"block, so no seq bob saw can name another message; bob's " +
		"\"after 1\" skips nothing. Without the reservation the next " +
		"message would be seq 1 again, and a subscriber resuming after 1 " +
		"would never see it: the bug PopSub once had. (Bob's reply says " +
		"some messages are gone: the log cannot show him the seqs up to " +
		"the head, so it says so rather than stay silent.)",
	Links: []Link{{"The log: why seqs are reserved",
		"the-log-seq-first-sync-second"},
		{"waitForSeq: a publish waits for its block", "Broker.waitForSeq"},
		{"loadTopics: a restart starts at the stored head",
			"Broker.loadTopics"}},
}, {
	Name:  "power-durable",
	Title: "Power loss between a delivery and its commit",
	Setup: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "jobs",
			Durable: "bob-jobs"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		until("published alice"),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		until("message bob"),
	},
	Question: "Bob, subscribed durably, got alice's second message; the " +
		"disk has written it but not synced it, so alice has no confirm " +
		"yet. The power goes now. What does bob get after the restart?",
	Choices: []string{"nothing more: the message is lost",
		"the same message again, under a new seq",
		"the same message under the same seq"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "power"}),
		wait(3000),
	},
	Explain: "A delivery leaves when the message gets its seq, a confirm " +
		"only when its batch is synced. The power cut took the unsynced " +
		"write, so alice never had a confirm: her client sent the message " +
		"again, with the same message_id, and it was stored under a new " +
		"seq. Bob's durable cursor was on disk, so he resumed after it " +
		"and got the message again. A crash costs a subscriber only " +
		"messages nobody confirmed, and at least once means a duplicate " +
		"is possible; a lost confirmed message is not.",
	Links: []Link{{"The log: deliveries at the seq, confirms at the sync",
		"the-log-seq-first-sync-second"},
		{"Durable subscriptions", "durable-subscriptions"}},
}, {
	Name:  "slow-reader",
	Title: "One subscriber stops reading while another keeps up",
	Setup: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "feed"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "feed"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "feed"}),
		wait(200),
	},
	Question: "Carol stops reading her connection. Alice publishes 40 " +
		"messages. What happens to bob and to carol?",
	Choices: []string{"bob slows down to carol's pace",
		"bob gets every message; carol is cut off once a write to her " +
			"has waited too long, and catches up from the log when she " +
			"reads again",
		"the broker drops some of carol's messages and carries on"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "stop", Client: "carol"}),
		do(Action{Do: "publish", Client: "alice", Topic: "feed", Count: 40}),
		until("disconnect carol"),
		wait(500),
		do(Action{Do: "read", Client: "carol"}),
		wait(2500),
	},
	Explain: "Each connection has its own outbox with a bound, and its " +
		"own writer: a reader that stops costs the others nothing. " +
		"Carol's writer waited for her to take a frame; when a write had " +
		"waited the write timeout (3 s here), the broker cut her off with " +
		"4008 rather than hold her messages without end. (Had her outbox " +
		"filled first, her subscription would have gone back to reading " +
		"the log, dropping nothing.) Reading again, her client subscribed " +
		"after the newest seq it had seen, and the log replayed the rest: " +
		"no silent gap.",
	Links: []Link{{"The outbox and back-pressure",
		"the-outbox-and-back-pressure"},
		{"Replay: resuming after a seq", "replay"}},
}, {
	Name:  "group-member-dies",
	Title: "A group member dies holding a job",
	Setup: []Step{
		do(Action{Do: "hold", Client: "bob"}),
		do(Action{Do: "subscribe", Client: "bob", Topic: "work",
			Group: "workers"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "work", QoS: 1}),
		until("message bob"),
		do(Action{Do: "subscribe", Client: "carol", Topic: "work",
			Group: "workers"}),
		wait(200),
	},
	Question: "Bob holds the job and has not acked it. His link is cut. " +
		"Who gets the job, and when?",
	Choices: []string{"nobody: it was bob's, and bob is gone",
		"carol, at once", "carol, but only after bob's ack timeout",
		"bob and carol, both"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "cut", Client: "bob"}),
		wait(1500),
	},
	Explain: "A group's job is with one member at a time, in that " +
		"member's pending table. When bob's connection ended, the broker " +
		"took his pending jobs and offered them to the members left: " +
		"carol got it at once, as attempt 2, not after a timeout. Had bob " +
		"stayed connected and silent, it would have moved at his ack " +
		"timeout.",
	Links: []Link{{"Work queues", "work-queues"},
		{"group.leave: a leaving member's jobs move", "group.leave"}},
}}

// ScenarioNamed returns the scenario of that name.
func ScenarioNamed(name string) (Scenario, bool) {
	for _, s := range Scenarios {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

// Matches reports whether event e is what an until step waits for: its
// kind and, after a space, the lane it reaches.
func (e Event) Matches(until string) bool {
	kind, lane, _ := strings.Cut(until, " ")
	return e.Kind == kind && (lane == "" || e.To == lane)
}

// Play runs steps in fake time, as the page does: for tests, inside a
// testing/synctest bubble. An until step waits at most a minute, for an
// event since the step before it: after an action, one the action caused
// counts, though in the page the action ran Go until every goroutine
// waited, and the event came before the until looked.
func (l *Lab) Play(steps []Step) error {
	since, acted := 0, false
	for _, s := range steps {
		if !acted {
			since = l.count()
		}
		acted = s.Do != nil
		switch {
		case s.Do != nil:
			since = l.count()
			if err := l.Do(*s.Do); err != nil {
				return err
			}
		case s.Wait > 0:
			time.Sleep(time.Duration(s.Wait) * time.Millisecond)
		case s.Until != "":
			for end := time.Now().Add(time.Minute); !l.seenSince(since,
				s.Until) && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		}
	}
	return nil
}

// count returns how many events the run has.
func (l *Lab) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// seenSince reports whether an event after the first n matches until.
func (l *Lab) seenSince(n int, until string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events[n:] {
		if e.Matches(until) {
			return true
		}
	}
	return false
}
