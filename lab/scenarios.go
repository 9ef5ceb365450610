package lab

import (
	"slices"
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
	// Beside runs the scenario on popsub.go's broker and the article's
	// side by side, the same clicks at the same moments; Figures are
	// the costs it measures in both (Measure's specs). Breaks names the
	// promises its run breaks: the article's broker's when Beside (and
	// popsub.go keeps every one), else popsub.go's, under a fault no
	// broker can mend.
	Beside  bool     `json:"beside,omitempty"`
	Figures []string `json:"figures,omitempty"`
	Breaks  []string `json:"breaks,omitempty"`
	// Shows is what the explanation says happened, as the diagram draws
	// it: events of popsub.go's run from the fault on, in order, and
	// those it says did not happen; TheirsShow the same of the article's
	// run. Tests hold both runs, in Go and in the page, to them (Shown).
	Shows      []string `json:"shows,omitempty"`
	TheirsShow []string `json:"theirsShow,omitempty"`
}

// Shown returns the first of patterns that events, a run's from its
// fault on, do not bear out, or "" if they bear out all. A pattern is
// an event's kind, a lane it leaves or reaches, and words of its label:
// "message carol: retry 1", "ack bob". Each must match an event after the one the pattern
// before it matched; one that starts with "!" must match none there.
func Shown(patterns []string, events []Event) string {
	from := 0
	for _, pattern := range patterns {
		never := strings.HasPrefix(pattern, "!")
		what, words, _ := strings.Cut(strings.TrimPrefix(pattern, "!"), ": ")
		kind, lane, _ := strings.Cut(what, " ")
		at := slices.IndexFunc(events[from:], func(e Event) bool {
			return e.Kind == kind && (lane == "" || e.From == lane ||
				e.To == lane) && strings.Contains(e.Label, words)
		})
		switch {
		case never && at >= 0:
			return pattern + " (" + events[from+at].Label + ")"
		case !never && at < 0:
			return pattern
		case !never:
			from += at + 1
		}
	}
	return ""
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

// bothReadFeed is a scene: bob and carol subscribe to feed, alice
// publishes once, and settle ms pass.
func bothReadFeed(settle int64) []Step {
	return []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "feed"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "feed"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "feed"}),
		wait(settle),
	}
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
	Shows: []string{"kill broker", "restart broker",
		"subscribed bob: some messages are gone", "message bob: seq 32769",
		"!message bob: seq 1: "},
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
	Shows: []string{"power broker", "restart broker",
		"publish alice: alice-2", "message bob: alice-2",
		"!message bob: seq 2: "},
}, {
	Name:  "slow-reader",
	Title: "One subscriber stops reading while another keeps up",
	Setup: bothReadFeed(200),
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
	Shows: []string{"stop carol", "message bob: seq 41",
		"disconnect carol: cut off", "read carol", "subscribed carol",
		"message carol: seq 41"},
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
	Shows: []string{"cut bob", "message carol: retry 1 of seq 1",
		"!message bob"},
}, {
	Name:  "lying-disk",
	Title: "A disk that lies about its syncs, then a power cut",
	Setup: []Step{
		do(Action{Do: "lie"}),
		do(Action{Do: "subscribe", Client: "bob", Topic: "jobs"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		until("published alice"),
		wait(200),
	},
	Question: "This disk answers a sync at once and keeps the data in its " +
		"cache, as a drive whose write cache acknowledges a flush does. " +
		"Alice has a confirm for seq 1. The power goes now, and after the " +
		"restart alice publishes again. What does the checker say?",
	Choices: []string{"every promise held: the message was confirmed",
		"a confirmed message is lost, and seq 1 names two messages",
		"only that bob missed a message"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "power"}),
		wait(2000),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		until("published alice"),
		wait(500),
	},
	Explain: "Every promise popsub.go makes stands on one contract: a " +
		"Store's commit returns once its batch is synced. This disk broke " +
		"it: the confirm and the seq reservation it said were synced were " +
		"in its cache, and the power cut took them. The restarted broker " +
		"found no topic jobs, reserved seqs from 1 again, and gave seq 1 " +
		"to alice's next message. No broker can keep a promise its disk " +
		"does not keep: this is why a production disk needs power-loss " +
		"protection or its write cache off, and why popsub chaos kills " +
		"its peers with their sync on.",
	Links: []Link{{"The log: deliveries at the seq, confirms at the sync",
		"the-log-seq-first-sync-second"},
		{"Seqs reserved on disk", "seqs-reserved-on-disk"}},
	Breaks: []string{"no confirmed message is lost",
		"no seq is given to two messages"},
	Shows: []string{"power broker", "restart broker",
		"message bob: seq 1: alice-2",
		"published alice: confirmed alice-2: seq 1"},
}, {
	Name:  "lost-frame",
	Title: "A proxy that loses a frame",
	Setup: bothReadFeed(300),
	Question: "A faulty proxy between bob and the broker will lose the " +
		"next message it carries, without a word. Alice publishes three " +
		"more QoS 0 messages, then one QoS 1. What does the checker say?",
	Choices: []string{"every promise held: the broker sent everything",
		"bob has a silent gap: the lost QoS 0 message is gone for him, " +
			"while carol has all",
		"the broker retries the lost message"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "drop", Client: "bob"}),
		do(Action{Do: "publish", Client: "alice", Topic: "feed", Count: 3}),
		do(Action{Do: "publish", Client: "alice", Topic: "feed", QoS: 1}),
		wait(1000),
	},
	Explain: "The broker sent bob seq 2, and the proxy lost it: bob saw seq " +
		"1, then 3, and nothing said 2 was gone. At QoS 0 nobody keeps a " +
		"delivery after it leaves, so nobody sends it again; at QoS 1 the " +
		"broker would have, after bob's ack timeout. WebSocket over TCP " +
		"never loses a frame this way; a broken proxy, or a client that " +
		"throws a message away, can. A subscriber that must not miss one " +
		"uses QoS 1, or resumes after the newest seq it has and asks for " +
		"the rest.",
	Links: []Link{{"Replay: resuming after a seq", "replay"},
		{"Acknowledgements", "acknowledgements"}},
	Breaks: []string{"each subscriber sees its topic in seq order, " +
		"with no silent gap"},
	Shows: []string{"!message bob: seq 2: ", "drop bob",
		"lost bob: seq 2", "message bob: seq 3"},
}}

// # Where the simple version runs out
//
// The article ends with five limits of its broker. Each scenario below
// runs one of them on both brokers at once: the same clicks, the same
// clock. Their steps are actions and waits alone, so that the two runs
// stay in step; an until would wait for one broker's event.
func init() { Scenarios = append(Scenarios, limits...) }

// retried is the promise the article's broker breaks: keyed by
// message_id alone, its pending table forgets a subscriber's delivery.
const retried = "a QoS 1 delivery is retried until acked or " +
	"dead-lettered, once"

var limits = []Scenario{{
	Name:   "one-ack",
	Title:  "Limit 1: bob acks, carol does not",
	Beside: true,
	Breaks: []string{retried},
	Setup: []Step{
		do(Action{Do: "hold", Client: "carol"}),
		do(Action{Do: "subscribe", Client: "bob", Topic: "jobs"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "jobs"}),
		wait(300),
	},
	Question: "Bob and carol subscribe to jobs; carol holds her acks. " +
		"Alice publishes a QoS 1 job, and bob acks it at once. What does " +
		"each broker do about carol?",
	Choices: []string{"both retry carol until she acks",
		"popsub.go retries carol, then dead-letters the job; the " +
			"article's broker never sends it to her again",
		"neither: bob's ack settles the job"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		wait(16000),
	},
	Explain: "The article's pendingAcks is keyed by message_id alone: " +
		"bob's ack removed the one entry, and with it every reason to " +
		"retry carol. Its checker line breaks: carol's delivery was " +
		"neither acked, retried nor dead-lettered. popsub.go keeps a " +
		"pending entry per subscriber and connection, so bob's ack settles " +
		"bob's, and carol's timer goes on: two retries, then a dead " +
		"letter, which an operator can read and publish again.",
	Links: []Link{{"Acknowledgements: a pending entry per subscriber",
		"acknowledgements"},
		{"Retries and dead letters", "retries-and-dead-letters"}},
	Shows: []string{"ack bob", "message carol: retry 1",
		"message carol: retry 2", "dead carol"},
	TheirsShow: []string{"message carol: alice-1 as alice-1",
		"!message carol"},
}, {
	Name:   "retry-to-all",
	Title:  "Limit 2: a retry goes to every subscriber",
	Beside: true,
	Breaks: []string{retried},
	Setup: []Step{
		do(Action{Do: "hold", Client: "carol"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "jobs"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1}),
		wait(300),
	},
	Question: "Carol holds her ack of alice's QoS 1 job. Now bob " +
		"subscribes to jobs, asking for what is stored. How many copies " +
		"of the job does bob get?",
	Choices: []string{"one from each broker",
		"one from popsub.go; two from the article's, one under an id it " +
			"made up",
		"none from either: the job was carol's"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "jobs",
			After: new(uint64)}),
		wait(8000),
	},
	Explain: "The article's broker sent bob the stored job at once, under " +
		"a fresh id, as history; then, carol's ack being late, its retry " +
		"loop sent the job again to the whole topic, bob too, under its " +
		"own id. Bob cannot tell the two apart from two jobs. His ack of " +
		"the retry then removed the entry, and carol was never retried " +
		"again: limit 1 as well. popsub.go gave bob the job once, from the " +
		"log, under its seq and id, and retried carol alone.",
	Links: []Link{{"Replay: resuming after a seq", "replay"},
		{"Acknowledgements: a pending entry per subscriber",
			"acknowledgements"}},
	Figures: []string{"again bob", "fresh bob"},
	Shows: []string{"subscribed bob", "message bob: seq 1",
		"message carol: retry 1", "!message bob"},
	TheirsShow: []string{"message bob: alice-1 as id-",
		"message carol: alice-1 as alice-1", "!message carol"},
}, {
	Name:   "replay-best-effort",
	Title:  "Limit 3: replay is best effort",
	Beside: true,
	Setup: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "jobs",
			Durable: "bob-jobs"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "jobs"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1,
			Count: 2}),
		wait(600),
	},
	Question: "Bob, subscribed durably, has alice's two jobs. His link " +
		"is cut; while he is away alice publishes two more, and carol " +
		"acks them. Bob's client connects again a second later and " +
		"subscribes with his durable name. What does he get?",
	Choices: []string{"the two he missed, from both brokers",
		"from popsub.go the two he missed, under their ids, retried until " +
			"acked; from the article's all four, under ids it made up, as " +
			"QoS 0",
		"nothing from either: carol acked them"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "cut", Client: "bob"}),
		wait(300),
		do(Action{Do: "publish", Client: "alice", Topic: "jobs", QoS: 1,
			Count: 2}),
		wait(3000),
	},
	Explain: "The article's broker knows no durable name and no position: " +
		"a subscribe gets what the store holds, all of it, each under a " +
		"fresh id and QoS 0, so bob got two jobs he had already done as " +
		"if they were new, and nothing he got is retried if he drops it. " +
		"popsub.go kept bob's cursor on disk at his last ack, and resumed " +
		"after it: the two jobs he missed, under the ids and seqs alice's " +
		"confirms named, as QoS 1.",
	Links: []Link{{"Durable subscriptions", "durable-subscriptions"},
		{"Replay: resuming after a seq", "replay"}},
	Figures: []string{"again bob", "fresh bob"},
	Shows: []string{"!message bob: seq 1: ", "!message bob: seq 2: ",
		"cut bob", "subscribed bob", "message bob: seq 3",
		"message bob: seq 4"},
	TheirsShow: []string{"cut bob", "subscribe bob",
		"message bob: alice-1 as id-", "message bob: alice-4 as id-"},
}, {
	Name:   "one-lock",
	Title:  "Limit 4: one lock, and a slow disk",
	Beside: true,
	Setup: []Step{
		do(Action{Do: "subscribe", Client: "bob", Topic: "chat"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "logs"}),
		wait(200),
		do(Action{Do: "publish", Client: "alice", Topic: "logs"}),
		do(Action{Do: "publish", Client: "alice", Topic: "chat"}),
		wait(600),
	},
	Question: "The disk starts failing: each write takes a second. Alice " +
		"publishes three messages on logs, then one on chat, which bob " +
		"reads. How long does bob wait for the chat message?",
	Choices: []string{"seconds, on both: the disk is slow for everyone",
		"no time from popsub.go; seconds from the article's, whose one " +
			"lock is held while each write waits for the disk",
		"no time from either: the messages are QoS 0"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "slow"}),
		do(Action{Do: "publish", Client: "alice", Topic: "logs", Count: 3}),
		do(Action{Do: "publish", Client: "alice", Topic: "chat"}),
		wait(6000),
		do(Action{Do: "heal"}),
	},
	Explain: "The article's broker does a publish's five steps under one " +
		"mutex, the store's write among them: while a write waits for the " +
		"disk, no client of any topic is served. popsub.go delivers a " +
		"message when it gets its seq, and hands the write to the log's " +
		"commit loop, which batches and syncs on its own: the slow disk " +
		"delays only the log's writes, and a QoS 1 publisher's confirms. " +
		"Nothing broke a promise here; the cost is the wait, measured " +
		"below.",
	Links: []Link{{"The log: deliveries at the seq, confirms at the sync",
		"the-log-seq-first-sync-second"}},
	Figures: []string{"waited bob"},
	Shows:   []string{"slow disk", "message bob: alice-6"},
	TheirsShow: []string{"slow disk", "message carol: alice-3",
		"message bob: alice-6"},
}, {
	Name:   "no-back-pressure",
	Title:  "Limit 5: no back-pressure",
	Beside: true,
	Setup:  bothReadFeed(300),
	Question: "Carol stops reading. Alice publishes 200 messages. What " +
		"does each broker hold in memory for carol?",
	Choices: []string{"every message, on both, until she reads",
		"popsub.go at most her outbox, and it cuts her off once a write " +
			"waited 3 s; the article's every message, for as long as she " +
			"does not read",
		"nothing: both drop what she cannot take"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "stop", Client: "carol"}),
		do(Action{Do: "publish", Client: "alice", Topic: "feed",
			Count: 100}),
		do(Action{Do: "publish", Client: "alice", Topic: "feed",
			Count: 100}),
		wait(4000),
	},
	Explain: "The article's broker gives each client a channel with no " +
		"bound: every message for carol waits in memory, and a thousand " +
		"carols would take the machine down. popsub.go bounds each " +
		"connection's outbox (4 KiB in the lab): when it is full, the " +
		"subscription reads the log instead, and a write that waited the " +
		"write timeout cuts the reader off, to catch up from the log when " +
		"she comes back.",
	Links: []Link{{"The outbox and back-pressure",
		"the-outbox-and-back-pressure"}},
	Figures:    []string{"held"},
	Shows:      []string{"stop carol", "disconnect carol: cut off"},
	TheirsShow: []string{"stop carol", "!disconnect carol"},
}, {
	Name:   "no-groups",
	Title:  "Beyond the article: one job, two workers",
	Beside: true,
	Setup: []Step{
		do(Action{Do: "hold", Client: "bob"}),
		do(Action{Do: "hold", Client: "carol"}),
		do(Action{Do: "subscribe", Client: "bob", Topic: "work",
			Group: "workers"}),
		do(Action{Do: "subscribe", Client: "carol", Topic: "work",
			Group: "workers"}),
		wait(300),
	},
	Question: "Bob and carol subscribe to work as members of the group " +
		"workers, a work queue: each job to one of them, held until it is " +
		"done (acked). Alice publishes three QoS 1 jobs. Who holds each " +
		"job?",
	Choices: []string{"one worker each, from both brokers",
		"one worker each from popsub.go; both workers every job from " +
			"the article's",
		"both workers every job, from both brokers"},
	Answer: 1,
	Fault: []Step{
		do(Action{Do: "publish", Client: "alice", Topic: "work", QoS: 1,
			Count: 3}),
		wait(1500),
	},
	Explain: "The article's protocol has no groups: its broker reads the " +
		"subscribe, ignores the field it does not know, and adds both " +
		"workers to the topic's set, so every job went to both, and two " +
		"workers hold each one. popsub.go gives a group one feed, and each " +
		"job to one member at a time, until its ack or its ack timeout.",
	Links:      []Link{{"Work queues", "work-queues"}},
	Breaks:     []string{"a group's job is with one member at a time"},
	TheirsShow: []string{"message bob: alice-1 as alice-1"},
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
