package main

import (
	"fmt"
	"slices"
	"strings"

	sysevents "github.com/popsub/popsub/xray"
)

// This file is the x-ray's model: the broker's tables as the page knows
// them, rebuilt from the events the broker publishes on $sys/events. It
// has no DOM in it, so it is tested natively (xray_test.go).

// maxTimeline and maxDead bound what the page keeps.
const (
	maxTimeline = 200
	maxDead     = 50
)

// event is one event from $sys/events, as the broker defines it.
type event = sysevents.Event

// connection is one broker connection as the x-ray shows it.
type connection struct {
	id            uint64
	client, sub   string
	subscriptions []string
}

// name is how the x-ray labels a connection.
func (c *connection) name() string {
	if c.client != "" {
		return fmt.Sprintf("#%d %s", c.id, c.client)
	}
	return fmt.Sprintf("#%d %s", c.id, c.sub)
}

// xray is the broker's state as the page knows it.
type xray struct {
	topics      map[string]uint64
	connections map[uint64]*connection
	pending     map[string]event // by pendingKey
	dead        []event          // newest last
	timeline    []event          // newest last
}

// newXray returns an empty model.
func newXray() *xray {
	return &xray{topics: map[string]uint64{},
		connections: map[uint64]*connection{}, pending: map[string]event{}}
}

// pendingKey names a pending delivery: connection, topic, message id.
func pendingKey(e event) string {
	return fmt.Sprintf("%d\x00%s\x00%s", e.Conn, e.Topic, e.MessageID)
}

// apply folds one event into the model.
func (x *xray) apply(e event) {
	if e.Kind == "snapshot" {
		x.reset(e)
		return
	}
	x.timeline = append(x.timeline, e)
	if len(x.timeline) > maxTimeline {
		x.timeline = x.timeline[len(x.timeline)-maxTimeline:]
	}
	switch e.Kind {
	case "published":
		x.topics[e.Topic] = max(x.topics[e.Topic], e.Seq)
	case "delivered", "redelivered":
		if e.QoS == 1 {
			x.pending[pendingKey(e)] = e
		}
	case "acked":
		delete(x.pending, pendingKey(e))
	case "dead_lettered":
		delete(x.pending, pendingKey(e))
		x.dead = append(x.dead, e)
		if len(x.dead) > maxDead {
			x.dead = x.dead[1:]
		}
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
	case "disconnected":
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

// reset replaces the model with a snapshot's state, keeping the
// timeline and the dead letters seen so far.
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

// sortedPending lists pending deliveries by connection, topic and seq.
func (x *xray) sortedPending() []event {
	list := make([]event, 0, len(x.pending))
	for _, p := range x.pending {
		list = append(list, p)
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

// describe is one line of the timeline for e.
func describe(e event) string {
	who := e.Client
	if who == "" {
		who = e.Sub
	}
	switch e.Kind {
	case "published":
		return fmt.Sprintf("published %s #%d (qos %d)", e.Topic, e.Seq, e.QoS)
	case "delivered", "redelivered", "acked", "dead_lettered":
		return fmt.Sprintf("%s %s #%d to %s, attempt %d", e.Kind, e.Topic,
			e.Seq, who, e.Attempt)
	case "subscribed", "unsubscribed":
		return fmt.Sprintf("%s %s %s", who, e.Kind, e.Topic)
	case "disconnected_slow":
		return fmt.Sprintf("%s cut off as a slow consumer (%s)", who,
			e.Reason)
	}
	return fmt.Sprintf("%s %s", who, e.Kind)
}
