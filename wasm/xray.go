package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/popsub/popsub/wire"
)

// This file is the x-ray's model: the broker's tables as the page knows
// them, rebuilt from the events the broker publishes on $sys/events and
// the dead letters it keeps on $dead/<topic>. It has no DOM in it, so it
// is tested natively (xray_test.go).

// maxDead bounds the dead letters the page keeps, and asks the broker to
// replay when it subscribes to a dead-letter topic.
const maxDead = 50

// event is one event from $sys/events, as the broker defines it.
type event = wire.Event

// connection is one broker connection as the x-ray shows it.
type connection struct {
	id            uint64
	client, sub   string
	subscriptions []string
}

// name is how the x-ray labels a connection: its client name, or its
// token's subject, then its number.
func (c *connection) name() string {
	who := c.client
	if who == "" {
		who = c.sub
	}
	return fmt.Sprintf("%s #%d", who, c.id)
}

// deadRow is one dead letter, read from the message the broker published
// on $dead/<topic>: it says who did not ack by name, which stays true
// after a restart, when connection numbers start over.
type deadRow struct {
	DeadTopic string `json:"-"` // $dead/<topic>
	DeadSeq   uint64 `json:"-"` // its seq there
	wire.DeadLetter
}

// who names whoever did not ack: the client's name if it gave one.
func (d deadRow) who() string {
	if d.Client != "" {
		return d.Client
	}
	return d.Subscriber
}

// xray is the broker's state as the page knows it.
type xray struct {
	topics      map[string]uint64
	connections map[uint64]*connection
	pending     map[string]event // by pendingKey
	dead        []deadRow        // newest last
	deadTopics  map[string]bool  // $dead topics the page reads
}

// newXray returns an empty model.
func newXray() *xray {
	return &xray{topics: map[string]uint64{},
		connections: map[uint64]*connection{}, pending: map[string]event{},
		deadTopics: map[string]bool{}}
}

// pendingKey names a pending delivery: connection, topic, message id.
func pendingKey(e event) string {
	return fmt.Sprintf("%d\x00%s\x00%s", e.Conn, e.Topic, e.MessageID)
}

// apply folds one event into the model.
func (x *xray) apply(e event) {
	switch e.Kind {
	case "snapshot":
		x.reset(e)
	case "published":
		x.topics[e.Topic] = max(x.topics[e.Topic], e.Seq)
	case "delivered", "redelivered", "nakked":
		if e.QoS == 1 {
			x.pending[pendingKey(e)] = e
		}
	case "acked", "dead_lettered", "moved":
		delete(x.pending, pendingKey(e))
	default:
		x.applyConnection(e)
	}
}

// applyConnection folds a connection or subscription event.
func (x *xray) applyConnection(e event) {
	switch e.Kind {
	case "connected":
		x.connections[e.Conn] = &connection{id: e.Conn, client: e.Client,
			sub: e.Sub}
	case "disconnected", "disconnected_slow":
		delete(x.connections, e.Conn)
		for key, p := range x.pending {
			if p.Conn == e.Conn {
				delete(x.pending, key)
			}
		}
	case "subscribed", "unsubscribed":
		c := x.connections[e.Conn]
		if c == nil {
			return
		}
		c.subscriptions = slices.DeleteFunc(c.subscriptions,
			func(s string) bool { return s == e.Topic })
		if e.Kind == "subscribed" {
			c.subscriptions = append(c.subscriptions, e.Topic)
		}
	}
}

// reset replaces the tables with a snapshot's, keeping the dead letters:
// they come from their own topics, not from events.
func (x *xray) reset(e event) {
	if e.State == nil {
		return
	}
	x.topics = map[string]uint64{}
	for name, head := range e.State.Topics {
		x.topics[name] = head
	}
	x.connections = map[uint64]*connection{}
	for _, c := range e.State.Connections {
		x.connections[c.Conn] = &connection{id: c.Conn, client: c.Client,
			sub: c.Sub, subscriptions: slices.Clone(c.Subscriptions)}
	}
	x.pending = map[string]event{}
	for _, p := range e.State.Pending {
		x.pending[pendingKey(p)] = p
	}
}

// unreadDeadTopics lists the dead-letter topics the model knows of and the
// page has not subscribed to yet, and marks them read: the page then
// subscribes to each, with its retained history, so that a reload still
// shows what died before it.
func (x *xray) unreadDeadTopics() []string {
	var list []string
	for name := range x.topics {
		if strings.HasPrefix(name, "$dead/") && !x.deadTopics[name] {
			x.deadTopics[name] = true
			list = append(list, name)
		}
	}
	slices.Sort(list)
	return list
}

// forgetDeadTopics is called when the x-ray's connection ends: its
// subscriptions end with it, and the next one subscribes again.
func (x *xray) forgetDeadTopics() {
	x.deadTopics = map[string]bool{}
}

// addDead records the dead letter the broker published as seq on
// deadTopic, once: a resubscription replays what the page has seen.
func (x *xray) addDead(deadTopic string, seq uint64,
	payload json.RawMessage) {
	row := deadRow{DeadTopic: deadTopic, DeadSeq: seq}
	if json.Unmarshal(payload, &row) != nil {
		return
	}
	same := func(d deadRow) bool {
		return d.DeadTopic == deadTopic && d.DeadSeq == seq
	}
	if slices.ContainsFunc(x.dead, same) {
		return
	}
	x.dead = append(x.dead, row)
	slices.SortStableFunc(x.dead, func(a, b deadRow) int {
		return int(a.DeadSeq) - int(b.DeadSeq)
	})
	if len(x.dead) > maxDead {
		x.dead = x.dead[len(x.dead)-maxDead:]
	}
}

// sortedPending lists pending deliveries by connection, topic and seq,
// leaving out the connection watching (the page's own x-ray, whose acks
// of dead letters are not part of the story).
func (x *xray) sortedPending(watcher uint64) []event {
	list := make([]event, 0, len(x.pending))
	for _, p := range x.pending {
		if p.Conn != watcher {
			list = append(list, p)
		}
	}
	slices.SortFunc(list, func(a, b event) int {
		if a.Conn != b.Conn {
			return int(a.Conn) - int(b.Conn)
		}
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return int(a.Seq) - int(b.Seq)
	})
	return list
}

// connectionName labels connection id, as known.
func (x *xray) connectionName(id uint64) string {
	if c := x.connections[id]; c != nil {
		return c.name()
	}
	return fmt.Sprintf("#%d", id)
}
