package popsub

import (
	"encoding/json"
	"strings"
	"sync/atomic"
	"time"

	"github.com/popsub/popsub/xray"
)

// This file is the broker's x-ray: it publishes the broker's own
// transitions as events on $sys/events, so that the playground (or any
// client with a $sys grant) can watch messages being published,
// delivered, acked, retried and dead-lettered as they happen.
//
// Events are queued on a bounded channel and published by one goroutine,
// never by the code that noticed them: that code often holds a topic's or
// a connection's lock, and publishing takes a topic's lock of its own.
// When the queue is full, events are dropped and counted, not waited
// for: the x-ray must never slow the broker it watches. Nothing is queued
// at all while nobody subscribes to a $sys topic, and no event is made
// about a $sys topic, so the feed cannot feed on itself.

// EventsTopic is the topic the broker publishes its transitions on.
const EventsTopic = "$sys/events"

// eventQueue is how many events may wait for the events goroutine.
const eventQueue = 4096

// Event is one transition of the broker's state; see package xray, which
// defines it so that clients (the playground's among them) can decode it
// without importing the broker.
type Event = xray.Event

// State is a snapshot of the broker's tables; see package xray.
type State = xray.State

// ConnectionState is one connection in a State; see package xray.
type ConnectionState = xray.ConnectionState

// eventsLoop publishes queued events until Shutdown.
func (b *Broker) eventsLoop() {
	defer b.loops.Done()
	for {
		select {
		case e := <-b.events:
			payload, _ := json.Marshal(e)
			b.publish(&Message{Topic: EventsTopic, ID: newID(),
				Payload: payload}, b.stop)
		case <-b.stop:
			return
		}
	}
}

// emit queues e if anyone watches. It never blocks and takes no lock.
func (b *Broker) emit(e Event) {
	if b.watchers.Load() == 0 || strings.HasPrefix(e.Topic, "$sys/") {
		return
	}
	e.Time = time.Now().UnixMilli()
	select {
	case b.events <- e:
	default:
		if b.dropped.Add(1)%1000 == 1 {
			b.logger.Warn("x-ray events dropped", "total", b.dropped.Load())
		}
	}
}

// noteMessage emits a message's transition, seen from connection c (nil
// for published) and its pending entry p (nil for QoS 0).
func (b *Broker) noteMessage(kind string, c *connection, m *Message,
	p *pending) {
	if b.watchers.Load() == 0 {
		return
	}
	e := Event{Kind: kind, Topic: m.Topic, Seq: m.Seq, MessageID: m.ID,
		QoS: m.QoS}
	if c != nil {
		e.Conn, e.Client, e.Sub = c.id, c.client, c.sub
	}
	if p != nil {
		e.Attempt, e.Deadline = p.attempt, p.deadline.UnixMilli()
	}
	b.emit(e)
}

// noteConnection emits a connection's transition. A connection that
// never authenticated was never announced, and leaves no event either.
func (b *Broker) noteConnection(kind string, c *connection, reason string) {
	if c.sub == "" {
		return
	}
	b.emit(Event{Kind: kind, Conn: c.id, Client: c.client, Sub: c.sub,
		Reason: reason})
}

// noteSubscription emits a subscription's transition, and keeps count of
// who watches $sys topics. A new watcher of EventsTopic gets a snapshot.
func (b *Broker) noteSubscription(kind string, s *subscription) {
	if strings.HasPrefix(s.filter, "$sys/") {
		if kind == "unsubscribed" {
			b.watchers.Add(-1)
			return
		}
		b.watchers.Add(1)
		if s.filter == EventsTopic {
			b.emit(Event{Kind: "snapshot", State: b.snapshot()})
		}
		return
	}
	c := s.conn
	b.emit(Event{Kind: kind, Conn: c.id, Client: c.client, Sub: c.sub,
		Topic: s.filter})
}

// snapshot copies the broker's tables, one lock at a time.
func (b *Broker) snapshot() *State {
	state := &State{Topics: map[string]uint64{}}
	for _, t := range b.topicList() {
		if !strings.HasPrefix(t.name, "$sys/") {
			t.mu.Lock()
			state.Topics[t.name] = t.head
			t.mu.Unlock()
		}
	}
	for _, c := range b.connectionList() {
		if cs, ok := c.state(state); ok {
			state.Connections = append(state.Connections, cs)
		}
	}
	return state
}

// state describes c, if it has authenticated, and adds its pending
// entries to state.
func (c *connection) state(state *State) (ConnectionState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sub == "" {
		return ConnectionState{}, false
	}
	cs := ConnectionState{Conn: c.id, Client: c.client, Sub: c.sub,
		Subscriptions: []string{}}
	for filter := range c.subscriptions {
		cs.Subscriptions = append(cs.Subscriptions, filter)
	}
	for _, q := range c.pending {
		for _, p := range q.live() {
			m := p.message
			state.Pending = append(state.Pending, Event{Kind: "pending",
				Conn: c.id, Client: c.client, Sub: c.sub, Topic: m.Topic,
				Seq: m.Seq, MessageID: m.ID, QoS: m.QoS, Attempt: p.attempt,
				Deadline: p.deadline.UnixMilli()})
		}
	}
	return cs, true
}

// connectionIDs numbers connections for events, from 1.
var connectionIDs atomic.Uint64
