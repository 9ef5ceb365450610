package chaos

import (
	"cmp"
	"maps"
	"slices"
	"time"
)

// # Promises, while a run goes on
//
// Check judges a finished run, after its drain. The lab page judges one
// after every event, while messages are still on their way, so it asks
// Promises: Check's lines that hold at every moment, grouped into the
// promises a learner reads, and two that need the run's clock. A
// promise that can only break later (a delivery whose ack timeout has
// not passed yet) is held so far. The lines that need a drain (every
// durable subscriber and every group has every value) are Check's
// alone.

// Promise is one promise and its verdict so far: broken if Violations
// is not zero.
type Promise struct {
	Name       string
	Violations int
	Examples   []string
	Marks      []Mark
}

// Promises judges h, a run still going, as at now, for a broker whose
// ack timeout is ackTimeout and whose retries come up to late after
// their deadline. Its log, h.Final, is what the disk holds now.
func Promises(h *History, ackTimeout, late time.Duration,
	now time.Time) []Promise {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.workload()
	stored := storedIDs(w)
	return []Promise{
		promise("no confirmed message is lost",
			checkConfirmed(w, stored), checkConfirmedSeqs(w, stored)),
		promise("no seq is given to two messages",
			checkOneValuePerSeq(w), checkOneSeqPerID(stored)),
		promise("each subscriber sees its topic in seq order, with no "+
			"silent gap", checkOrder(w), checkGaps(w)),
		promise("a QoS 1 delivery is retried until acked or "+
			"dead-lettered, once", checkRetried(w, ackTimeout+late, now)),
		promise("a group's job is with one member at a time",
			checkOneHolder(w, ackTimeout)),
	}
}

// promise joins lines into one promise.
func promise(name string, lines ...Line) Promise {
	p := Promise{Name: name}
	for _, l := range lines {
		p.Violations += l.Violations
		p.Examples = append(p.Examples, l.Examples...)
		p.Marks = append(p.Marks, l.Marks...)
	}
	return p
}

// storedIDs maps each message of the final logs to the seqs it is
// stored at.
func storedIDs(h *History) map[key][]uint64 {
	stored := map[key][]uint64{}
	for topic, log := range h.Final {
		for _, m := range log {
			stored[key{topic, m.ID}] = append(stored[key{topic, m.ID}],
				m.Seq)
		}
	}
	return stored
}

// checkRetried: a QoS 1 delivery is followed, within its ack timeout and
// a retry's lateness (within), by its ack (or, for a retry, an ack of the
// attempt before it, which the retry crossed on the wire), a retry, its move to
// another member of its group, a dead letter, or the end of its
// connection (its subscription's is another promise); and no delivery
// is dead-lettered twice on one durable cursor or group. A fault under
// way excuses the wait: a paused broker retries late.
func checkRetried(h *History, within time.Duration, now time.Time) Line {
	l := Line{Invariant: "a QoS 1 delivery is retried until acked or " +
		"dead-lettered, once"}
	type letter struct{ subscriber, topic, id string }
	dead := map[letter]int{}
	for _, d := range h.DeadLetters {
		dead[letter{d.Subscriber, d.Topic, d.MessageID}]++
	}
	for _, k := range slices.SortedFunc(maps.Keys(dead), func(a, b letter) int {
		return cmp.Or(cmp.Compare(a.topic, b.topic), cmp.Compare(a.id, b.id),
			cmp.Compare(a.subscriber, b.subscriber))
	}) {
		if dead[k] > 1 && oneLineage(h, k.subscriber, k.topic) {
			l.mark(k.topic, k.id, 0)
			l.violation("%s on %s: dead-lettered %d times for %s", k.id,
				k.topic, dead[k], k.subscriber)
		}
	}
	acks, jobs := ackTimes(h), groupJobs(h)
	for si, s := range h.Subscriptions {
		last := map[string]int{} // each message's last delivery here
		// Each delivery's attempt before it here: a retry that crossed
		// the ack of that attempt on the wire is answered by it.
		before := make([]time.Time, len(s.Deliveries))
		for i, d := range s.Deliveries {
			if j, ok := last[d.ID]; ok {
				before[i] = s.Deliveries[j].At
			}
			last[d.ID] = i
		}
		for i, d := range s.Deliveries {
			if d.QoS != 1 || dead[letter{s.Subscriber, s.Topic, d.ID}] > 0 ||
				now.Sub(d.At) <= within || faultBetween(h, d.At, now) {
				continue
			}
			acked := acks[ackKey{s.Subscriber, s.Topic, d.ID}]
			since := d.At
			if !before[i].IsZero() {
				since = before[i]
			}
			answered := s.Ended && !s.End.After(d.At.Add(within)) ||
				last[d.ID] > i ||
				len(acked) > 0 && !acked[len(acked)-1].Before(since) ||
				slices.ContainsFunc(jobs[jobKey{s.Group, s.Topic, d.ID}],
					func(o job) bool { return o.sub != si && !o.at.Before(d.At) })
			if !answered {
				l.markFor(s.Subscriber, s.Topic, d.ID, d.Seq)
				l.violation("%s on %s: seq %d, attempt %d at %s, neither "+
					"acked, retried nor dead-lettered since", s.Subscriber,
					s.Topic, d.Seq, d.Attempt, d.At.Format("15:04:05.000"))
			}
		}
	}
	return l
}

// oneLineage reports whether every subscription subscriber made on
// topic carried on one chain of deliveries: all under one durable name,
// or all in one group. A plain subscription, or a new durable name, may
// ask for a message again, and its dead letter is another one.
func oneLineage(h *History, subscriber, topic string) bool {
	lineage := ""
	for _, s := range h.Subscriptions {
		if s.Subscriber != subscriber || s.Topic != topic {
			continue
		}
		this := "durable " + s.Durable
		if s.Group != "" {
			this = "group " + s.Group
		}
		plain := s.Durable == "" && s.Group == "" || s.Overlap != ""
		if plain || lineage != "" && this != lineage {
			return false
		}
		lineage = this
	}
	return lineage != ""
}

// delayed reports whether, at some moment from start to end, the broker
// was paused or subscriber was not reading: what it got then may have
// been sent before.
func delayed(h *History, subscriber string, start, end time.Time) bool {
	return slices.ContainsFunc(h.Faults, func(f *Fault) bool {
		slowed := f.Kind == "pause" ||
			f.Kind == "stop" && f.Target == subscriber
		return slowed && !f.Start.After(end) &&
			(!f.Healed || !f.End.Before(start))
	})
}

// checkOneHolder: no member of a group gets a job while another member
// holds it: from its delivery until its ack, the end of its connection,
// or its ack timeout, as the members saw it, but for deliveries a pause
// or a stop in reading may have delayed, to either member.
func checkOneHolder(h *History, ackTimeout time.Duration) Line {
	l := Line{Invariant: "a group's job is with one member at a time"}
	acks, jobs := ackTimes(h), groupJobs(h)
	for ai, a := range h.Subscriptions {
		if a.Group == "" {
			continue
		}
		for _, d := range a.Deliveries {
			// A paused broker, or a member not reading, hands the member
			// a delivery late: it held it, as the broker saw it, from
			// before it saw it.
			if d.QoS != 1 ||
				delayed(h, a.Subscriber, d.At.Add(-ackTimeout), d.At) {
				continue
			}
			end := d.At.Add(ackTimeout)
			if a.Ended && a.End.Before(end) {
				end = a.End
			}
			for _, at := range acks[ackKey{a.Subscriber, a.Topic, d.ID}] {
				if !at.Before(d.At) && at.Before(end) {
					end = at
				}
			}
			for _, o := range jobs[jobKey{a.Group, a.Topic, d.ID}] {
				b := h.Subscriptions[o.sub]
				// At one instant, the subscription made later got it
				// later.
				later := o.at.After(d.At) || o.at.Equal(d.At) && o.sub > ai
				if o.sub != ai && later && o.at.Before(end) &&
					!delayed(h, b.Subscriber, o.at.Add(-ackTimeout), o.at) {
					l.mark(a.Topic, d.ID, d.Seq)
					l.violation("group %q on %s: seq %d with %s and %s "+
						"at %s", a.Group, a.Topic, d.Seq, a.Subscriber,
						b.Subscriber, o.at.Format("15:04:05.000"))
				}
			}
		}
	}
	return l
}

// ackKey names the acks of one subscriber for one message.
type ackKey struct{ subscriber, topic, id string }

// ackTimes returns when each subscriber acked each message, in order:
// the checks look them up for every delivery.
func ackTimes(h *History) map[ackKey][]time.Time {
	times := map[ackKey][]time.Time{}
	for _, a := range h.Acks {
		k := ackKey{a.Subscriber, a.Topic, a.ID}
		times[k] = append(times[k], a.At)
	}
	return times
}

// jobKey names one message of a group's topic; job is one delivery of
// it, to the subscription at index sub of the history.
type (
	jobKey struct{ group, topic, id string }
	job    struct {
		sub int
		at  time.Time
	}
)

// groupJobs returns every group delivery of each message.
func groupJobs(h *History) map[jobKey][]job {
	jobs := map[jobKey][]job{}
	for i, s := range h.Subscriptions {
		if s.Group == "" {
			continue
		}
		for _, d := range s.Deliveries {
			k := jobKey{s.Group, s.Topic, d.ID}
			jobs[k] = append(jobs[k], job{i, d.At})
		}
	}
	return jobs
}
