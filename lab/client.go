package lab

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/chaos"
	"github.com/popsub/popsub/wire"
)

// # The clients
//
// Each client speaks the protocol as a real one does: it authenticates,
// subscribes, publishes, acks every QoS 1 delivery unless the learner
// holds its acks, and, when its connection drops, connects again after
// reconnectDelay, subscribes again (with its durable name, or after the
// newest seq it saw) and sends again every QoS 1 publish not yet
// confirmed, with the same message_id. A QoS 0 publish made while it is
// not connected is lost: at most once means that. Everything it sends
// and gets goes into the run's chaos.History.

// sub is a subscription as the learner asked for it.
type sub struct {
	topic          string
	after          *uint64
	durable, group string
}

// heldAck is a QoS 1 delivery whose ack the learner holds.
type heldAck struct {
	Topic   string `json:"topic"`
	Seq     uint64 `json:"seq"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt"`
	// Due is when the broker sends it again, in ms since the run began.
	Due int64 `json:"due"`
}

// conn is one connection of a client: its link, and the frames queued
// for its writer.
type conn struct {
	link *link
	out  [][]byte
	wake chan struct{}
}

// client is alice, bob or carol.
type client struct {
	lab  *Lab
	name string

	mu sync.Mutex
	// conn is the connection now; nil while the client is not connected.
	conn *conn
	// subs are its subscriptions, made again on each connection;
	// current are this connection's, as the history knows them, by
	// topic; newest is the newest seq seen on each topic.
	subs    []sub
	current map[string]*chaos.Subscription
	newest  map[string]uint64
	// replacing are subscriptions sent on a topic the connection already
	// has one on, waiting for their reply: until it comes, deliveries
	// are the old one's.
	replacing map[string][]*chaos.Subscription
	// holding is set while the learner holds its acks; held are the
	// deliveries waiting for one.
	holding bool
	held    []heldAck
	// reading is closed while the client reads its connection.
	reading chan struct{}
	stopped func() // heals the "stop" fault
	// unconfirmed are its QoS 1 publishes not yet confirmed, by id, in
	// the order sent.
	unconfirmed map[string][]byte
	order       []string
	published   int
	// started is set once the learner's first action connected it.
	started bool
}

// start connects the client on the learner's first action for it;
// c.mu is held.
func (c *client) start() {
	if !c.started {
		c.started = true
		c.connectLocked()
	}
}

// connect connects the client again, unless it is connected.
func (c *client) connect() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		c.connectLocked()
	}
}

// connectLocked opens a link to the broker running now, or tries again
// later while it is down.
func (c *client) connectLocked() {
	c.lab.mu.Lock()
	b, state := c.lab.broker, c.lab.state
	c.lab.mu.Unlock()
	switch state {
	case "closed":
		return
	case "down":
		time.AfterFunc(reconnectDelay, c.connect)
		return
	}
	l := newLink(c.lab.gate, func(why string) {
		c.lab.record(Event{Kind: "disconnect", From: "broker", To: c.name,
			Label: why})
	})
	l.lost = func(delivery []byte) {
		var f wire.Received
		json.Unmarshal(delivery, &f)
		c.lab.record(Event{Kind: "lost", From: "broker", To: c.name,
			Label: fmt.Sprintf("seq %d lost on the way", f.Seq),
			Topic: f.Topic, Seq: f.Seq, ID: f.MessageID,
			Value: value(f.Payload)})
	}
	go b.serve(l)
	c.conn = &conn{link: l, wake: make(chan struct{}, 1)}
	token, _ := popsub.NewToken(c.lab.secret, c.name, 24*time.Hour)
	c.queue(wire.Frame{Type: "auth", Token: token, Client: c.name})
	c.lab.record(Event{Kind: "connect", From: c.name, To: "broker",
		Label: "connect"})
	for _, s := range c.subs {
		c.sendSubscribe(s)
	}
	for _, id := range c.order {
		c.sendPublish(c.unconfirmed[id], id, 1)
	}
	go c.readLoop(l)
	go c.writeLoop(c.conn)
}

// queue queues a frame for the connection's writer; c.mu is held.
func (c *client) queue(f any) {
	data, _ := json.Marshal(f)
	c.conn.out = append(c.conn.out, data)
	select {
	case c.conn.wake <- struct{}{}:
	default:
	}
}

// writeLoop sends what is queued for cn, in order, until its link ends.
func (c *client) writeLoop(cn *conn) {
	for {
		select {
		case <-cn.wake:
		case <-cn.link.done:
			return
		}
		c.mu.Lock()
		out := cn.out
		cn.out = nil
		c.mu.Unlock()
		for _, frame := range out {
			if cn.link.send(frame) != nil {
				return
			}
		}
	}
}

// subscribe adds a subscription and sends it.
func (c *client) subscribe(s sub) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subs = slices.DeleteFunc(c.subs, func(o sub) bool {
		return o.topic == s.topic
	})
	c.subs = append(c.subs, s)
	if !c.started {
		c.start()
		return
	}
	c.sendSubscribe(s)
}

// sendSubscribe sends s on this connection; c.mu is held. A plain
// subscription made again starts after the newest seq the client saw.
func (c *client) sendSubscribe(s sub) {
	if c.conn == nil {
		return
	}
	after := s.after
	if newest, ok := c.newest[s.topic]; ok && s.durable == "" &&
		s.group == "" {
		after = &newest
	}
	record := c.lab.history.Subscribed(&chaos.Subscription{
		Subscriber: c.name, Topic: s.topic, Durable: s.durable,
		Group: s.group, After: after})
	if c.current[s.topic] == nil {
		c.current[s.topic] = record
	} else {
		c.replacing[s.topic] = append(c.replacing[s.topic], record)
	}
	c.queue(wire.Frame{Type: "subscribe", Topic: s.topic, After: after,
		Durable: s.durable, Group: s.group})
	label := "subscribe " + s.topic
	switch {
	case s.durable != "":
		label += " durable " + s.durable
	case s.group != "":
		label += " group " + s.group
	case after != nil:
		label += fmt.Sprintf(" after %d", *after)
	}
	c.lab.record(Event{Kind: "subscribe", From: c.name, To: "broker",
		Label: label, Topic: s.topic})
}

// publish publishes the client's next value on topic.
func (c *client) publish(topic string, qos int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published++
	id := fmt.Sprintf("%s-%d", c.name, c.published)
	payload, _ := json.Marshal(id)
	frame, _ := json.Marshal(wire.Frame{Type: "publish", Topic: topic,
		Payload: payload, MessageID: id, QoS: min(max(qos, 0), 1)})
	c.start()
	// The article's broker confirms nothing: its client has nothing to
	// wait for, and sends a publish once.
	if qos == 1 && c.lab.kind == Popsub {
		c.unconfirmed[id] = frame
		c.order = append(c.order, id)
	}
	if c.conn == nil {
		if qos == 0 {
			c.lab.record(Event{Kind: "error", From: c.name, To: c.name,
				Label: "not connected: QoS 0 " + id + " is lost",
				Topic: topic, ID: id})
		}
		return // a QoS 1 publish goes with the next connection
	}
	c.sendPublish(frame, id, qos)
}

// sendPublish sends a publish frame; c.mu is held.
func (c *client) sendPublish(frame []byte, id string, qos int) {
	if c.conn == nil {
		return
	}
	var f wire.Frame
	json.Unmarshal(frame, &f)
	c.lab.history.Sent(chaos.Attempt{Publisher: c.name, Topic: f.Topic,
		ID: id, Value: id, Unread: qos == 0})
	c.conn.out = append(c.conn.out, frame)
	select {
	case c.conn.wake <- struct{}{}:
	default:
	}
	c.lab.record(Event{Kind: "publish", From: c.name, To: "broker",
		Label: fmt.Sprintf("publish %s QoS %d", id, qos), Topic: f.Topic,
		ID: id, Value: id})
}

// readLoop reads the link until it ends, unless the client stopped
// reading, and then connects again.
func (c *client) readLoop(l *link) {
	for {
		c.waitToRead()
		data, err := l.receive()
		c.waitToRead() // a client that stopped meanwhile holds the frame
		if err != nil {
			c.disconnected(l)
			return
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			var f wire.Received
			if json.Unmarshal(line, &f) == nil {
				c.handle(f)
			}
		}
	}
}

// waitToRead returns once the client reads.
func (c *client) waitToRead() {
	c.mu.Lock()
	reading := c.reading
	c.mu.Unlock()
	<-reading
}

// handle takes one frame from the broker.
func (c *client) handle(f wire.Received) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, s := c.lab.history, c.current[f.Topic]
	switch f.Type {
	case "message":
		if s == nil {
			return
		}
		h.Delivered(s, chaos.Delivery{Seq: f.Seq, ID: f.MessageID,
			Value: value(f.Payload), Attempt: f.Attempt, QoS: f.QoS})
		c.newest[f.Topic] = max(c.newest[f.Topic], f.Seq)
		v := value(f.Payload)
		label := fmt.Sprintf("seq %d: %s", f.Seq, v)
		switch {
		case f.Attempt > 1:
			label = fmt.Sprintf("retry %d of seq %d", f.Attempt-1, f.Seq)
		case c.lab.kind == Article: // no seq, no attempt: its id says it
			label = fmt.Sprintf("%s as %s", v, f.MessageID)
		}
		c.lab.record(Event{Kind: "message", From: "broker", To: c.name,
			Label: label, Topic: f.Topic, Seq: f.Seq, ID: f.MessageID,
			Value: v})
		if f.QoS != 1 {
			return
		}
		c.held = slices.DeleteFunc(c.held, func(a heldAck) bool {
			return a.ID == f.MessageID && a.Topic == f.Topic
		})
		if c.holding {
			at := c.lab.now()
			c.held = append(c.held, heldAck{f.Topic, f.Seq, f.MessageID,
				f.Attempt, at + brokerOptions.AckTimeout.Milliseconds()})
			return
		}
		c.ack(f.Topic, f.Seq, f.MessageID)
	case "subscribed":
		// A reply is the current subscription's until it has one;
		// then the next replacement's.
		next := c.replacing[f.Topic]
		if len(next) > 0 && (s == nil || s.Replied) {
			h.Closed(s)
			s, c.current[f.Topic], c.replacing[f.Topic] = next[0], next[0],
				next[1:]
		}
		if s != nil {
			h.Replied(s, f.Seq, f.Recovered == nil || *f.Recovered)
		}
		label := fmt.Sprintf("subscribed, head %d", f.Seq)
		if f.Recovered != nil && !*f.Recovered {
			label += ", some messages are gone"
		}
		c.lab.record(Event{Kind: "subscribed", From: "broker", To: c.name,
			Label: label, Topic: f.Topic})
	case "skipped":
		// A wildcard's frame names the wildcard as its filter.
		if f.Filter != "" {
			s = c.current[f.Filter]
		}
		if s != nil {
			h.Skipped(s, f.Seq)
		}
		c.lab.record(Event{Kind: "skipped", From: "broker", To: c.name,
			Label: fmt.Sprintf("skipped up to seq %d", f.Seq),
			Topic: f.Topic})
	case "published":
		h.Confirmed(chaos.Confirm{Publisher: c.name, Topic: f.Topic,
			ID: f.MessageID, Seq: f.Seq, Duplicate: f.Duplicate})
		delete(c.unconfirmed, f.MessageID)
		c.order = slices.DeleteFunc(c.order, func(id string) bool {
			return id == f.MessageID
		})
		c.lab.record(Event{Kind: "published", From: "broker", To: c.name,
			Label: fmt.Sprintf("confirmed %s: seq %d", f.MessageID, f.Seq),
			Topic: f.Topic, Seq: f.Seq, ID: f.MessageID})
	case "error":
		if f.MessageID != "" {
			h.Refused(chaos.Refusal{Publisher: c.name, Topic: f.Topic,
				ID: f.MessageID, Code: f.Code})
		}
		c.lab.record(Event{Kind: "error", From: "broker", To: c.name,
			Label: f.Code + ": " + f.Message, Topic: f.Topic,
			ID: f.MessageID})
	}
}

// ack acks one delivery; c.mu is held.
func (c *client) ack(topic string, seq uint64, id string) {
	if c.conn == nil {
		return
	}
	c.lab.history.Acked(c.name, topic, id)
	c.queue(wire.Frame{Type: "ack", Topic: topic, MessageID: id})
	label := fmt.Sprintf("ack seq %d", seq)
	if c.lab.kind == Article {
		label = "ack " + id
	}
	c.lab.record(Event{Kind: "ack", From: c.name, To: "broker",
		Label: label, Topic: topic, Seq: seq, ID: id})
}

// ackHeld acks every delivery whose ack was held.
func (c *client) ackHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.held {
		c.ack(a.Topic, a.Seq, a.ID)
	}
	c.held = nil
}

// hold holds the client's acks, or lets them go again.
func (c *client) hold(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holding = on
}

// forget drops a held delivery the broker dead-lettered.
func (c *client) forget(topic, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = slices.DeleteFunc(c.held, func(a heldAck) bool {
		return a.Topic == topic && a.ID == id
	})
}

// cut cuts the client's link, as a network failing would.
func (c *client) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return
	}
	c.lab.history.Fault("cut", c.name)()
	c.lab.record(Event{Kind: "cut", From: c.name, To: c.name,
		Label: "link cut"})
	c.conn.link.close(-1, "the link was cut")
}

// loseNext makes the client's link lose the next delivery it carries,
// as a faulty proxy would.
func (c *client) loseNext() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return
	}
	c.conn.link.mu.Lock()
	c.conn.link.dropNext = true
	c.conn.link.mu.Unlock()
	c.lab.record(Event{Kind: "drop", From: c.name, To: c.name,
		Label: "a proxy will lose the next delivery"})
}

// drop ends the client's link, as its broker dying does.
func (c *client) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.link.close(-1, "the broker is gone")
	}
}

// setReading makes the client stop reading its connection, or read
// again.
func (c *client) setReading(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped := c.stopped != nil
	switch {
	case on && stopped:
		close(c.reading)
		c.stopped()
		c.stopped = nil
		c.lab.record(Event{Kind: "read", From: c.name, To: c.name,
			Label: "reads again"})
	case !on && !stopped:
		c.reading = make(chan struct{})
		c.stopped = c.lab.history.Fault("stop", c.name)
		c.lab.record(Event{Kind: "stop", From: c.name, To: c.name,
			Label: "stops reading"})
	}
}

// endStop lets a client that stopped reading read again, without a
// word: the run is over.
func (c *client) endStop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped != nil {
		close(c.reading)
		c.stopped = nil
	}
}

// disconnected takes the end of link l: the connection's subscriptions
// end, its held acks go with it, and the client connects again later.
func (c *client) disconnected(l *link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.conn.link != l {
		return
	}
	c.conn = nil
	for _, s := range c.current {
		c.lab.history.Closed(s)
	}
	for _, list := range c.replacing {
		for _, s := range list {
			c.lab.history.Closed(s)
		}
	}
	clear(c.current)
	clear(c.replacing)
	c.held = nil
	time.AfterFunc(reconnectDelay, c.connect)
}
