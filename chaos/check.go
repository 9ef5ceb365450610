package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// A Report is what Check found: one line per invariant, and the counts
// of what the run did.
type Report struct {
	// Lines are the invariants, in the order protocol.md gives them.
	Lines []Line
	// Attempted and Confirmed count distinct values; Stored the final
	// logs' messages; Deliveries every message frame, Redeliveries those
	// at attempt 2 or more; Announced the subscriptions told
	// "recovered":false.
	Attempted, Confirmed, Stored        int
	Deliveries, Redeliveries, Announced int
	// DeadLettered counts the dead letters read after the run; Nakked
	// the deliveries handed back with a nak.
	DeadLettered, Nakked int
	// Faults counts the faults by kind; Refused the refused publishes by
	// error code.
	Faults, Refused map[string]int
}

// Line is one invariant: how often it was broken, and a few examples.
type Line struct {
	Invariant  string
	Violations int
	Examples   []string
	// Marks name the messages the examples are about, for a page that
	// draws the run (the lab) to point at.
	Marks []Mark
}

// Mark names one message a violation is about: by topic and seq, or
// by topic and message_id, or both.
type Mark struct {
	Topic, ID string
	Seq       uint64
	// Lane, if set, is the client whose delivery of it breaks the
	// promise: its other deliveries, and others', are not marked.
	Lane string
}

// maxExamples is how many examples a line keeps.
const maxExamples = 5

// OK reports whether no invariant was broken.
func (r Report) OK() bool {
	return !slices.ContainsFunc(r.Lines, func(l Line) bool {
		return l.Violations > 0
	})
}

// String prints the report: the counts, then a line per invariant.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "values attempted %d, confirmed %d, stored %d; "+
		"deliveries %d, redeliveries %d, naks %d, dead letters %d; gaps "+
		"announced %d\n", r.Attempted, r.Confirmed, r.Stored, r.Deliveries,
		r.Redeliveries, r.Nakked, r.DeadLettered, r.Announced)
	kinds := slices.Sorted(maps.Keys(r.Faults))
	var faults []string
	for _, kind := range kinds {
		faults = append(faults, fmt.Sprintf("%s %d", kind, r.Faults[kind]))
	}
	fmt.Fprintf(&b, "faults: %s\n", cmp.Or(strings.Join(faults, ", "),
		"none"))
	if len(r.Refused) > 0 {
		var refused []string
		for _, code := range slices.Sorted(maps.Keys(r.Refused)) {
			refused = append(refused, fmt.Sprint(code, " ", r.Refused[code]))
		}
		fmt.Fprintf(&b, "refused: %s\n", strings.Join(refused, ", "))
	}
	for _, l := range r.Lines {
		verdict := "ok"
		if l.Violations > 0 {
			verdict = fmt.Sprintf("VIOLATED %d times", l.Violations)
		}
		fmt.Fprintf(&b, "%-58s %s\n", l.Invariant+":", verdict)
		for _, example := range l.Examples {
			fmt.Fprintf(&b, "    %s\n", example)
		}
	}
	return b.String()
}

// mark notes a message the next violation is about.
func (l *Line) mark(topic, id string, seq uint64) {
	l.Marks = append(l.Marks, Mark{Topic: topic, ID: id, Seq: seq})
}

// markFor marks a message as mark does, for one client's deliveries.
func (l *Line) markFor(lane, topic, id string, seq uint64) {
	l.Marks = append(l.Marks, Mark{Topic: topic, ID: id, Seq: seq,
		Lane: lane})
}

// violation adds a broken invariant to the line.
func (l *Line) violation(format string, args ...any) {
	l.Violations++
	if len(l.Examples) < maxExamples {
		l.Examples = append(l.Examples, fmt.Sprintf(format, args...))
	}
}

// key names a message by topic and message_id: the run's ids are unique.
type key struct{ topic, id string }

// place names a topic's seq.
type place struct {
	topic string
	seq   uint64
}

// Check holds a finished history to PopSub's promises. The broker's own
// topics ($dead/…) are not the workload's: only their dead letters
// count, for the durable subscribers they name.
func Check(h *History) Report {
	r := Report{Faults: map[string]int{}, Refused: map[string]int{}}
	h = h.workload()
	attempted := map[key]string{}
	for _, a := range h.Attempts {
		attempted[key{a.Topic, a.ID}] = a.Value
	}
	// A delayed value's confirm names its place in $delayed/<topic>; its
	// place in its topic is where the final read found it.
	stored := storedIDs(h)
	confirmed := map[key]uint64{}
	for _, c := range h.Confirms {
		k := key{c.Topic, c.ID}
		confirmed[k] = c.Seq
		if c.Delayed {
			confirmed[k] = 0
			if len(stored[k]) > 0 {
				confirmed[k] = stored[k][0]
			}
		}
	}
	for _, log := range h.Final {
		r.Stored += len(log)
	}
	r.Attempted, r.Confirmed = len(attempted), len(confirmed)
	r.DeadLettered = len(h.DeadLetters)
	for _, s := range h.Subscriptions {
		r.Deliveries += len(s.Deliveries)
		for _, d := range s.Deliveries {
			if d.Attempt > 1 {
				r.Redeliveries++
			}
			if d.Nakked {
				r.Nakked++
			}
		}
		if s.Unrecovered {
			r.Announced++
		}
	}
	for _, f := range h.Faults {
		r.Faults[f.Kind]++
	}
	for _, refusal := range h.Refusals {
		r.Refused[refusal.Code]++
	}
	r.Lines = []Line{
		checkConfirmed(h, stored),
		checkConfirmedSeqs(h, stored),
		checkOneValuePerSeq(h),
		checkOneSeqPerID(stored),
		checkAttempted(h, attempted),
		checkOrder(h),
		checkGaps(h),
		checkDurables(h, confirmed),
		checkBegun(h),
		checkGroups(h, confirmed),
		checkRedone(h),
		checkNakked(h),
		checkDeadOnce(h),
		checkExpired(h),
		checkDue(h),
		checkBounded(h),
		checkAnswered(h),
		checkHealed(h),
	}
	return r
}

// checkConfirmed: no confirmed value is missing from the final log.
func checkConfirmed(h *History, stored map[key][]uint64) Line {
	l := Line{Invariant: "every confirmed value is in the final log"}
	seen := map[key]bool{}
	expiring := expiringValues(h)
	for _, c := range h.Confirms {
		k := key{c.Topic, c.ID}
		if !seen[k] && len(stored[k]) == 0 && !expiring[k] {
			l.mark(c.Topic, c.ID, c.Seq)
			l.violation("%s %s: confirmed at seq %d by %s, not in the log",
				c.Topic, c.ID, c.Seq, c.Publisher)
		}
		seen[k] = true
	}
	return l
}

// expiringValues are the values published with a time to live: the
// final read, like any subscriber, is not given one that has expired.
func expiringValues(h *History) map[key]bool {
	expiring := map[key]bool{}
	for _, a := range h.Attempts {
		if a.Expiring {
			expiring[key{a.Topic, a.ID}] = true
		}
	}
	return expiring
}

// checkConfirmedSeqs: a confirmed value is stored at the seq its confirm
// named, every time it was confirmed.
func checkConfirmedSeqs(h *History, stored map[key][]uint64) Line {
	l := Line{Invariant: "each is stored at the seq its confirm named"}
	for _, c := range h.Confirms {
		seqs := stored[key{c.Topic, c.ID}]
		if !c.Delayed && len(seqs) > 0 && !slices.Contains(seqs, c.Seq) {
			l.mark(c.Topic, c.ID, c.Seq)
			l.violation("%s %s: confirmed at seq %d, stored at %v",
				c.Topic, c.ID, c.Seq, seqs)
		}
	}
	return l
}

// checkOneValuePerSeq: no (topic, seq) was seen with two values, in a
// delivery, a confirm or the final log, across every crash. Each place
// keeps the first value seen there; only places seen with more keep a
// set, so a long run costs one small entry per seq.
func checkOneValuePerSeq(h *History) Line {
	l := Line{Invariant: "no seq names two values, across every crash"}
	type sighting struct{ id, where string }
	first := map[place]sighting{}
	more := map[place]map[string]string{} // id → where it was seen
	note := func(topic string, seq uint64, id, where string) {
		p := place{topic, seq}
		seen, ok := first[p]
		switch {
		case !ok:
			first[p] = sighting{id, where}
		case seen.id != id && more[p] == nil:
			more[p] = map[string]string{seen.id: seen.where, id: where}
		case seen.id != id && more[p][id] == "":
			more[p][id] = where
		}
	}
	for _, s := range h.Subscriptions {
		for _, d := range s.Deliveries {
			note(s.Topic, d.Seq, d.ID, "delivered to "+s.Subscriber)
		}
	}
	for _, c := range h.Confirms {
		topic := c.Topic
		if c.Delayed {
			topic = delayedPrefix + topic
		}
		note(topic, c.Seq, c.ID, "confirmed to "+c.Publisher)
	}
	for topic, log := range h.Final {
		for _, m := range log {
			note(topic, m.Seq, m.ID, "stored")
		}
	}
	places := slices.SortedFunc(maps.Keys(more), func(a, b place) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.seq,
			b.seq))
	})
	for _, p := range places {
		var named []string
		for _, id := range slices.Sorted(maps.Keys(more[p])) {
			named = append(named, id+" ("+more[p][id]+")")
			l.mark(p.topic, id, p.seq)
		}
		l.violation("%s seq %d: %s", p.topic, p.seq, strings.Join(named, ", "))
	}
	return l
}

// checkOneSeqPerID: no message_id is stored under two seqs.
func checkOneSeqPerID(stored map[key][]uint64) Line {
	l := Line{Invariant: "no message_id is stored under two seqs"}
	for _, k := range sortedKeys(stored) {
		if seqs := stored[k]; len(seqs) > 1 {
			l.mark(k.topic, k.id, 0)
			l.violation("%s %s: stored at seqs %v", k.topic, k.id, seqs)
		}
	}
	return l
}

// checkAttempted: nothing was read, or stored, that was never published
// with that value.
func checkAttempted(h *History, attempted map[key]string) Line {
	l := Line{Invariant: "nothing is read that was never published"}
	check := func(topic, id, value, where string) {
		want, ok := attempted[key{topic, id}]
		switch {
		case !ok:
			l.violation("%s %s %s: never published", topic, id, where)
		case want != value:
			l.violation("%s %s %s as %q, published as %q", topic, id,
				where, value, want)
		}
	}
	for _, s := range h.Subscriptions {
		for _, d := range s.Deliveries {
			check(s.Topic, d.ID, d.Value, "delivered to "+s.Subscriber)
		}
	}
	for topic, log := range h.Final {
		for _, m := range log {
			check(topic, m.ID, m.Value, "stored")
		}
	}
	return l
}

// checkOrder: within a subscription, new seqs come in ascending order,
// and a seq comes again only as a later attempt (a retry), never as a
// duplicate at the hand-over from replay to live. One with a wildcard
// beside it gets a replay and live traffic at once, each in order.
func checkOrder(h *History) Line {
	l := Line{Invariant: "each subscription's seqs come in order"}
	for _, s := range h.Subscriptions {
		if s.Overlap != "" {
			continue
		}
		attempts := map[uint64]int{}
		var newest uint64
		for _, d := range s.Deliveries {
			last, again := attempts[d.Seq]
			switch {
			case again && d.Attempt <= last:
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s on %s: seq %d again at attempt %d",
					s.Subscriber, s.Topic, d.Seq, d.Attempt)
			// A group member's retry may be a seq moved from another.
			case !again && d.Seq < newest && (s.Group == "" || d.Attempt == 1):
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s on %s: seq %d after seq %d",
					s.Subscriber, s.Topic, d.Seq, newest)
			}
			attempts[d.Seq] = max(last, d.Attempt)
			newest = max(newest, d.Seq)
		}
	}
	return l
}

// checkGaps: a subscription misses no stored message between the point
// it asked to start after and its last delivery, unless its reply said
// "recovered":false. A durable subscription resuming starts at its
// cursor, which its client does not know: only its deliveries' gaps are
// checked.
func checkGaps(h *History) Line {
	l := Line{Invariant: "no subscription skips a message unannounced"}
	resumed := map[string]bool{}
	for _, s := range h.Subscriptions {
		name := s.Subscriber + "\x00" + s.Durable + "\x00" + s.Topic
		known := s.Durable == "" || !resumed[name]
		resumed[name] = s.Durable != ""
		// A group member gets a share: checkGroups checks the whole. One
		// with a wildcard beside it gets live traffic that way while it
		// replays: checkDurables checks what it had.
		if s.Unrecovered || len(s.Deliveries) == 0 || s.Group != "" ||
			s.Overlap != "" {
			continue
		}
		from := uint64(0)
		if s.After != nil {
			from = *s.After
		}
		if !known {
			from = s.Deliveries[0].Seq
		}
		// A seq delivered late is the order check's to report.
		delivered := map[uint64]bool{}
		for _, d := range s.Deliveries {
			delivered[d.Seq] = true
		}
		skips := s.Skips
		for i, d := range s.Deliveries {
			// A skipped frame announced what it names as gone.
			for len(skips) > 0 && skips[0].Delivered <= i {
				from, skips = max(from, skips[0].Seq), skips[1:]
			}
			if d.Seq <= from {
				continue
			}
			for _, m := range storedBetween(h.Final[s.Topic], from, d.Seq) {
				if !delivered[m.Seq] {
					l.mark(s.Topic, m.ID, m.Seq)
					l.violation("%s on %s: seq %d (%s) skipped, between "+
						"%d and %d", s.Subscriber, s.Topic, m.Seq, m.ID, from,
						d.Seq)
				}
			}
			from = d.Seq
		}
	}
	return l
}

// storedBetween returns the messages of log, which is in seq order,
// with low < seq < high.
func storedBetween(log []Stored, low, high uint64) []Stored {
	from, _ := slices.BinarySearchFunc(log, low+1, bySeq)
	to, _ := slices.BinarySearchFunc(log, high, bySeq)
	return log[from:max(from, to)]
}

// bySeq compares a stored message with a seq, for binary searches.
func bySeq(m Stored, seq uint64) int { return cmp.Compare(m.Seq, seq) }

// checkDurables: after the drain, every durable subscriber has had every
// value confirmed on its topic, but those below a gap it was told of and
// those dead-lettered in its name: its cursor moves past a message that
// went unacked through its last retry, as protocol.md says.
func checkDurables(h *History, confirmed map[key]uint64) Line {
	l := Line{Invariant: "every durable subscriber has every confirmed value"}
	type durable struct{ subscriber, name, topic string }
	type letter struct{ subscriber, topic, id string }
	dead := map[letter]bool{}
	for _, d := range h.DeadLetters {
		dead[letter{d.Subscriber, d.Topic, d.MessageID}] = true
	}
	got := map[durable]map[string]bool{}
	excused := map[durable]uint64{}
	for _, s := range h.Subscriptions {
		if s.Durable == "" {
			continue
		}
		d := durable{s.Subscriber, s.Durable, s.Topic}
		if got[d] == nil {
			got[d] = map[string]bool{}
		}
		for _, m := range s.Deliveries {
			got[d][m.ID] = true
		}
		if s.Unrecovered && len(s.Deliveries) > 0 {
			excused[d] = max(excused[d], s.Deliveries[0].Seq)
		}
		// A name begun with new messages only owes none before.
		if s.Begun && s.Replied {
			excused[d] = max(excused[d], s.Head)
		}
		for _, skip := range s.Skips {
			excused[d] = max(excused[d], skip.Seq)
		}
	}
	durables := slices.SortedFunc(maps.Keys(got), func(a, b durable) int {
		return cmp.Or(cmp.Compare(a.subscriber, b.subscriber),
			cmp.Compare(a.name, b.name), cmp.Compare(a.topic, b.topic))
	})
	expiring := expiringValues(h)
	for _, d := range durables {
		ids := got[d]
		for _, k := range sortedKeys(confirmed) {
			if k.topic == d.topic && !ids[k.id] && confirmed[k] > excused[d] &&
				!expiring[k] &&
				!dead[letter{d.subscriber, d.topic, k.id}] {
				l.violation("%s (durable %q) on %s: never got %s (seq %d)",
					d.subscriber, d.name, d.topic, k.id, confirmed[k])
			}
		}
	}
	return l
}

// checkBegun: a durable name begun with new messages only ("last":0),
// and resumed before anything came, resumes where it began: none of its
// deliveries, on any connection, is of a seq at or before its first
// reply's head. A kill within beginMargin of that reply excuses it: the
// name's cursor reaches the disk with the next commit, a few
// milliseconds later, and a kill before then forgets the name.
func checkBegun(h *History) Line {
	l := Line{Invariant: "a durable name resumes where it began"}
	type durable struct{ subscriber, name, topic string }
	began := map[durable]uint64{}
	for _, s := range h.Subscriptions {
		if s.Begun && s.Replied && !killedWithin(h, s.RepliedAt, beginMargin) {
			began[durable{s.Subscriber, s.Durable, s.Topic}] = s.Head
		}
	}
	for _, s := range h.Subscriptions {
		head, ok := began[durable{s.Subscriber, s.Durable, s.Topic}]
		for _, d := range s.Deliveries {
			if ok && d.Seq <= head {
				l.markFor(s.Subscriber, s.Topic, d.ID, d.Seq)
				l.violation("%s (durable %q, begun at seq %d) on %s: given "+
					"seq %d (%s), from before it began", s.Subscriber,
					s.Durable, head, s.Topic, d.Seq, d.ID)
			}
		}
	}
	return l
}

// beginMargin is how long after a durable name's first reply a kill may
// have forgotten the name: its cursor's commit waits at most 100 ms for
// company, and a loaded machine adds to that.
const beginMargin = time.Second

// killedWithin reports whether a broker was killed (a fault whose kind
// begins "kill": the simulation's and popsub chaos's kills of a broker or
// of NATS) in the span of length after from.
func killedWithin(h *History, from time.Time, span time.Duration) bool {
	return slices.ContainsFunc(h.Faults, func(f *Fault) bool {
		return strings.HasPrefix(f.Kind, "kill") && !f.Start.Before(from) &&
			f.Start.Before(from.Add(span))
	})
}

// checkGroups: after the drain, the members of each group together have
// had every value confirmed on its topic after the group began (its first
// reply's head), but those dead-lettered in a member's name: a message
// goes to one member, and a member that leaves or does not ack hands it
// to another.
func checkGroups(h *History, confirmed map[key]uint64) Line {
	l := Line{Invariant: "every group's members have every confirmed value"}
	type group struct{ name, topic string }
	start := map[group]uint64{}
	got := map[group]map[string]bool{}
	members := map[group]map[string]bool{}
	excused := map[group]bool{}
	for _, s := range h.Subscriptions {
		if s.Group == "" || !s.Replied {
			continue
		}
		g := group{s.Group, s.Topic}
		if got[g] == nil {
			got[g], members[g], start[g] = map[string]bool{},
				map[string]bool{}, s.Head
		}
		members[g][s.Subscriber] = true
		excused[g] = excused[g] || s.Unrecovered
		for _, m := range s.Deliveries {
			got[g][m.ID] = true
		}
	}
	// A message may be dead-lettered for several subscribers at once.
	type letter struct{ subscriber, topic, id string }
	dead := map[letter]bool{}
	for _, d := range h.DeadLetters {
		dead[letter{d.Subscriber, d.Topic, d.MessageID}] = true
	}
	deadFor := func(g map[string]bool, k key) bool {
		for member := range g {
			if dead[letter{member, k.topic, k.id}] {
				return true
			}
		}
		return false
	}
	for _, g := range slices.SortedFunc(maps.Keys(got), func(a, b group) int {
		return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.topic, b.topic))
	}) {
		for _, k := range sortedKeys(confirmed) {
			if k.topic == g.topic && !got[g][k.id] && confirmed[k] > start[g] &&
				!expiringValues(h)[k] &&
				!excused[g] && !deadFor(members[g], k) {
				l.violation("group %q on %s: no member got %s (seq %d)",
					g.name, g.topic, k.id, confirmed[k])
			}
		}
	}
	return l
}

// redoMargin is how long before a clean restart an ack must have been
// sent to count as settled: time for it to reach the broker.
const redoMargin = time.Second

// redoWindow is the least time of quiet before a clean restart that
// checkRedone looks at: a nakked delivery's retry, which an earlier
// fault may have held up, comes well inside it.
const redoWindow = 3 * time.Second

// lineage names a durable cursor: a durable subscription's, or a
// group's, which its members share.
type lineage struct{ kind, name, topic string }

// lineageOf returns s's cursor, and false for a plain subscription.
func lineageOf(s *Subscription) (lineage, bool) {
	switch {
	case s.Group != "":
		return lineage{"group", s.Group, s.Topic}, true
	case s.Durable != "":
		return lineage{"durable", s.Subscriber + "/" + s.Durable, s.Topic},
			true
	}
	return lineage{}, false
}

// checkRedone: a clean restart (SIGTERM) keeps every cursor a durable
// subscription or a group had: neither is given again, after it, a
// message it acked before it, as far as its cursor covered (every
// stored message up to it acked, or never delivered because it
// expired). Only acks sent in quiet count: after the last fault before
// the restart ended, and redoMargin before it began.
func checkRedone(h *History) Line {
	l := Line{Invariant: "an acked job or durable message is not redone " +
		"after a clean restart"}
	expiring := expiringValues(h)
	for _, r := range h.Faults {
		if r.Kind != "restart" || !r.Healed {
			continue
		}
		var from time.Time
		for _, f := range h.Faults {
			end := f.End
			if !f.Healed {
				end = r.Start
			}
			if f != r && f.Start.Before(r.Start) && end.After(from) {
				from = end
			}
		}
		cutoff := r.Start.Add(-redoMargin)
		if cutoff.Sub(from) < redoWindow {
			continue
		}
		delivered := map[lineage]map[uint64]string{}
		acked := map[lineage]map[uint64]bool{}
		for _, s := range h.Subscriptions {
			k, ok := lineageOf(s)
			if !ok {
				continue
			}
			if delivered[k] == nil {
				delivered[k], acked[k] = map[uint64]string{}, map[uint64]bool{}
			}
			for _, d := range s.Deliveries {
				if !d.At.Before(from) && d.At.Before(cutoff) {
					delivered[k][d.Seq] = d.ID
					acked[k][d.Seq] = acked[k][d.Seq] || !d.Nakked
				}
			}
		}
		covered := map[lineage]uint64{}
		for k, seqs := range delivered {
			if len(seqs) > 0 {
				covered[k] = cursorOf(h.Final[k.topic], seqs, acked[k],
					expiring, k.topic)
			}
		}
		for _, s := range h.Subscriptions {
			k, _ := lineageOf(s)
			for _, d := range s.Deliveries {
				if d.At.After(r.End) && d.Seq <= covered[k] && acked[k][d.Seq] {
					l.mark(s.Topic, d.ID, d.Seq)
					l.violation("%s %q on %s: seq %d (%s), acked before the "+
						"restart at %s, given again at attempt %d", k.kind,
						k.name, k.topic, d.Seq, d.ID,
						r.Start.Format("15:04:05.000"), d.Attempt)
				}
			}
		}
	}
	return l
}

// cursorOf is where a cursor stands that was given delivered (seq →
// id) and had acked those acked: past the run of log's messages from
// the first delivered on, each acked, or an expiring one never
// delivered (which the broker skipped).
func cursorOf(log []Stored, delivered map[uint64]string,
	acked map[uint64]bool, expiring map[key]bool, topic string) uint64 {
	first := slices.Min(slices.Collect(maps.Keys(delivered)))
	at := first - 1
	for _, m := range log {
		_, given := delivered[m.Seq]
		switch {
		case m.Seq < first:
		case acked[m.Seq], !given && expiring[key{topic, m.ID}]:
			at = m.Seq
		default:
			return at
		}
	}
	return at
}

// nakGrace is how soon a nakked delivery comes again, at the most: its
// delay (the workload's nakDelay), the connection's retry timer, and
// slack, under the one-second ack timeout both drivers give the broker.
const nakGrace = 2 * time.Second

// checkNakked: a delivery handed back with a nak comes again, as a
// later attempt, to the same subscription or, in a group, to a member,
// or goes to $dead; unless its connection ended within nakGrace, which
// took the subscriber's obligation with it (a durable one is replayed
// the message on resume, which checkDurables holds it to), or ended
// later after a fault that slowed everything. A group member that
// leaves, or is made to (a refresh to fewer grants, a cut), hands the
// job on as its next attempt: only a fault of the broker's within
// nakGrace, after which the group replays it from its cursor at attempt
// 1, excuses it.
func checkNakked(h *History) Line {
	l := Line{Invariant: "every nakked delivery comes again or is " +
		"dead-lettered"}
	type letter struct{ topic, id string }
	dead := map[letter]bool{}
	for _, d := range h.DeadLetters {
		dead[letter{d.Topic, d.MessageID}] = true
	}
	again := func(s *Subscription, d Delivery) bool {
		for _, o := range h.Subscriptions {
			if o != s && (s.Group == "" || o.Group != s.Group ||
				o.Topic != s.Topic) {
				continue
			}
			if slices.ContainsFunc(o.Deliveries, func(e Delivery) bool {
				return e.ID == d.ID && e.Attempt > d.Attempt
			}) {
				return true
			}
		}
		return false
	}
	brokerFault := func(start, end time.Time) bool {
		return slices.ContainsFunc(h.Faults, func(f *Fault) bool {
			return f.Kind != "cut" && !f.Start.Before(start) &&
				!f.Start.After(end)
		})
	}
	for _, s := range h.Subscriptions {
		for _, d := range s.Deliveries {
			excused := s.Ended && (s.End.Before(d.At.Add(nakGrace)) ||
				slowedBetween(h, d.At, s.End))
			if s.Group != "" {
				excused = brokerFault(d.At, d.At.Add(nakGrace)) ||
					slowedBetween(h, d.At, d.At.Add(nakGrace))
			}
			if d.Nakked && !excused && !dead[letter{s.Topic, d.ID}] &&
				!again(s, d) {
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s on %s: seq %d nakked at attempt %d, never "+
					"sent again nor dead-lettered", s.Subscriber, s.Topic,
					d.Seq, d.Attempt)
			}
		}
	}
	return l
}

// checkExpired: no message is delivered after its expires_at, but one
// already on its way (nakGrace), or held up by a fault that slowed
// everything when it expired. The final read, after every fault was
// healed, is held to it without excuse.
func checkExpired(h *History) Line {
	l := Line{Invariant: "no message is delivered after it expired"}
	for _, s := range h.Subscriptions {
		for _, d := range s.Deliveries {
			expired := time.UnixMilli(d.ExpiresAt)
			if d.ExpiresAt != 0 && d.At.After(expired.Add(nakGrace)) &&
				!slowedBetween(h, expired.Add(-nakGrace), expired) {
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s on %s: seq %d delivered at %s, after it "+
					"expired at %s", s.Subscriber, s.Topic, d.Seq,
					d.At.Format("15:04:05.000"), expired.Format("15:04:05.000"))
			}
		}
	}
	// The final read asks for the whole log, after the run: the expired
	// messages in it must not come.
	for _, r := range h.FinalReads {
		expired := time.UnixMilli(r.ExpiresAt)
		if r.At.After(expired.Add(nakGrace)) {
			l.mark(r.Topic, r.ID, r.Seq)
			l.violation("the final read of %s: seq %d replayed at %s, after "+
				"it expired at %s", r.Topic, r.Seq,
				r.At.Format("15:04:05.000"), expired.Format("15:04:05.000"))
		}
	}
	return l
}

// checkDue: a delayed value is delivered no sooner than its deliver_at,
// which is no sooner than its delay after it was first sent.
func checkDue(h *History) Line {
	l := Line{Invariant: "no delayed message is delivered before it is due"}
	sent := map[key]time.Time{}
	for _, a := range h.Attempts {
		if _, seen := sent[key{a.Topic, a.ID}]; a.Delayed && !seen {
			sent[key{a.Topic, a.ID}] = a.At
		}
	}
	for _, s := range h.Subscriptions {
		for _, d := range s.Deliveries {
			first, ok := sent[key{s.Topic, d.ID}]
			earliest := first.UnixMilli() + delay
			switch {
			case !ok:
			case d.DeliverAt < earliest:
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s %s to %s: deliver_at %d, want %d or later: "+
					"sent at %s with delay_ms %d", s.Topic, d.ID,
					s.Subscriber, d.DeliverAt, earliest,
					first.Format("15:04:05.000"), delay)
			case d.At.UnixMilli() < d.DeliverAt:
				l.mark(s.Topic, d.ID, d.Seq)
				l.violation("%s %s to %s at %s, before its deliver_at %s",
					s.Topic, d.ID, s.Subscriber, d.At.Format("15:04:05.000"),
					time.UnixMilli(d.DeliverAt).Format("15:04:05.000"))
			}
		}
	}
	return l
}

// checkBounded: a delayed publish to a topic with a bound (History.Bounds, the
// broker's --max-delayed) is refused, not confirmed, while the bound is waiting
// there. The checker cannot see what waits, only what surely did: a value
// confirmed waits, from when the broker took it, until it is due, no sooner
// than delay after it was first sent (less the millisecond the broker's clock
// drops, as due times are in ms). The broker took a value after it was first
// sent and before its confirm, and took the values of one run (Attempt.Run) in
// the order they were sent. So a value confirmed while the bound, or more, of
// those taken before it (confirmed before it was first sent, or sent before it
// in its run) were not yet due at its confirm was taken past the bound. A
// repeat (confirmed as a duplicate) takes no room, and is not held to it.
func checkBounded(h *History) Line {
	l := Line{Invariant: "a topic's delayed messages wait within its bound"}
	type sending struct {
		at       time.Time // first sent
		run, nth int       // its run, and its place among the attempts
	}
	first := map[key]sending{}
	for i, a := range h.Attempts {
		k := key{a.Topic, a.ID}
		if _, seen := first[k]; a.Delayed && !seen && h.Bounds[a.Topic] > 0 {
			first[k] = sending{a.At, a.Run, i}
		}
	}
	// Each topic's first confirms, in the order they came.
	confirms, seen := map[string][]Confirm{}, map[key]bool{}
	for _, c := range h.Confirms {
		k := key{c.Topic, c.ID}
		if _, held := first[k]; held && c.Delayed && !c.Duplicate && !seen[k] {
			confirms[c.Topic] = append(confirms[c.Topic], c)
		}
		seen[k] = true
	}
	wait := time.Duration(delay) * time.Millisecond
	for _, topic := range slices.Sorted(maps.Keys(confirms)) {
		list, bound := confirms[topic], h.Bounds[topic]
		for i, x := range list {
			sx, waiting := first[key{topic, x.ID}], 0
			// Only one confirmed within delay before x's may still wait.
			for j := i - 1; j >= 0 && list[j].At.Add(wait).After(x.At); j-- {
				sy := first[key{topic, list[j].ID}]
				before := list[j].At.Before(sx.at) ||
					sx.run != 0 && sy.run == sx.run && sy.nth < sx.nth
				if before && sy.at.Add(wait-time.Millisecond).After(x.At) {
					waiting++
				}
			}
			if waiting >= bound {
				l.mark(topic, x.ID, 0)
				l.violation("%s %s: confirmed at %s while %d delayed values "+
					"taken before it were not yet due: bound %d", topic,
					x.ID, x.At.Format("15:04:05.000"), waiting, bound)
			}
		}
	}
	return l
}

// slowedBetween reports whether a fault that delays without ending a
// connection (a paused broker, a stalled network, a client that stopped
// reading) was in force at some moment from start to end.
func slowedBetween(h *History, start, end time.Time) bool {
	return slices.ContainsFunc(h.Faults, func(f *Fault) bool {
		slow := f.Kind == "pause" || f.Kind == "stall" || f.Kind == "stop"
		return slow && !f.Start.After(end) &&
			(!f.Healed || !f.End.Before(start))
	})
}

// checkDeadOnce: a message reaches $dead at most once for each durable
// cursor that gave up on it, a durable subscription's or a group's,
// faults or not. A plain subscription, and a subscriber whose
// subscriptions to the topic were of several kinds, may ask for a
// message again, and its dead letter is another one.
func checkDeadOnce(h *History) Line {
	l := Line{Invariant: "each dead letter is stored once"}
	// A dead letter names its subscriber; the cursor is its one lineage
	// on the topic, and a member's is its group's.
	lineage := map[[2]string]string{} // subscriber and topic
	for _, s := range h.Subscriptions {
		k := [2]string{s.Subscriber, s.Topic}
		switch {
		case !oneLineage(h, s.Subscriber, s.Topic):
		case s.Group != "":
			lineage[k] = "group " + s.Group
		default:
			lineage[k] = "durable " + s.Subscriber + "/" + s.Durable
		}
	}
	count := map[[3]string]int{}
	for _, d := range h.DeadLetters {
		if who := lineage[[2]string{d.Subscriber, d.Topic}]; who != "" {
			count[[3]string{d.Topic, d.MessageID, who}]++
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(count),
		func(a, b [3]string) int {
			return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]),
				cmp.Compare(a[2], b[2]))
		}) {
		if count[k] > 1 {
			l.mark(k[0], k[1], 0)
			l.violation("%s on %s: dead-lettered %d times for %s", k[1],
				k[0], count[k], k[2])
		}
	}
	return l
}

// AnswerBound is how long a publish may wait for its answer, published
// or an error, while nothing fails: what protocol.md promises on either
// engine (on JetStream, the engine's own AnswerBound).
const AnswerBound = 30 * time.Second

// checkAnswered: every publish sent while nothing failed, and while
// nothing failed for AnswerBound after it, was answered within it; and
// no probe of the run stalled. A fault near a publish may cost it its
// answer (its connection drops, and it is sent again): only the quiet
// ones are held to the bound, which the drain after the last heal always
// is.
func checkAnswered(h *History) Line {
	l := Line{Invariant: "every publish made while nothing failed was " +
		"answered within " + AnswerBound.String()}
	type sent struct{ publisher, topic, id string }
	answers := map[sent][]time.Time{}
	for _, c := range h.Confirms {
		k := sent{c.Publisher, c.Topic, c.ID}
		answers[k] = append(answers[k], c.At)
	}
	for _, r := range h.Refusals {
		k := sent{r.Publisher, r.Topic, r.ID}
		answers[k] = append(answers[k], r.At)
	}
	for _, a := range h.Attempts {
		end := a.At.Add(AnswerBound)
		if a.Unread || faultBetween(h, a.At, end) {
			continue
		}
		if !slices.ContainsFunc(answers[sent{a.Publisher, a.Topic, a.ID}],
			func(at time.Time) bool {
				return !at.Before(a.At) && !at.After(end)
			}) {
			l.violation("%s's %s on %s, sent at %s, was not answered",
				a.Publisher, a.ID, a.Topic, a.At.Format("15:04:05.000"))
		}
	}
	for _, what := range h.Stalls {
		l.violation("%s", what)
	}
	return l
}

// faultBetween reports whether a fault was under way at any moment from
// start to end.
func faultBetween(h *History, start, end time.Time) bool {
	return slices.ContainsFunc(h.Faults, func(f *Fault) bool {
		return !f.Start.After(end) && (!f.Healed || !f.End.Before(start))
	})
}

// checkHealed: every fault the nemesis injected was undone.
func checkHealed(h *History) Line {
	l := Line{Invariant: "every fault was healed"}
	for _, f := range h.Faults {
		if !f.Healed {
			l.violation("%s of %s, from %s", f.Kind, f.Target,
				f.Start.Format("15:04:05.000"))
		}
	}
	return l
}

// sortedKeys returns m's keys in order, for reports that read the same
// from run to run.
func sortedKeys[V any](m map[key]V) []key {
	return slices.SortedFunc(maps.Keys(m), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.id, b.id))
	})
}

// workload returns h without what was published to, or read from, the
// broker's own topics.
func (h *History) workload() *History {
	own := func(topic string) bool { return strings.HasPrefix(topic, "$") }
	w := &History{Subscriptions: h.Subscriptions, Faults: h.Faults,
		Final: h.Final, DeadLetters: h.DeadLetters, Refusals: h.Refusals,
		Stalls: h.Stalls, Acks: h.Acks, FinalReads: h.FinalReads,
		Bounds: h.Bounds}
	for _, a := range h.Attempts {
		if !own(a.Topic) {
			w.Attempts = append(w.Attempts, a)
		}
	}
	for _, c := range h.Confirms {
		if !own(c.Topic) {
			w.Confirms = append(w.Confirms, c)
		}
	}
	return w
}
